"""ersd inside transformers' ``generate`` (``custom_generate``): the same tokens as ersd.generate.

On the bundled SmolLM2-135M in float32 (marked ``realmodel``): ``model.generate(custom_generate=
ersd.transformers.generate, draft_model=...)`` must give exactly :func:`ersd.generate`'s tokens and
target-only race sampling's (drafts x trees x seeds); the generation config's sampling settings
must reach ersd (a mapping that dropped them is caught: the unfiltered tokens differ); a
left-padded batch must equal its solo calls; a streamer must see the returned text; stop strings
and EOS must cut where target-only sampling with the same criteria stops; the folder form must
equal the callable; and every refusal is one line naming the fix.  Without a model: the warper
mapping, the lazy import, and ``ersd transformers export``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("transformers")

import ersd
from ersd.cli import main
from ersd.errors import ErsdError, GenerationInputError, VocabularyMismatchError
from ersd.integrations.transformers import export_folder, sampling_from, wrap_module

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = "def fibonacci(n):\n    "
N = 14  # new tokens per call: small, so the whole module runs in about a minute on one thread
HF_TOP_K = 50  # transformers' default top_k when do_sample=True (its warper is applied)


# ---------------------------------------------------------------------------------------------
# without a model


def test_import_ersd_does_not_import_transformers() -> None:
    code = (
        "import sys, ersd; assert 'transformers' not in sys.modules; "
        "g = ersd.transformers.generate; assert 'transformers' not in sys.modules; "
        "from ersd.transformers import generate; assert generate is g; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_sampling_from_maps_the_warpers_and_refuses_the_rest() -> None:
    from transformers import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
        TypicalLogitsWarper,
    )

    procs = [
        TemperatureLogitsWarper(0.7),
        TopKLogitsWarper(20),
        TopPLogitsWarper(0.9),
        MinPLogitsWarper(0.05),
    ]
    assert sampling_from(procs, True) == {
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.9,
        "min_p": 0.05,
    }
    assert sampling_from([], False) == {"temperature": 0.0}
    assert sampling_from([], True) == {"temperature": 1.0}
    for bad, field in [
        (RepetitionPenaltyLogitsProcessor(1.2), "repetition_penalty"),
        (TypicalLogitsWarper(0.9), "typical_p"),
        (TopKLogitsWarper(20, min_tokens_to_keep=3), "min_tokens_to_keep"),
    ]:
        with pytest.raises(GenerationInputError) as info:
            sampling_from([*procs, bad], True)
        assert field in str(info.value) and "\n" not in str(info.value)


def test_export_cli_writes_the_folder_and_refuses_to_overwrite(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["transformers", "export", str(tmp_path / "x")])
    assert res.exit_code == 0, res.output
    gen = tmp_path / "x" / "custom_generate" / "generate.py"
    req = tmp_path / "x" / "custom_generate" / "requirements.txt"
    assert "def generate(model, **kwargs)" in gen.read_text()
    assert "ersd" in req.read_text().split()[0]
    again = CliRunner().invoke(main, ["transformers", "export", str(tmp_path / "x")])
    assert again.exit_code != 0 and "--force" in again.output
    assert isinstance(again.exception, SystemExit)  # a clean click error
    forced = CliRunner().invoke(main, ["transformers", "export", "--force", str(tmp_path / "x")])
    assert forced.exit_code == 0


def test_direct_call_is_refused() -> None:
    with pytest.raises(GenerationInputError, match="custom_generate=ersd.transformers.generate"):
        ersd.transformers.generate(object(), torch.tensor([[1, 2]]))


# ---------------------------------------------------------------------------------------------
# the bundled SmolLM2-135M, float32


@pytest.fixture(scope="module")
def smol() -> dict[str, Any]:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = ersd.load_model("smollm2-135m", dtype="float32")  # prepares the bundled folder
    folder = loaded.hf_module.config._name_or_path
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the truncated draft's unused-weights report
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        truncated = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, num_hidden_layers=8
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
    tok = AutoTokenizer.from_pretrained(folder)
    return {
        "model": model,
        "tok": tok,
        "drafts": {
            "hf-truncated": truncated,  # a transformers module
            "ersd-bf16": ersd.load_model("smollm2-135m", dtype="bfloat16"),  # an ersd model
        },
        "loaded": loaded,
    }


def _gen(model: Any, enc: Any, **kw: Any) -> Any:
    return model.generate(**enc, custom_generate=ersd.transformers.generate, **kw)


def _n() -> dict[str, int]:
    return {"max_new_tokens": N}


def _ref(model: Any, seed: int, n: int = N) -> dict[str, Any]:
    """ersd.generate's keywords for the reference of a model.generate call: length, seed and the
    model's EOS ids (transformers' generation config)."""
    return {"max_new_tokens": n, "seed": seed, "eos_token_id": model.generation_config.eos_token_id}


_SAMPLING = {"do_sample": True, "temperature": 0.8, "top_p": 0.95}
_ERSD_SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": HF_TOP_K}
_alone: dict[int, list[int]] = {}


def _target_only(smol: dict[str, Any], seed: int) -> list[int]:
    if seed not in _alone:
        prompt = smol["tok"].encode(PROMPT)
        res = ersd.generate(
            wrap_module(smol["model"]),
            None,
            prompt,
            max_new_tokens=N,
            seed=seed,
            eos_token_id=smol["model"].generation_config.eos_token_id,
            **_ERSD_SAMPLING,
        )
        _alone[seed] = res.tokens
    return _alone[seed]


@pytest.mark.realmodel
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tree", ["chain:3", "multi:2x2", "paths:[[0],[1],[0,0],[1,0],[0,0,0]]"])
@pytest.mark.parametrize("draft", ["hf-truncated", "ersd-bf16"])
def test_custom_generate_equals_ersd_generate_and_target_only(
    smol: dict[str, Any], draft: str, tree: str, seed: int
) -> None:
    tok, model = smol["tok"], smol["model"]
    enc = tok(PROMPT, return_tensors="pt")
    out = _gen(
        model,
        enc,
        draft_model=smol["drafts"][draft],
        tree=tree,
        seed=seed,
        max_new_tokens=N,
        **_SAMPLING,
    )
    length = enc.input_ids.shape[1]
    assert out[0, :length].tolist() == enc.input_ids[0].tolist()
    got = out[0, length:].tolist()
    d = smol["drafts"][draft]
    ref = ersd.generate(
        wrap_module(model),
        wrap_module(d) if isinstance(d, torch.nn.Module) else d,
        enc.input_ids[0].tolist(),
        max_new_tokens=N,
        seed=seed,
        tree=tree,
        eos_token_id=model.generation_config.eos_token_id,
        **_ERSD_SAMPLING,
    ).tokens
    assert got == ref
    assert got == _target_only(smol, seed)


@pytest.mark.realmodel
def test_generation_config_sampling_reaches_ersd(smol: dict[str, Any]) -> None:
    from transformers import GenerationConfig

    tok, model = smol["tok"], smol["model"]
    prompt = tok.encode(PROMPT)
    enc = tok(PROMPT, return_tensors="pt")
    draft = smol["drafts"]["hf-truncated"]
    for settings in [{"top_k": 3}, {"top_k": 0, "top_p": 0.5}, {"top_k": 0, "min_p": 0.2}]:
        config = GenerationConfig(do_sample=True, temperature=1.3, max_new_tokens=N, **settings)
        out = _gen(model, enc, generation_config=config, draft_model=draft, seed=5)
        got = out[0, len(prompt) :].tolist()
        mapped = {k: v for k, v in settings.items() if v}  # top_k=0: transformers' "off"
        filtered = ersd.generate(
            wrap_module(model), None, prompt, temperature=1.3, **mapped, **_ref(model, 5)
        ).tokens
        assert got == filtered, settings
        # a mapping that dropped the filter would give these (the check can fail)
        unfiltered = ersd.generate(
            wrap_module(model), None, prompt, temperature=1.3, **_ref(model, 5)
        ).tokens
        assert unfiltered != filtered, settings
    # do_sample=False: greedy, transformers' own greedy tokens
    greedy = _gen(model, enc, draft_model=draft, do_sample=False, max_new_tokens=N)
    plain = model.generate(**enc, do_sample=False, max_new_tokens=N)
    assert greedy.tolist() == plain.tolist()


@pytest.mark.realmodel
def test_left_padded_batch_equals_solo_calls(smol: dict[str, Any]) -> None:
    tok, model = smol["tok"], smol["model"]
    draft = smol["drafts"]["hf-truncated"]
    prompts = [PROMPT, "The capital of France is", "import numpy as np\nx = np."]
    tok.padding_side = "left"
    try:
        enc = tok(prompts, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = "right"
    length = enc.input_ids.shape[1]
    pad = model.generation_config.pad_token_id
    for seeds in ([7, 8, 9], 4):
        out = _gen(model, enc, draft_model=draft, tree="chain:3", seed=seeds, max_new_tokens=N)
        assert out.shape[0] == 3
        row_seeds = seeds if isinstance(seeds, list) else [ersd.derive_seed(4, i) for i in range(3)]
        for i, (text, s) in enumerate(zip(prompts, row_seeds, strict=True)):
            solo_enc = tok(text, return_tensors="pt")
            solo = _gen(model, solo_enc, draft_model=draft, tree="chain:3", seed=s, **_n())
            new = solo[0, solo_enc.input_ids.shape[1] :].tolist()
            row = out[i, length:].tolist()
            assert row[: len(new)] == new, (i, seeds)
            assert all(t == pad for t in row[len(new) :])
            assert out[i, :length].tolist() == enc.input_ids[i].tolist()


@pytest.mark.realmodel
def test_streamers_receive_the_returned_text(smol: dict[str, Any], capsys: Any) -> None:
    from transformers import TextIteratorStreamer, TextStreamer

    tok, model = smol["tok"], smol["model"]
    enc = tok(PROMPT, return_tensors="pt")
    draft = smol["drafts"]["ersd-bf16"]
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    out = _gen(model, enc, draft_model=draft, streamer=streamer, seed=3, max_new_tokens=N)
    streamed = "".join(streamer)
    assert streamed == tok.decode(out[0, enc.input_ids.shape[1] :])
    assert len(streamed) > 0
    capsys.readouterr()
    out = _gen(model, enc, draft_model=draft, streamer=TextStreamer(tok), seed=3, max_new_tokens=N)
    assert capsys.readouterr().out == tok.decode(out[0]) + "\n"


@pytest.mark.realmodel
def test_stop_strings_and_eos_cut_where_target_only_stops(smol: dict[str, Any]) -> None:
    from transformers import StopStringCriteria

    tok, model = smol["tok"], smol["model"]
    prompt = tok.encode(PROMPT)
    enc = tok(PROMPT, return_tensors="pt")
    long = 40
    alone = ersd.generate(
        wrap_module(model), None, prompt, **_ERSD_SAMPLING, **_ref(model, 11, long)
    ).tokens
    stop = "(n"
    crit = StopStringCriteria(tok, [stop])
    cut = next(j for j in range(len(alone)) if crit(torch.tensor([prompt + alone[: j + 1]]), None))
    assert cut + 1 < len(alone)  # the stop string occurs: the test checks a real cut
    draft = smol["drafts"]["hf-truncated"]
    kw: dict[str, Any] = {"draft_model": draft, "tree": "chain:4", "seed": 11, **_SAMPLING}
    out = _gen(model, enc, max_new_tokens=long, stop_strings=[stop], stop_tokenizer=tok, **kw)
    assert out[0, len(prompt) :].tolist() == alone[: cut + 1]
    # without stop_tokenizer= the tokenizer saved beside the model is found
    again = _gen(model, enc, max_new_tokens=long, stop_strings=stop, **kw)
    assert again.tolist() == out.tolist()
    # a stopping_criteria= of the caller's own is checked token by token too
    from transformers import StoppingCriteria, StoppingCriteriaList

    class AtLength(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **_: Any) -> torch.Tensor:
            done = input_ids.shape[1] >= len(prompt) + 5
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool)

    out = _gen(
        model, enc, max_new_tokens=long, stopping_criteria=StoppingCriteriaList([AtLength()]), **kw
    )
    assert out[0, len(prompt) :].tolist() == alone[:5]
    # EOS: an id that occurs in target-only's text ends it there (and is kept)
    eos = alone[6]
    first = alone.index(eos)
    out = _gen(model, enc, max_new_tokens=long, eos_token_id=eos, pad_token_id=0, **kw)
    assert out[0, len(prompt) :].tolist() == alone[: first + 1]


@pytest.mark.realmodel
def test_return_dict_in_generate(smol: dict[str, Any]) -> None:
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    tok, model = smol["tok"], smol["model"]
    enc = tok(PROMPT, return_tensors="pt")
    kw: dict[str, Any] = {"draft_model": smol["drafts"]["ersd-bf16"], "seed": 2, **_n()}
    plain = _gen(model, enc, **kw)
    out = _gen(model, enc, return_dict_in_generate=True, **kw)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert out.sequences.tolist() == plain.tolist()
    assert out.sequences.dtype == torch.long and out.sequences.shape == plain.shape
    assert out.scores is None and out.logits is None


@pytest.mark.realmodel
def test_folder_form_equals_the_callable(smol: dict[str, Any], tmp_path: Path) -> None:
    tok, model = smol["tok"], smol["model"]
    enc = tok(PROMPT, return_tensors="pt")
    export_folder(tmp_path)
    kw: dict[str, Any] = {
        "draft_model": smol["drafts"]["hf-truncated"],
        "tree": "multi:2x2",
        "seed": 6,
        "max_new_tokens": N,
        **_SAMPLING,
    }
    folder = model.generate(**enc, custom_generate=str(tmp_path), trust_remote_code=True, **kw)
    assert folder.tolist() == _gen(model, enc, **kw).tolist()
    # tokenizer= reaches the folder form (it serves stop_strings there)
    cut = model.generate(
        **enc,
        custom_generate=str(tmp_path),
        trust_remote_code=True,
        stop_strings=["(n"],
        tokenizer=tok,
        **kw,
    )
    assert cut.tolist() == _gen(model, enc, stop_strings=["(n"], stop_tokenizer=tok, **kw).tolist()


@pytest.mark.realmodel
def test_models_from_ersd_load_model_and_callable_tokenizer(smol: dict[str, Any]) -> None:
    loaded = smol["loaded"]
    enc = loaded.tokenizer(PROMPT, return_tensors="pt")
    prompt = loaded.tokenizer.encode(PROMPT)
    assert enc.input_ids[0].tolist() == prompt
    assert enc.attention_mask[0].tolist() == [1] * len(prompt)
    assert loaded.tokenizer(PROMPT).input_ids == prompt
    draft = smol["drafts"]["ersd-bf16"]
    out = loaded.hf_module.generate(
        **enc, custom_generate=ersd.transformers.generate, draft_model=draft, seed=1,
        max_new_tokens=N, do_sample=True, top_k=0,
    )  # fmt: skip
    ref = ersd.generate(wrap_module(loaded.hf_module), draft, prompt, **_ref(loaded.hf_module, 1))
    assert out[0, len(prompt) :].tolist() == ref.tokens


@pytest.mark.realmodel
def test_watermark_passes_through(smol: dict[str, Any]) -> None:
    tok, model = smol["tok"], smol["model"]
    enc = tok(PROMPT, return_tensors="pt")
    prompt = tok.encode(PROMPT)
    mark = ersd.Watermark(key=bytes(range(32)), context_width=2)
    draft = smol["drafts"]["hf-truncated"]
    out = _gen(
        model, enc, draft_model=draft, seed=0, watermark=mark, do_sample=True, top_k=0, **_n()
    )
    got = out[0, len(prompt) :].tolist()
    marked = ersd.generate(wrap_module(model), None, prompt, watermark=mark, **_ref(model, 0))
    unmarked = ersd.generate(wrap_module(model), None, prompt, **_ref(model, 0)).tokens
    assert got == marked.tokens
    assert marked.tokens != unmarked  # the key changes the races: a dropped watermark= is caught


@pytest.mark.realmodel
def test_race_scheme_passes_through(smol: dict[str, Any], tmp_path: Path) -> None:
    """``race_scheme="v2"``: exactly ersd.generate's v2 tokens (one row, a left-padded batch and
    the folder form), which differ from the v1 tokens of the same seed (a dropped keyword is
    caught); an unknown scheme is refused naming race_scheme."""
    tok, model = smol["tok"], smol["model"]
    enc = tok(PROMPT, return_tensors="pt")
    prompt = tok.encode(PROMPT)
    draft = smol["drafts"]["hf-truncated"]
    kw: dict[str, Any] = {"draft_model": draft, "tree": "chain:3", "do_sample": True, "top_k": 0}
    got = _gen(model, enc, seed=3, race_scheme="v2", **kw, **_n())[0, len(prompt) :].tolist()
    v2 = ersd.generate(wrap_module(model), None, prompt, race_scheme="v2", **_ref(model, 3))
    v1 = ersd.generate(wrap_module(model), None, prompt, **_ref(model, 3)).tokens
    assert v2.race_scheme == "v2"
    assert got == v2.tokens
    assert v2.tokens != v1  # v2 draws other races: a keyword that never arrived is caught
    # a left-padded batch: each row its solo v2 call
    texts = [PROMPT, "The capital of France is"]
    tok.padding_side = "left"
    try:
        both = tok(texts, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = "right"
    out = _gen(model, both, seed=[3, 5], race_scheme="v2", **kw, **_n())
    width = both.input_ids.shape[1]
    for i, (text, seed) in enumerate(zip(texts, [3, 5], strict=True)):
        ids = tok.encode(text)
        solo = ersd.generate(wrap_module(model), None, ids, race_scheme="v2", **_ref(model, seed))
        assert out[i, width : width + len(solo.tokens)].tolist() == solo.tokens, i
    # the folder form forwards it too
    export_folder(tmp_path)
    folder = model.generate(
        **enc, custom_generate=str(tmp_path), trust_remote_code=True, seed=3, race_scheme="v2",
        **kw, **_n(),
    )  # fmt: skip
    assert folder[0, len(prompt) :].tolist() == v2.tokens
    with pytest.raises(GenerationInputError) as err:
        _gen(model, enc, seed=3, race_scheme="v3", **kw, **_n())
    assert err.value.param == "race_scheme" and "\n" not in str(err.value)


@pytest.mark.realmodel
def test_refusals_are_one_line_and_name_the_fix(smol: dict[str, Any]) -> None:
    from ersd.models.hf import HFModel
    from tests.hf_tiny import word_tokenizer

    tok, model = smol["tok"], smol["model"]
    enc = tok(PROMPT, return_tensors="pt")
    draft = smol["drafts"]["hf-truncated"]
    other = HFModel(draft, word_tokenizer(model.config.vocab_size))
    mark = ersd.Watermark(key=bytes(range(32)))
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"num_beams": 2}, GenerationInputError, "num_beams=1"),
        ({"assistant_model": draft}, GenerationInputError, "draft_model="),
        ({"repetition_penalty": 1.2}, GenerationInputError, "repetition_penalty"),
        ({"penalty_alpha": 0.6, "top_k": 4}, GenerationInputError, "penalty_alpha"),
        ({"do_sample": False, "watermark": mark}, GenerationInputError, "do_sample=True"),
        ({"output_scores": True, "return_dict_in_generate": True}, GenerationInputError, "=False"),
        ({"draft_model": other}, VocabularyMismatchError, "same tokenizer"),
    ]
    for kw, kind, fix in cases:
        with pytest.raises(kind) as info:
            _gen(model, enc, max_new_tokens=4, **{"draft_model": draft, **kw})
        message = str(info.value)
        assert fix in message, (kw, message)
        assert "\n" not in message, (kw, message)
        assert isinstance(info.value, ErsdError)
    right = tok([PROMPT, "a b"], return_tensors="pt", padding=True)  # SmolLM pads on the right
    with pytest.raises(GenerationInputError, match="padding_side = 'left'"):
        _gen(model, right, draft_model=draft, max_new_tokens=4)
