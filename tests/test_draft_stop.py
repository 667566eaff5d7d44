"""The model drafter's confidence stop (issue 51): ``ModelDrafter(model, stop=...)``.

A drafted token whose draft probability is below the stop keeps no children (transformers'
``ConfidenceCriteria``: the token is kept, then drafting stops).  Checked here:

* the stop only shapes the drafted tree, so ERSD's tokens are exactly target-only race
  sampling's (bundled SmolLM2-135M, float32, with an 8-layer truncated copy as the draft that
  often disagrees; T = 0 and T = 1, three seeds, stops 0.4 and 0.99, a chain and a tree);
* it makes fewer draft forwards than no stop on that prompt;
* every drafted chain follows the rule, recomputed from plain draft forwards: each node but the
  last has probability >= the stop, the last is below it or at the depth limit; a deliberately
  broken stop that drops the low-confidence token instead of keeping it is rejected by the same
  check;
* at T = 0 it makes exactly the target forwards of transformers' assisted generation with
  ``num_assistant_tokens = 6`` and ``assistant_confidence_threshold = 0.4`` (what it copies);
* through ``model.generate(custom_generate=...)``, ``draft_stop=`` gives the same tokens;
* bad values, ``tree="auto"`` / ``dynamic:K`` with a stop, and a stop on a model-free drafter
  are one-line errors naming the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import ersd
from ersd.drafting import LookupDrafter, ModelDrafter, ModelDraftSession
from ersd.drafting.grow import DrafterConfigError
from ersd.drafting.model import token_probability
from ersd.errors import ErsdError, GenerationInputError
from ersd.integrations.transformers import wrap_module
from ersd.methods import Method
from ersd.probs import SamplingParams
from ersd.race import RaceNoise
from ersd.tree import TreeShape

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = "def fibonacci(n):\n    "
N = 16
K = 6
TOL = 1e-3  # probabilities this close to the stop are not judged (cached vs plain forwards)


# ---------------------------------------------------------------------------------------------
# without a model


@pytest.mark.parametrize("bad", [True, -0.1, 1.5, float("nan"), "0.4", [0.4]])
def test_bad_stop_is_one_line_naming_the_range(bad: Any) -> None:
    with pytest.raises(DrafterConfigError) as info:
        ModelDrafter(object(), stop=bad)  # type: ignore[arg-type]
    msg = str(info.value)
    assert "[0, 1]" in msg and "\n" not in msg and info.value.param == "draft_stop"


def test_zero_and_none_are_off() -> None:
    assert ModelDrafter(object(), stop=0).stop is None  # type: ignore[arg-type]
    assert ModelDrafter(object(), stop=None).stop is None  # type: ignore[arg-type]
    assert ModelDrafter(object(), stop=1).stop == 1.0  # type: ignore[arg-type]


def test_token_probability_is_the_sampling_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.randn(50)
    soft = torch.softmax(logits.double(), -1)
    assert token_probability(logits, 3, SamplingParams(0.0)) == pytest.approx(float(soft[3]))
    hot = torch.softmax(logits.double() / 0.5, -1)
    assert token_probability(logits, 3, SamplingParams(0.5)) == pytest.approx(float(hot[3]))
    top = int(torch.argmax(logits))
    kept = torch.softmax(logits.double().topk(2).values, -1)[0]
    assert token_probability(logits, top, SamplingParams(1.0, top_k=2)) == pytest.approx(
        float(kept)
    )


# ---------------------------------------------------------------------------------------------
# the bundled SmolLM2-135M, float32, and an 8-layer truncated copy as the draft


@pytest.fixture(scope="module")
def smol() -> dict[str, Any]:
    import transformers
    from transformers import AutoModelForCausalLM

    loaded = ersd.load_model("smollm2-135m", dtype="float32")
    model = loaded.hf_module
    folder = model.config._name_or_path
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the truncated draft's unused-weights report
    try:
        draft = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, num_hidden_layers=8
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
    return {
        "model": model,
        "draft": draft,
        "target": wrap_module(model),
        "dmodel": wrap_module(draft),
        "prompt": loaded.tokenizer.encode(PROMPT),
        "eos": model.generation_config.eos_token_id,
    }


_alone: dict[tuple[float, int], list[int]] = {}


def _target_only(smol: dict[str, Any], temperature: float, seed: int) -> list[int]:
    if (temperature, seed) not in _alone:
        res = ersd.generate(
            smol["target"],
            None,
            smol["prompt"],
            max_new_tokens=N,
            seed=seed,
            temperature=temperature,
            eos_token_id=smol["eos"],
        )
        _alone[temperature, seed] = res.tokens
    return _alone[temperature, seed]


def _ersd(
    smol: dict[str, Any], draft: Any, temperature: float, seed: int, tree: str = f"chain:{K}"
) -> Any:
    return ersd.generate(
        smol["target"],
        draft,
        smol["prompt"],
        max_new_tokens=N,
        seed=seed,
        temperature=temperature,
        eos_token_id=smol["eos"],
        tree=tree,
    )


@pytest.mark.realmodel
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stop_keeps_target_only_tokens_and_saves_draft_forwards(
    smol: dict[str, Any], temperature: float
) -> None:
    forwards: dict[float | None, int] = {None: 0, 0.4: 0, 0.99: 0}
    labels: dict[float | None, str] = {}
    for seed in (0, 1, 2):
        alone = _target_only(smol, temperature, seed)
        for stop in forwards:
            res = _ersd(smol, ModelDrafter(smol["dmodel"], stop=stop), temperature, seed)
            assert res.tokens == alone, (stop, seed)
            forwards[stop] += res.draft_forwards
            labels[stop] = res.tree
    assert labels[0.4] == f"{labels[None]}+stop=0.4" and labels[0.99].endswith("+stop=0.99")
    # the truncated draft often disagrees: the stop must cut chains, and a higher stop more
    assert forwards[0.99] < forwards[0.4] < forwards[None], forwards


@pytest.mark.realmodel
def test_stop_per_branch_of_a_tree_keeps_the_tokens(smol: dict[str, Any]) -> None:
    for seed in (0, 1):
        full = _ersd(smol, ModelDrafter(smol["dmodel"]), 1.0, seed, tree="multi:2x3")
        cut = _ersd(smol, ModelDrafter(smol["dmodel"], stop=0.4), 1.0, seed, tree="multi:2x3")
        assert cut.tokens == full.tokens == _target_only(smol, 1.0, seed)
        assert cut.num_draft_tokens < full.num_draft_tokens


# --- the rule, recomputed from plain draft forwards ---------------------------------------


class _Recording(ModelDraftSession):
    """Records each proposal's committed prefix, chain and settings."""

    log: list[tuple[list[int], list[int], int, SamplingParams]]

    def propose(
        self,
        shape: TreeShape,
        key: int,
        rule: Method,
        params: SamplingParams,
        noise: RaceNoise,
        guess: Sequence[int] = (),
    ) -> Any:
        prefix = list(self.session.committed)
        prop = super().propose(shape, key, rule, params, noise, guess)
        self._edit(prop.tree, shape)
        tree = prop.tree
        assert tree.parents == list(range(-1, len(tree.tokens) - 1))  # a chain
        self.log.append((prefix, list(tree.tokens), shape.depth, params))
        return prop

    def _edit(self, tree: Any, shape: TreeShape) -> None:
        pass


class _DropsTheUnsureToken(_Recording):
    """Broken on purpose: where the stop ended a chain it drops the unsure token instead of
    keeping it (a chain of one token is left alone)."""

    def _edit(self, tree: Any, shape: TreeShape) -> None:
        if 1 < len(tree.tokens) < shape.depth:
            node = len(tree.tokens) - 1
            tree.children[tree.parents[node] + 1].remove(node)
            for field in (tree.tokens, tree.parents, tree.keys, tree.draft_probs, tree.children):
                field.pop()


class _RecordingDrafter(ModelDrafter):
    session_class: type[_Recording] = _Recording

    def __init__(self, model: Any, stop: float, log: list[Any]) -> None:
        super().__init__(model, stop=stop)
        self.log = log

    def start_drafting(self, prompt: Sequence[int]) -> _Recording:
        session = self.session_class(self.model.start(list(prompt)))
        session.stop, session.log = self.stop, self.log
        return session


def _violations(draft: Any, log: list[Any], stop: float) -> list[str]:
    """Chains that break the stop rule, by plain forwards of the draft module."""
    bad = []
    with torch.no_grad():
        for prefix, chain, depth, params in log:
            logits = draft(torch.tensor([prefix + chain])).logits[0]
            probs = [
                token_probability(logits[len(prefix) - 1 + j], tok, params)
                for j, tok in enumerate(chain)
            ]
            for j, p in enumerate(probs[:-1]):
                if p < stop - TOL:
                    bad.append(f"node {j} of {len(chain)} has p={p:.3f} < {stop} but children")
            if len(chain) < depth and probs and probs[-1] >= stop + TOL:
                bad.append(f"chain ends at {len(chain)} < {depth} on p={probs[-1]:.3f}")
    return bad


@pytest.mark.realmodel
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_chain_follows_the_stop_rule_and_a_broken_stop_is_caught(
    smol: dict[str, Any], temperature: float
) -> None:
    stop = 0.4
    log: list[Any] = []
    drafter = _RecordingDrafter(smol["dmodel"], stop, log)
    res = _ersd(smol, drafter, temperature, 0)
    assert res.tokens == _target_only(smol, temperature, 0)
    assert any(len(chain) < depth for _, chain, depth, _ in log)  # the stop did cut chains
    assert _violations(smol["draft"], log, stop) == []

    broken_log: list[Any] = []
    broken = _RecordingDrafter(smol["dmodel"], stop, broken_log)
    broken.session_class = _DropsTheUnsureToken
    _ersd(smol, broken, temperature, 0)
    assert _violations(smol["draft"], broken_log, stop) != []


# --- refusals and custom_generate -----------------------------------------------------------


@pytest.mark.realmodel
@pytest.mark.parametrize("tree", ["auto", "dynamic:4"])
def test_trees_that_choose_their_depth_refuse_a_stop(smol: dict[str, Any], tree: str) -> None:
    with pytest.raises(GenerationInputError) as info:
        _ersd(smol, ModelDrafter(smol["dmodel"], stop=0.4), 1.0, 0, tree=tree)
    msg = str(info.value)
    assert "chain:6" in msg and "\n" not in msg and info.value.param == "tree"


@pytest.mark.realmodel
@pytest.mark.parametrize("do_sample", [False, True])
def test_custom_generate_draft_stop_gives_the_same_tokens(
    smol: dict[str, Any], do_sample: bool
) -> None:
    model = smol["model"]
    ids = torch.tensor([smol["prompt"]])
    common: dict[str, Any] = {"max_new_tokens": N, "do_sample": do_sample, "seed": 1}
    if do_sample:
        common["top_k"] = 0
    outs = [
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            custom_generate=ersd.transformers.generate,
            draft_model=smol["draft"],
            tree=f"chain:{K}",
            **common,
            **extra,
        )
        for extra in ({}, {"draft_stop": 0.4})
    ]
    new = outs[1][0, ids.shape[1] :].tolist()
    assert torch.equal(outs[0], outs[1])
    assert new == _target_only(smol, 1.0 if do_sample else 0.0, 1)[: len(new)]


@pytest.mark.realmodel
def test_custom_generate_refuses_a_bad_draft_stop(smol: dict[str, Any]) -> None:
    ids = torch.tensor([smol["prompt"]])
    for draft, value, needle in [
        (smol["draft"], 2.0, "[0, 1]"),
        (LookupDrafter(), 0.4, "draft model"),
    ]:
        with pytest.raises(ErsdError) as info:
            smol["model"].generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                custom_generate=ersd.transformers.generate,
                draft_model=draft,
                draft_stop=value,
                max_new_tokens=4,
                do_sample=False,
            )
        assert needle in str(info.value) and "\n" not in str(info.value)


# --- against transformers' own confidence stop ----------------------------------------------


def _count_forwards(module: Any) -> tuple[list[int], Any]:
    """(calls, tokens fed) of ``module``'s forwards from now on, and the hook's handle."""
    seen = [0, 0]

    def hook(mod: Any, args: Any, kwargs: Any) -> None:
        ids = kwargs.get("input_ids")
        seen[0] += 1
        seen[1] += int((ids if ids is not None else args[0]).shape[-1])

    return seen, module.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.realmodel
def test_at_t0_the_stop_makes_assisted_generations_target_forwards(smol: dict[str, Any]) -> None:
    """At T = 0 ERSD's ``chain:6`` with stop 0.4 verifies the chains transformers' assisted
    generation verifies (6 tokens, constant schedule, its ``assistant_confidence_threshold``
    0.4): the same target forwards with the same numbers of tokens fed, and the same tokens.
    Without the stop more tokens are fed."""
    model, draft = smol["model"], smol["draft"]
    ids = torch.tensor([smol["prompt"]])
    gc = draft.generation_config
    saved = (
        gc.num_assistant_tokens,
        gc.num_assistant_tokens_schedule,
        gc.assistant_confidence_threshold,
    )
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = K, "constant"
    gc.assistant_confidence_threshold = 0.4
    seen, handle = _count_forwards(model)
    try:
        # first, so that the adapter's one-off forwards (its mask probe) are not counted below
        _ersd(smol, ModelDrafter(smol["dmodel"]), 0.0, 0)
        seen[:] = [0, 0]
        _ersd(smol, ModelDrafter(smol["dmodel"]), 0.0, 0)
        unstopped = list(seen)
        seen[:] = [0, 0]
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                assistant_model=draft,
                do_sample=False,
                max_new_tokens=N,
            )
        theirs = list(seen)
        seen[:] = [0, 0]
        res = _ersd(smol, ModelDrafter(smol["dmodel"], stop=0.4), 0.0, 0)
        ours = list(seen)
    finally:
        handle.remove()
        (
            gc.num_assistant_tokens,
            gc.num_assistant_tokens_schedule,
            gc.assistant_confidence_threshold,
        ) = saved
    assert out[0, ids.shape[1] :].tolist() == res.tokens
    assert ours == theirs, (ours, theirs)
    assert unstopped[1] > ours[1]


@pytest.mark.realmodel
def test_a_batch_with_the_stop_equals_its_solo_calls(smol: dict[str, Any]) -> None:
    """The batched engine grows each row's tree through the same generator, stop included."""
    prompts = [smol["prompt"], smol["prompt"][:-2]]
    drafted = {}
    for stop in (None, 0.4):
        batch = ersd.generate_batch(
            smol["target"],
            ModelDrafter(smol["dmodel"], stop=stop),
            prompts,
            max_new_tokens=N,
            seeds=[0, 1],
            tree=f"chain:{K}",
            temperature=1.0,
            eos_token_id=smol["eos"],
        )
        drafted[stop] = sum(res.num_draft_tokens for res in batch)
        for prompt, seed, res in zip(prompts, [0, 1], batch, strict=True):
            alone = ersd.generate(
                smol["target"], None, prompt, max_new_tokens=N, seed=seed, eos_token_id=smol["eos"]
            )
            assert res.tokens == alone.tokens
    assert res.tree is not None and res.tree.endswith("+stop=0.4")
    assert drafted[0.4] < drafted[None], drafted  # the stop cut chains in the batch too


@pytest.mark.realmodel
def test_a_hybrid_drafters_model_part_takes_the_stop(smol: dict[str, Any]) -> None:
    from ersd.drafting import HybridDrafter

    hybrid = HybridDrafter(LookupDrafter(), ModelDrafter(smol["dmodel"], stop=0.4))
    res = _ersd(smol, hybrid, 1.0, 0)
    assert res.tokens == _target_only(smol, 1.0, 0)
    assert res.tree is not None and res.tree.endswith("+stop=0.4")
    with pytest.raises(GenerationInputError, match="chooses its own depth"):
        _ersd(smol, hybrid, 1.0, 0, tree="auto")
