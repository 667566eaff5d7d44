"""A generation request: one frozen value, validated once, resolved once into the loop's settings.

Every entry point builds a :class:`Request` — :func:`ersd.generate` and :func:`ersd.generate_stream`
from their keywords, :func:`ersd.generate_batch` one per prompt, :meth:`ersd.BatchEngine.add`
takes one, ``ersd serve`` builds them from the HTTP body — and they differ only in how.

* Construction checks everything that does not depend on the models (:mod:`ersd.validation`):
  the prompt's ids, ``max_new_tokens``, the seed's range, the method, the sampling settings, the
  EOS ids and the tree, which is parsed once (:mod:`ersd.tree_spec`; ``optimal:K@FILE`` at the
  request's temperature) and checked against the method.
* :meth:`Request.resolve` checks it against the target and drafter (vocabulary, context window)
  and makes the loop's :class:`Settings` once: the verification rule, the tree (or the dynamic
  drafter growing it, or the chooser of ``tree="auto"``), the result's label.
* :meth:`Request.root_key` is the one place a sequence's race key is made from the request.

Every error names the offending field in :attr:`ersd.ErsdError.param` (``seed``, ``tree``,
``temperature``, ...), so a server maps it without reading the message.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ersd.drafting import ConfidenceDrafter, Drafter, DynamicDrafter
from ersd.drafting.grown import dynamic_drafter
from ersd.drafting.model import draft_stop_of
from ersd.errors import ErsdError, GenerationInputError, VocabularyMismatchError, WatermarkError
from ersd.methods import Method, get_method, rule_for
from ersd.methods.catalog import race_winners_only
from ersd.models.base import LanguageModel
from ersd.probs import SamplingParams
from ersd.race import DEFAULT_RACE_SCHEME, RaceNoise, check_race_scheme, extend_key_many, root_key
from ersd.tree import TreeShape
from ersd.tree_spec import ParsedTree, TreeArg, parse_tree_spec
from ersd.validation import (
    as_integer,
    check_eos_ids,
    check_max_new_tokens,
    check_prompt_fits,
    check_seed,
    check_token_ids,
)
from ersd.watermark.keyed import WatermarkKey, race_noise
from ersd.watermark.settings import Watermark, check_watermark


@dataclass(frozen=True)
class Settings:
    """What the loop runs one sequence with: the rule, the tree, sampling, noise, the drafter."""

    method: Method  # the verification method asked for
    rule: Method  # the rule that verifies: ``method``, or GREEDY at temperature 0
    shape: TreeShape | None  # None: nothing is drafted (or tree="auto": the chooser's pick)
    params: SamplingParams
    noise: RaceNoise
    eos: frozenset[int]
    #: feed at least this many tokens per target forward (padding nodes are scored and dropped)
    min_forward_tokens: int = 1
    #: ``tree="auto"``: the :class:`ersd.auto.TreeChooser` picking each step's shape (then
    #: ``shape`` is None); one per sequence, which learns from the sequence's own steps — in a
    #: batch, one per group of rows with the same settings, deciding once per step for all
    chooser: Any = None
    #: the drafter of this sequence (a dynamic tree's own drafter); None: nothing is drafted
    drafter: Drafter | None = None
    #: the result's tree label (None: nothing drafted)
    label: str | None = None


@contextmanager
def blame(param: str) -> Iterator[None]:
    """Name ``param`` as the offending field of an :class:`ErsdError` raised inside (unless the
    error already names one)."""
    try:
        yield
    except ErsdError as exc:
        if exc.param is None:
            exc.param = param
        raise


def sampling_params(
    params: SamplingParams | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
) -> SamplingParams:
    """``params`` if given (then the keyword settings must be left at their defaults)."""
    if params is None:
        return SamplingParams(temperature, top_k, top_p, min_p)
    if not isinstance(params, SamplingParams):
        raise GenerationInputError(
            f"sampling must be an ersd.SamplingParams, got {type(params).__name__}",
            param="sampling",
        )
    if (temperature, top_k, top_p, min_p) != (1.0, None, None, None):
        raise GenerationInputError(
            "give the sampling settings either as sampling=SamplingParams(...) or as keyword "
            "arguments (temperature=, top_k=, top_p=, min_p=), not both",
            param="sampling",
        )
    return params


@dataclass(frozen=True)
class Request:
    """One sequence to generate, checked on construction (see the module docstring).

    ``tree``: a tree spec (:mod:`ersd.tree_spec`; stored parsed), or ``None``: nothing is
    drafted.  ``eos_token_id``: one id or several (stored as a frozenset).  Fields hold their
    normalised values after construction (the prompt a tuple of ints, the method a
    :class:`~ersd.methods.Method`), so ``dataclasses.replace`` re-checks cheaply.
    """

    prompt: Sequence[int]
    max_new_tokens: int
    seed: int = 0
    method: str | Method = "ersd"
    tree: TreeArg | ParsedTree | None = "chain:4"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_id: int | Sequence[int] | frozenset[int] | None = None
    min_forward_tokens: int = 1
    #: the secret-keyed race (:mod:`ersd.watermark`): read by root_key() and resolve() alone
    watermark: Watermark | None = None
    #: the prompt's last ``resumed`` tokens were generated by this sequence before (a server
    #: rebuilding a row after a failure): its races continue exactly, the watermark's windows too
    resumed: int = 0
    #: how races are drawn (:data:`ersd.race.RACE_SCHEMES`): "v1", NumPy's Philox (the default,
    #: every earlier text), or "v2", the faster blocked race; a text reproduces only under its own
    race_scheme: str = DEFAULT_RACE_SCHEME

    def __post_init__(self) -> None:
        with blame("prompt"):
            self._set("prompt", tuple(check_token_ids(self.prompt, None)))
        resumed = as_integer(self.resumed)
        if resumed is None or not 0 <= resumed < max(len(self.prompt), 1):
            raise GenerationInputError(
                f"resumed must be an integer in [0, len(prompt)) (the generated tokens at the "
                f"end of the prompt), got {self.resumed!r} for a {len(self.prompt)}-token prompt",
                param="resumed",
            )
        self._set("resumed", resumed)
        self._set("max_new_tokens", check_max_new_tokens(self.max_new_tokens))
        self._set("seed", check_seed(self.seed))
        with blame("method"):
            meth = get_method(self.method)
        self._set("method", meth)
        if not isinstance(self.sampling, SamplingParams):
            raise GenerationInputError(
                f"sampling must be an ersd.SamplingParams, got {type(self.sampling).__name__}",
                param="sampling",
            )
        self._set("eos_token_id", check_eos_ids(self.eos_token_id, None))
        mft = as_integer(self.min_forward_tokens)
        if mft is None or mft < 1:
            raise GenerationInputError(
                f"min_forward_tokens must be an integer >= 1, got {self.min_forward_tokens!r}",
                param="min_forward_tokens",
            )
        self._set("min_forward_tokens", mft)
        if self.tree is not None:
            with blame("tree"):
                parsed = parse_tree_spec(self.tree, temperature=self.sampling.temperature)
                if parsed.shape is not None:
                    meth.check_shape(parsed.shape)
            self._set("tree", parsed)
        try:
            check_race_scheme(self.race_scheme)
        except ValueError as exc:
            raise GenerationInputError(str(exc), param="race_scheme") from None
        with blame("watermark"):
            wm = check_watermark(self.watermark)
            if wm is not None and self.race_scheme != DEFAULT_RACE_SCHEME:
                raise GenerationInputError(
                    f"race_scheme={self.race_scheme!r} does not apply to a watermarked race (its "
                    f"noise is the watermark's keyed PRF); leave race_scheme at "
                    f"{DEFAULT_RACE_SCHEME!r} with a watermark",
                    param="race_scheme",
                )
            if wm is not None and self.sampling.greedy:
                raise WatermarkError(
                    "a watermark needs sampling: at temperature 0 the text is the target's "
                    "argmax and carries no mark; use a temperature > 0 (e.g. 0.7 or 1)"
                )

    @classmethod
    def of(
        cls,
        prompt: Sequence[int],
        *,
        sampling: SamplingParams | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        **fields: Any,
    ) -> Request:
        """A request from :func:`ersd.generate`'s keywords: the sampling settings as keywords
        or as one ``sampling=`` :class:`~ersd.SamplingParams`, the other fields as named."""
        return cls(
            prompt, sampling=sampling_params(sampling, temperature, top_k, top_p, min_p), **fields
        )

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    # -- typed views of the normalised fields ----------------------------------------------------

    @property
    def parsed_tree(self) -> ParsedTree | None:
        assert self.tree is None or isinstance(self.tree, ParsedTree)
        return self.tree

    @property
    def verification(self) -> Method:
        assert isinstance(self.method, Method)
        return self.method

    @property
    def eos(self) -> frozenset[int]:
        assert isinstance(self.eos_token_id, frozenset)
        return self.eos_token_id

    # -- against the models ----------------------------------------------------------------------

    def root_key(self) -> int:
        """The race key of the prompt: every race of the sequence extends it by the tokens
        emitted, so the tokens are a function of the request alone (batch invariance).  The one
        place a request's fields feed its sequence's key scheme: with a watermark, a
        :class:`~ersd.watermark.keyed.WatermarkKey` (the same hash, salted, plus the window)."""
        cut = len(self.prompt) - self.resumed
        key = root_key(self.seed, self.prompt[:cut])
        if self.watermark is not None:
            key = WatermarkKey.root(key, self.watermark, self.seed, self.prompt[:cut])
        return extend_key_many(key, self.prompt[cut:])

    def noise(self, vocab_size: int, cache_size: int = 64) -> RaceNoise:
        """A new race noise for this request: the watermark's keyed noise, else the request's
        race scheme."""
        if self.watermark is not None:
            return race_noise(vocab_size, self.watermark, cache_size)
        return RaceNoise(vocab_size, cache_size, scheme=self.race_scheme)

    def check_models(self, target: LanguageModel, drafter: Drafter | None) -> None:
        """The checks that need the models: vocabularies, token ranges, the context window."""
        check_target(target)
        if drafter is not None and drafter.vocab_size not in (None, target.vocab_size):
            raise VocabularyMismatchError(
                f"draft vocabulary has {drafter.vocab_size} entries but the target's has "
                f"{target.vocab_size}; draft and target must share one tokenizer and vocabulary "
                "(pick a draft from the target's model family)"
            )
        check_token_ids(self.prompt, target.vocab_size)
        check_eos_ids(self.eos, target.vocab_size)
        check_prompt_fits(len(self.prompt), target.max_length)

    def resolve(
        self,
        target: LanguageModel,
        drafter: Drafter | None,
        *,
        noise: RaceNoise | None = None,
        curves: Any = None,
    ) -> Settings:
        """Check the request against the models and make the loop's settings, once.

        ``drafter``: the generation's drafter (``None``, or a request without a tree: nothing is
        drafted); a ``dynamic:K`` tree gets its own drafter built from it.  ``noise``: the race
        noise to share (a batch engine's cache; with a watermark, that watermark's
        :class:`~ersd.watermark.keyed.WatermarkNoise`), else a new one; ``curves``: the
        :class:`ersd.auto.CurveCache` a ``tree="auto"`` chooser measures into (a batch
        engine's), else its own."""
        if noise is not None and self.watermark is None and noise.scheme != self.race_scheme:
            raise GenerationInputError(
                f"the shared race noise draws race scheme {noise.scheme!r} but the request asks "
                f"for {self.race_scheme!r}; pass a noise of the request's scheme "
                "(Request.noise(vocab_size))",
                param="race_scheme",
            )
        tree = self.parsed_tree if drafter is not None else None
        drafter = drafter if tree is not None else None
        self.check_models(target, drafter)
        meth = self.verification
        rule = rule_for(meth, self.sampling)
        info = meth.info
        watermark_aware = race_winners_only(info) or (
            info is not None and info.watermark is not None
        )
        if self.watermark is not None and drafter is not None and not watermark_aware:
            raise WatermarkError(
                f"method {meth.name!r} emits draft samples and corrections that are not the "
                "target's keyed race winner, so its text would be only partly marked; watermark "
                "with method='ersd' (every token is the keyed race's winner) or without a draft "
                "(the engines' partial schemes are the baselines 'sd-wm-target', "
                "'specinfer-wm-target' and 'sd-dual-key')",
                param="watermark",
            )
        shape = label = chooser = None
        if tree is not None:
            label = tree.label
            stop = draft_stop_of(drafter)
            if stop is not None and (tree.dynamic is not None or tree.auto is not None):
                raise GenerationInputError(
                    f"tree {tree.label!r} chooses its own depth and takes no draft stop; use a "
                    f"fixed tree such as 'chain:6' with ModelDrafter(model, stop={stop:g}), or "
                    "a drafter without stop",
                    param="tree",
                )
            if stop is not None:
                label = f"{label}+stop={stop:g}"  # the tree drafted is cut by the stop
            if tree.dynamic is not None:
                with blame("tree"):
                    drafter = dynamic_drafter(tree.dynamic, drafter, meth)
                shape = TreeShape.chain(drafter.depth_cap)
            elif tree.auto is not None:
                from ersd.auto import TreeChooser

                chooser = TreeChooser(
                    tree.auto,
                    target,
                    drafter,
                    meth,
                    rule,
                    self.sampling.temperature,
                    curves,
                    horizon=self.max_new_tokens,
                )
            else:
                shape = tree.shape
            if tree.dynamic is None and isinstance(drafter, DynamicDrafter | ConfidenceDrafter):
                label = drafter.spec  # a dynamic drafter passed as draft= grows its own trees
        return Settings(
            method=meth,
            rule=rule,
            shape=shape,
            params=self.sampling,
            noise=noise if noise is not None else self.noise(target.vocab_size),
            eos=self.eos,
            min_forward_tokens=self.min_forward_tokens,
            chooser=chooser,
            drafter=drafter,
            label=label,
        )


def check_target(model: Any) -> None:
    """``model`` must be a :class:`~ersd.models.base.LanguageModel`."""
    if not isinstance(model, LanguageModel):
        raise GenerationInputError(
            "target must be a model with .vocab_size, .max_length and .start(prompt) (an "
            "ersd.LanguageModel, e.g. ersd.FunctionModel or ersd.load_model(...)), got "
            f"{type(model).__name__}"
        )
