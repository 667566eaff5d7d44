"""ersd inside Hugging Face ``transformers``: ``model.generate(custom_generate=...)``.

``transformers`` (>= 5) lets ``generate`` hand the decoding loop to a callable::

    import ersd.transformers
    out = model.generate(**inputs, custom_generate=ersd.transformers.generate,
                         draft_model=draft, tree="chain:6", seed=0,
                         do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=128)

``generate`` prepares the inputs, the generation config, the logits processors and the stopping
criteria as usual, then calls :func:`generate` here, which runs ersd's loop
(:func:`ersd.generate_stream`, or :func:`ersd.generate_batch_stream` for several prompts) on the
very same module (wrapped in :class:`ersd.models.hf.HFModel`: no weights are copied) and returns
what ``generate`` returns.  The tokens are exactly :func:`ersd.generate`'s with the same settings
(and so, at any temperature, exactly target-only race sampling's whatever the draft).

What comes from where:

* sampling: the logits warpers ``generate`` built from the generation config (temperature,
  top-k, top-p, min-p: transformers' own defaults included, e.g. ``top_k=50``); ``do_sample=False``
  is greedy (temperature 0).  Any other logits processor is refused, naming it.
* length and stops: ``max_new_tokens`` / ``max_length``, ``eos_token_id``, ``stop_strings`` and
  any ``stopping_criteria``, checked token by token, so a sequence stops exactly where
  target-only sampling with the same criteria stops.
* ``streamer`` (``TextStreamer``, ``TextIteratorStreamer``) gets each step's accepted tokens.
* ``return_dict_in_generate=True`` gives a ``GenerateDecoderOnlyOutput`` with ``sequences``.
* ersd's own keywords: ``draft_model`` (a ``PreTrainedModel``, or any ersd draft model /
  drafter; ``assistant_model`` is consumed by ``generate`` itself and never reaches a custom
  loop, so it is refused), ``tree``, ``method``, ``seed`` (an int, or one per row), ``watermark``,
  ``race_scheme`` (``"v1"``, the default, or ``"v2"``: docs/race-schemes.md), ``stop_tokenizer``
  (the tokenizer for ``stop_strings``: ``generate`` keeps ``tokenizer=`` to itself when
  ``custom_generate`` is a callable), ``draft_stop`` (the confidence stop of the chain drafter:
  a drafted token whose draft probability is below it ends the chain, as assisted generation's
  ``assistant_confidence_threshold``; not read from the draft's generation config, whose
  transformers default 0.4 would turn it on unasked: pass it explicitly, e.g.
  ``draft_stop=0.4``; the tokens do not change with ERSD).

``generate`` passes a custom callable neither ``streamer`` nor ``assistant_model``; they are read
from the calling ``generate`` frame (the only place they exist), which is why :func:`generate`
must be called by ``model.generate``.

The folder form (``custom_generate=DIR``, ``trust_remote_code=True``) is written by
:func:`export_folder` (``ersd transformers export DIR``); its ``generate.py`` calls
:func:`generate_from_folder`, which re-enters ``generate`` with this callable.

transformers is imported only when these functions run; ``import ersd`` never imports it.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ersd.errors import GenerationInputError, VocabularyMismatchError

#: the logits warpers ersd maps (class name -> SamplingParams field), in transformers' order
_WARPERS = {
    "TemperatureLogitsWarper": "temperature",
    "TopKLogitsWarper": "top_k",
    "TopPLogitsWarper": "top_p",
    "MinPLogitsWarper": "min_p",
}

#: what a logits processor ersd cannot apply comes from, for the refusal
_PROCESSOR_SOURCE = {
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size",
    "NoBadWordsLogitsProcessor": "bad_words_ids",
    "MinLengthLogitsProcessor": "min_length",
    "MinNewTokensLengthLogitsProcessor": "min_new_tokens",
    "TypicalLogitsWarper": "typical_p",
    "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff",
    "TopHLogitsWarper": "top_h",
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "SequenceBiasLogitsProcessor": "sequence_bias",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
    "ExponentialDecayLengthPenalty": "exponential_decay_length_penalty",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty",
    "WatermarkLogitsProcessor": "watermarking_config (use ersd's watermark= instead)",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config (use ersd's watermark= instead)",
}

# the tokenizer found beside a module's folder (None: none found), looked up once per module
_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
# tokenizer -> the tokenizers already found to have its vocabulary (compared once per pair)
_SAME_VOCAB: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()


def _refuse(message: str, param: str | None = None) -> GenerationInputError:
    return GenerationInputError(message, param=param)


def _calling_generate(model: Any) -> Any:
    """The frame of the ``GenerationMixin.generate`` call that invoked us (it holds ``streamer``
    and ``assistant_model``, which ``generate`` does not pass on to a custom loop)."""
    frame = sys._getframe(2)
    depth = 0
    while frame is not None and depth < 4:
        code = frame.f_code
        if (
            code.co_name == "generate"
            and "transformers" in code.co_filename
            and frame.f_locals.get("self") is model
        ):
            return frame
        frame = frame.f_back  # type: ignore[assignment]
        depth += 1
    raise _refuse(
        "ersd.transformers.generate runs inside transformers' generate: call "
        "model.generate(..., custom_generate=ersd.transformers.generate, draft_model=...)"
    )


_WRAPPER_ATTR = "_ersd_hf_model"


def wrap_module(module: Any) -> Any:
    """The :class:`ersd.models.hf.HFModel` of a transformers causal LM (one per module, cached;
    the weights are shared, never copied)."""
    from ersd.models.hf import HFModel

    # kept on the module itself (a weak mapping would keep it alive through the wrapper), and
    # made again if the module moved to another device or dtype since
    wrapped = module.__dict__.get(_WRAPPER_ATTR)
    first = next(module.parameters())
    if wrapped is None or (wrapped.device, wrapped.dtype) != (first.device, first.dtype):
        wrapped = HFModel(module, None)
        module.__dict__[_WRAPPER_ATTR] = wrapped
    return wrapped


def _as_draft(draft_model: Any) -> Any:
    """``draft_model`` as ersd takes a draft: a transformers module is wrapped, an ersd model
    or drafter is used as it is."""
    if draft_model is None:
        return None
    from transformers import PreTrainedModel

    if isinstance(draft_model, PreTrainedModel):
        return wrap_module(draft_model)
    return draft_model


def _with_stop(draft: Any, draft_stop: Any) -> Any:
    """``draft`` with the confidence stop ``draft_stop`` (None: ``draft`` as it is): a draft
    model becomes a :class:`ersd.drafting.ModelDrafter` with that stop."""
    from ersd.drafting.model import ModelDrafter, check_stop
    from ersd.models.base import LanguageModel

    stop = check_stop(draft_stop)
    if stop is None:
        return draft
    if isinstance(draft, ModelDrafter):
        return ModelDrafter(draft.model, stop=stop)
    if isinstance(draft, LanguageModel):
        return ModelDrafter(draft, stop=stop)
    raise _refuse(
        f"draft_stop applies to a draft model, but draft_model is a {type(draft).__name__}; "
        "pass a draft model (a PreTrainedModel or ersd model) or leave draft_stop out",
        param="draft_stop",
    )


def _folder_tokenizer(module: Any) -> Any:
    """The tokenizer saved beside a module loaded from a local folder, else ``None``."""
    if module in _TOKENIZERS:
        return _TOKENIZERS[module]
    tok = None
    path = getattr(getattr(module, "config", None), "_name_or_path", "") or ""
    if (
        path
        and Path(path).is_dir()
        and any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    ):
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            tok = None
    _TOKENIZERS[module] = tok
    return tok


def _hf_tokenizer(obj: Any) -> Any:
    """A transformers tokenizer of an ersd model / HF module, if one can be found."""
    if obj is None:
        return None
    module = getattr(obj, "hf_module", None)
    tok = getattr(obj, "_tokenizer", None)
    if tok is not None:
        return getattr(tok, "hf_tokenizer", None)
    if module is None and hasattr(obj, "config"):
        module = obj
    return _folder_tokenizer(module) if module is not None else None


def _check_draft_tokenizer(model: Any, draft_model: Any, target_tok: Any) -> None:
    """Refuse a draft whose tokenizer maps ids differently from the target's (when both
    tokenizers can be found; the vocabulary width is checked by ersd in any case)."""
    mine = target_tok if target_tok is not None else _folder_tokenizer(model)
    theirs = _hf_tokenizer(draft_model)
    if mine is None or theirs is None or mine is theirs:
        return
    same = _SAME_VOCAB.setdefault(mine, weakref.WeakSet())
    if theirs in same:
        return
    a, b = mine.get_vocab(), theirs.get_vocab()
    if a == b:
        same.add(theirs)
    else:
        raise VocabularyMismatchError(
            f"draft_model uses another tokenizer than the model ({len(a)} vs {len(b)} tokens): "
            "ersd verifies token ids, so pass a draft_model of the same tokenizer (the same model "
            "family)",
            param="draft",
        )


def sampling_from(processors: Sequence[Any], do_sample: bool) -> dict[str, Any]:
    """ersd's sampling keywords from the logits processors ``generate`` prepared; refuses any
    processor ersd cannot apply, naming the setting it came from."""
    out: dict[str, Any] = {"temperature": 1.0 if do_sample else 0.0}
    for proc in processors:
        name = type(proc).__name__
        field = _WARPERS.get(name)
        if field is None:
            source = _PROCESSOR_SOURCE.get(name, "logits_processor=")
            raise _refuse(
                f"ersd cannot apply the logits processor {name} (from {source}); remove it: "
                "ersd samples with temperature, top_k, top_p and min_p only",
                param="logits_processor",
            )
        if int(getattr(proc, "min_tokens_to_keep", 1)) > 1:
            raise _refuse(
                f"ersd cannot apply min_tokens_to_keep={proc.min_tokens_to_keep}; leave it at 1",
                param="min_tokens_to_keep",
            )
        if not do_sample:
            continue
        value = getattr(proc, field)
        out[field] = float(value) if field != "top_k" else int(value)
    return out


def _check_mode(generation_config: Any, frame: Any) -> None:
    from transformers.generation.configuration_utils import GenerationMode

    assistant = frame.f_locals.get("assistant_model")
    if assistant is not None:
        raise _refuse(
            "assistant_model= is transformers' own assisted generation and never reaches ersd; "
            "pass the draft as draft_model= instead",
            param="assistant_model",
        )
    num_beams = int(getattr(generation_config, "num_beams", 1) or 1)
    if num_beams > 1:
        raise _refuse(
            f"ersd samples one sequence per row: beam search (num_beams={num_beams}) is not "
            "supported; set num_beams=1",
            param="num_beams",
        )
    mode = generation_config.get_generation_mode(None)
    if mode not in (GenerationMode.SAMPLE, GenerationMode.GREEDY_SEARCH):
        raise _refuse(
            f"ersd runs sampling or greedy decoding, not {mode.name.lower().replace('_', ' ')}; "
            "drop the settings that select it (e.g. num_beams, penalty_alpha, dola_layers, "
            "prompt_lookup_num_tokens)",
            param="generation_config",
        )
    for flag in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(generation_config, flag, False):
            raise _refuse(
                f"ersd does not return {flag.removeprefix('output_')} ({flag}=True); "
                f"set {flag}=False (return_dict_in_generate gives the sequences)",
                param=flag,
            )


def _prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's prompt without its left padding; refuses right or inner padding."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise _refuse(
            "ersd needs input_ids (a [batch, length] tensor of token ids); inputs_embeds are "
            "not supported",
            param="input_ids",
        )
    rows = input_ids.tolist()
    if attention_mask is None:
        return rows
    mask = attention_mask.to(torch.bool).tolist()
    prompts = []
    for i, (ids, keep) in enumerate(zip(rows, mask, strict=True)):
        start = keep.index(True) if True in keep else len(keep)
        if not all(keep[start:]) or start == len(keep):
            raise _refuse(
                f"row {i} of attention_mask is not left padding (zeros, then ones); pad on the "
                "left (tokenizer.padding_side = 'left')",
                param="attention_mask",
            )
        prompts.append(ids[start:])
    return prompts


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, torch.Tensor):
        return {int(v) for v in value.flatten().tolist()}
    return {int(v) for v in value} if isinstance(value, list | tuple) else {int(value)}


def _is_native(criterion: Any, max_length: int, eos: Any) -> bool:
    """Does ersd's own loop stop exactly like ``criterion`` (the length, the EOS ids)?"""
    name = type(criterion).__name__
    if name == "MaxLengthCriteria":
        return int(criterion.max_length) >= max_length
    if name == "EosTokenCriteria":
        return _ids(criterion.eos_token_id) == _ids(eos)
    return False


def _stop_criteria(
    stopping_criteria: Sequence[Any], stop_strings: Any, tokenizer: Any, max_length: int, eos: Any
) -> list[Any]:
    """The criteria ersd must check token by token (those equal to its own stops are left out:
    the length and the EOS ids are ersd's own)."""
    extra = [c for c in stopping_criteria if not _is_native(c, max_length, eos)]
    if stop_strings:
        from transformers import StopStringCriteria

        if tokenizer is None:
            raise _refuse(
                "stop_strings needs the tokenizer: pass stop_tokenizer=tokenizer (generate keeps "
                "tokenizer= to itself when custom_generate is a callable)",
                param="stop_strings",
            )
        strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
        extra.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=strings))
    return extra


class _Row:
    """One row's output so far, cut by the stopping criteria."""

    def __init__(self, padded: list[int], criteria: list[Any], device: torch.device) -> None:
        self.padded = padded
        self.criteria = criteria
        self.device = device
        self.new: list[int] = []
        self.done = False

    def add(self, tokens: Sequence[int]) -> list[int]:
        """Append ``tokens`` up to the first one a criterion stops at; returns those kept."""
        if self.done:
            return []
        if not self.criteria:
            self.new.extend(tokens)
            return list(tokens)
        kept: list[int] = []
        for t in tokens:
            self.new.append(int(t))
            kept.append(int(t))
            ids = torch.tensor([self.padded + self.new], device=self.device)
            if any(bool(c(ids, None).any()) for c in self.criteria):
                self.done = True
                break
        return kept


def generate(
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    *,
    draft_model: Any = None,
    tree: Any = "chain:4",
    method: str = "ersd",
    seed: int | Sequence[int] = 0,
    watermark: Any = None,
    race_scheme: str = "v1",
    stop_strings: str | Sequence[str] | None = None,
    stop_tokenizer: Any = None,
    draft_stop: float | None = None,
    **model_kwargs: Any,
) -> Any:
    """Speculative sampling with ersd as transformers' decoding loop (see the module docstring).

    Pass it as ``model.generate(..., custom_generate=ersd.transformers.generate)``; ``generate``
    supplies ``input_ids``, the prepared ``logits_processor`` / ``stopping_criteria`` and the
    ``generation_config``.  One row gives exactly ``ersd.generate(target, draft, prompt,
    seed=seed, ...)``'s tokens; several (left-padded) rows go through
    :func:`ersd.generate_batch_stream` with ``seeds=seed`` (an int: row ``i`` gets
    ``ersd.derive_seed(seed, i)``; a list: one seed per row), each row exactly its solo call.
    ``race_scheme`` picks how the races are drawn, as in :func:`ersd.generate` (a text
    reproduces only under its own scheme).  ``draft_stop`` (None: off): the draft model's
    confidence stop (:class:`ersd.drafting.ModelDrafter`'s ``stop``; e.g. 0.4, assisted
    generation's default ``assistant_confidence_threshold``), which shortens the drafted chains
    where the draft is unsure and leaves ERSD's tokens unchanged.
    """
    from ersd.batch import batch_requests, batch_seeds, run_requests
    from ersd.generation import as_drafter, generate_stream

    frame = _calling_generate(model)
    streamer = frame.f_locals.get("streamer")
    gc = generation_config
    _check_mode(gc, frame)
    if getattr(model.config, "is_encoder_decoder", False):
        raise _refuse(
            "ersd runs decoder-only causal LMs; this model is an encoder-decoder",
            param="model",
        )
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise _refuse(
            "ersd keeps its own KV cache: a filled past_key_values / cache cannot be resumed; "
            "pass the whole prompt as input_ids without a cache",
            param="cache",
        )
    do_sample = bool(gc.do_sample)
    sampling = sampling_from(logits_processor or [], do_sample)
    if not do_sample and watermark is not None:
        raise _refuse(
            "do_sample=False is greedy decoding, but a watermark needs sampling; pass "
            "do_sample=True (with a temperature > 0)",
            param="do_sample",
        )
    prompts = _prompts(input_ids, model_kwargs.get("attention_mask"))
    if streamer is not None and len(prompts) > 1:
        raise _refuse("a streamer takes one row; pass one prompt", param="streamer")
    length = input_ids.shape[1]
    max_new = int(gc.max_length) - length
    if max_new < 1:
        raise _refuse(
            f"max_length={gc.max_length} leaves no room after the {length}-token input; set "
            "max_new_tokens",
            param="max_new_tokens",
        )
    target = wrap_module(model)
    draft = _with_stop(_as_draft(draft_model), draft_stop)
    tokenizer = stop_tokenizer
    if draft_model is not None:
        _check_draft_tokenizer(model, draft_model, stop_tokenizer)
    if stop_strings and tokenizer is None:
        tokenizer = _hf_tokenizer(draft_model) or _folder_tokenizer(model)
    eos = gc.eos_token_id
    criteria = _stop_criteria(stopping_criteria or [], stop_strings, tokenizer, gc.max_length, eos)
    common: dict[str, Any] = {
        "max_new_tokens": max_new,
        "method": method,
        "tree": tree,
        "eos_token_id": eos,
        "watermark": watermark,
        "race_scheme": race_scheme,
        **sampling,
    }
    device = input_ids.device
    rows = [_Row(list(r), criteria, device) for r in input_ids.tolist()]
    if len(prompts) == 1:
        if not isinstance(seed, int) or isinstance(seed, bool):
            seed = _one_seed(seed)
        for rec in generate_stream(target, draft, prompts[0], seed=seed, **common):
            kept = rows[0].add(rec.tokens)
            if streamer is not None and kept:
                streamer.put(torch.tensor(kept))
            if rows[0].done:
                break
    else:
        # generate_batch_stream's loop, with every keyword of a Request (race_scheme included)
        seeds = batch_seeds(seed, len(prompts))
        drafter = as_drafter(draft)
        if drafter is None:
            common["tree"] = None
        requests = batch_requests(target, drafter, prompts, seeds, **common)
        for index, rec, _ in run_requests(target, drafter, requests):
            rows[index].add(rec.tokens)
            if all(r.done for r in rows):
                break
    if streamer is not None:
        streamer.end()
    return _output(rows, gc, device)


def _one_seed(seed: Any) -> int:
    if isinstance(seed, Sequence) and not isinstance(seed, str | bytes) and len(seed) == 1:
        return int(seed[0])
    raise _refuse(
        f"seed must be an int (or one int per row of input_ids), got {seed!r}", param="seed"
    )


def _output(rows: list[_Row], gc: Any, device: torch.device) -> Any:
    """``generate``'s return value: the sequences (rows padded on the right with the pad id),
    or a ``GenerateDecoderOnlyOutput`` with them when ``return_dict_in_generate``."""
    longest = max(len(r.new) for r in rows)
    pad = gc.pad_token_id
    if isinstance(pad, list | tuple):
        pad = pad[0] if pad else None
    if pad is None and any(len(r.new) < longest for r in rows):
        raise _refuse(
            "rows of different lengths need a pad_token_id; set generation_config.pad_token_id "
            "(e.g. to tokenizer.eos_token_id)",
            param="pad_token_id",
        )
    seqs = [r.padded + r.new + [int(pad)] * (longest - len(r.new)) for r in rows]
    sequences = torch.tensor(seqs, dtype=torch.long, device=device)
    if not gc.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return GenerateDecoderOnlyOutput(sequences=sequences)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# the folder form: custom_generate=DIR (a local folder, or a Hub repository built from one)

GENERATE_PY = '''"""ersd's speculative sampling as a transformers ``custom_generate`` (written by
``ersd transformers export``).  Use: ``model.generate(**inputs, custom_generate=THIS_FOLDER,
trust_remote_code=True, draft_model=draft, tree="chain:4", seed=0, do_sample=True, ...)``.
See https://github.com/ersd (docs/transformers.md) for the settings.
"""

from ersd.integrations.transformers import generate_from_folder


def generate(model, **kwargs):
    return generate_from_folder(model, **kwargs)
'''

REQUIREMENTS_TXT = "ersd>=0.1.0\ntransformers>=5.0.0\n"


def export_folder(directory: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Write ``DIRECTORY/custom_generate/generate.py`` and ``requirements.txt``; returns them."""
    folder = Path(directory) / "custom_generate"
    files = {folder / "generate.py": GENERATE_PY, folder / "requirements.txt": REQUIREMENTS_TXT}
    existing = [p for p in files if p.exists()]
    if existing and not overwrite:
        raise GenerationInputError(
            f"{existing[0]} already exists; pass --force (overwrite=True) to replace it",
            param="directory",
        )
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return list(files)


def generate_from_folder(model: Any, **arguments: Any) -> Any:
    """What the exported ``generate.py`` runs: ``arguments`` are every argument of the
    ``generate`` call (``transformers`` passes them all to a folder's function); this re-enters
    transformers' ``generate`` with :func:`generate` as the callable, so both forms behave
    alike.  ``tokenizer=`` reaches here, so it serves ``stop_strings``."""
    from transformers.generation.utils import GenerationMixin

    tokenizer = arguments.pop("tokenizer", None)
    if tokenizer is not None and arguments.get("stop_tokenizer") is None:
        arguments["stop_tokenizer"] = tokenizer
    return GenerationMixin.generate(model, custom_generate=generate, **arguments)


__all__ = ["export_folder", "generate", "generate_from_folder", "sampling_from", "wrap_module"]
