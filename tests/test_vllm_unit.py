"""The vLLM plugin's pure parts (no vLLM needed): request parsing and refusals, the row race
against ersd.race, incremental context keys."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ersd.integrations.vllm import (
    VllmIntegrationError,
    check_request,
    ersd_extra_args,
    parse_extra_args,
)
from ersd.integrations.vllm.plugin import check_version
from ersd.integrations.vllm.rows import ContextKeys, race_winners
from ersd.probs import logits_to_probs
from ersd.race import RaceNoise, extend_key, extend_key_many, race_winner, root_key


def vllm_params(**kw):
    """Stand-in for vllm.SamplingParams with vLLM's defaults."""
    base = dict(
        temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.0,
        frequency_penalty=0.0, repetition_penalty=1.0, logit_bias=None, allowed_token_ids=None,
        bad_words=None, min_tokens=0, structured_outputs=None, logprobs=None, n=1,
        extra_args=ersd_extra_args(3, 0.7, top_k=20),
    )  # fmt: skip
    base.update(kw)
    return SimpleNamespace(**base)


def test_extra_args_round_trip() -> None:
    p = parse_extra_args(ersd_extra_args(5, 0.8, top_k=40, top_p=0.9))
    assert p is not None and p.seed == 5
    assert (p.sampling.temperature, p.sampling.top_k, p.sampling.top_p) == (0.8, 40, 0.9)
    assert parse_extra_args(None) is None
    assert parse_extra_args({"other": 1}) is None


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"ersd_temperature": 0.5}, "without ersd_seed"),
        ({"ersd_seed": -1}, "ersd_seed must be"),
        ({"ersd_seed": 1, "ersd_tempreature": 1.0}, "unknown ERSD extra"),
        ({"ersd_seed": 1, "ersd_temperature": -1.0}, "temperature"),
        ({"ersd_seed": 1, "ersd_top_p": 0.0}, "top_p"),
        ({"ersd_seed": 1, "ersd_top_k": 2.5}, "ersd_top_k"),
    ],
)
def test_bad_extra_args_are_refused(extra, needle) -> None:
    with pytest.raises(VllmIntegrationError, match=needle):
        parse_extra_args(extra)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"temperature": 1.0}, "temperature=1.0"),
        ({"top_p": 0.9}, "top_k/top_p/min_p"),
        ({"repetition_penalty": 1.1}, "penalties"),
        ({"logit_bias": {1: 2.0}}, "logit_bias"),
        ({"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
        ({"bad_words": ["x"]}, "bad_words"),
        ({"min_tokens": 3}, "min_tokens"),
        ({"logprobs": 1}, "logprobs"),
        ({"n": 2}, "n=2"),
    ],
)
def test_unsupported_combinations_are_refused(change, needle) -> None:
    assert check_request(vllm_params()) is not None
    with pytest.raises(VllmIntegrationError, match=needle):
        check_request(vllm_params(**change))


def test_async_scheduling_is_refused_and_ordinary_requests_pass() -> None:
    with pytest.raises(VllmIntegrationError, match="async scheduling"):
        check_request(vllm_params(), async_scheduling=True)
    # ordinary requests are never touched, whatever their settings
    assert check_request(vllm_params(extra_args=None, temperature=1.0, n=4)) is None


def test_version_guard() -> None:
    check_version("0.32.0")
    check_version("0.32.3+cpu")
    for bad in ("0.31.9", "0.33.0", "1.0.0", "unknown"):
        with pytest.raises(VllmIntegrationError, match="supports vLLM 0.32"):
            check_version(bad)


@pytest.mark.parametrize(
    "extra",
    [
        {"ersd_seed": 1, "ersd_temperature": 1.0},
        {"ersd_seed": 2, "ersd_temperature": 0.6, "ersd_top_k": 30},
        {"ersd_seed": 3, "ersd_temperature": 1.3, "ersd_top_p": 0.8},
        {"ersd_seed": 4, "ersd_temperature": 0.0},
    ],
)
def test_row_race_is_ersd_race(extra) -> None:
    """Batched rows give exactly race_winner(logits_to_probs(row), exponentials(key)) per row,
    with several settings mixed in one call."""
    vocab = 1000
    gen = torch.Generator().manual_seed(int(extra["ersd_seed"]))
    logits = torch.randn(40, vocab, generator=gen) * 4
    mine = parse_extra_args(extra)
    other = parse_extra_args({"ersd_seed": 9, "ersd_temperature": 0.9, "ersd_top_k": 7})
    assert mine is not None and other is not None
    params = [mine if r % 3 else other for r in range(40)]
    keys = [root_key(r, [1, 2, r]) for r in range(40)]
    got = race_winners(logits, keys, params).tolist()
    noise = RaceNoise(vocab)
    want = [
        race_winner(logits_to_probs(logits[r], params[r].sampling), noise.exponentials(keys[r]))
        for r in range(40)
    ]
    assert got == want
    assert len(set(got)) > 5  # the rows really differ


def test_row_race_equals_gumbel_argmax_form() -> None:
    """argmin E/p is argmax(log p + G) with G = -log E (Gumbel): same winners away from ties."""
    vocab = 500
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(1)) * 2
    p = parse_extra_args({"ersd_seed": 0})
    assert p is not None
    keys = [root_key(0, [r]) for r in range(64)]
    winners = race_winners(logits, keys, [p] * 64)
    noise = RaceNoise(vocab)
    e = torch.stack([noise.exponentials(k) for k in keys])
    gumbel = -torch.log(e)
    logp = torch.log_softmax(logits.double(), dim=-1)
    assert torch.equal(winners, torch.argmax(logp + gumbel, dim=-1))


def test_context_keys_are_incremental_and_exact() -> None:
    ck = ContextKeys()
    prompt, out = [5, 6, 7], [8, 9]
    assert ck.key("a", 11, prompt, out) == extend_key_many(root_key(11, prompt), out)
    out += [10, 11]
    assert ck.key("a", 11, prompt, out) == extend_key_many(root_key(11, prompt), out)
    # a shorter output (e.g. a discarded step) or another seed recomputes from scratch
    assert ck.key("a", 11, prompt, out[:1]) == extend_key(root_key(11, prompt), 8)
    assert ck.key("a", 12, prompt, out) == extend_key_many(root_key(12, prompt), out)
    ck.retain({"b"})
    assert ck.key("a", 11, prompt, []) == root_key(11, prompt)


def test_torch_philox_words_are_numpys() -> None:
    import numpy as np

    from ersd.integrations.vllm.philox import _s64, philox_blocks

    keys = [root_key(s, [4, 2]) for s in range(5)] + [0, (1 << 64) - 1]
    for stream in (0, 1 << 20, (1 << 64) - 1):
        got = philox_blocks(
            torch.tensor([_s64(k) for k in keys]),
            torch.tensor([_s64(stream)] * len(keys)),
            5,
        )
        for r, k in enumerate(keys):
            want = np.random.Philox(key=(stream << 64) | k).random_raw(20)
            assert got[r].numpy().view(np.uint64).tolist() == want.tolist()


def test_torch_race_noise_is_bit_identical_to_numpy() -> None:
    from ersd.integrations.vllm.philox import race_exponentials_torch
    from ersd.race import STREAM_DRAFT

    vocab = 6000
    keys = [root_key(s, [7, s]) for s in range(12)]
    for stream in (0, STREAM_DRAFT + 3):
        got = race_exponentials_torch(keys, vocab, stream)
        noise = RaceNoise(vocab)
        want = torch.stack([noise.exponentials(k, stream) for k in keys])
        assert torch.equal(got, want)  # every bit, tails and wedge rejections included


def test_row_race_with_torch_noise(monkeypatch) -> None:
    vocab = 3000
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(3)) * 3
    p = parse_extra_args({"ersd_seed": 1, "ersd_temperature": 0.9})
    assert p is not None
    keys = [root_key(1, [r]) for r in range(6)]
    want = race_winners(logits, keys, [p] * 6)
    monkeypatch.setenv("ERSD_VLLM_NOISE", "torch")
    assert torch.equal(race_winners(logits, keys, [p] * 6), want)
    monkeypatch.setenv("ERSD_VLLM_NOISE", "cuda")
    with pytest.raises(ValueError, match="ERSD_VLLM_NOISE"):
        race_winners(logits, keys, [p] * 6)


def test_verified_tokens_follow_greedy_verification() -> None:
    """Per request: winners while the draft equals them, then the first mismatch's winner, or
    every draft plus the bonus winner; -1 pads the rest (vLLM's placeholder)."""
    from ersd.integrations.vllm.patches import _write_verified

    # request 0: 2 drafts, second rejected; request 1: no drafts; request 2: 2 drafts, all taken
    drafts = [5, 6, 8, 9]
    rows = [0, 1, 2, 3, 4, 5, 6]
    winners = [5, 7, 1, 3, 8, 9, 4]  # row winners in row order
    layout = [(0, 0, 0, 2), (1, 3, 2, 0), (2, 4, 2, 2)]
    sampled = torch.full((3, 3), 123, dtype=torch.int32)
    _write_verified(sampled, layout, winners, rows, drafts)
    assert sampled.tolist() == [[5, 7, -1], [3, -1, -1], [8, 9, 4]]


def test_row_keys_extend_by_the_drafts_and_the_mutants_differ() -> None:
    """The plugin's named seams (tests/vllm_mutants.py replaces them in the vLLM tests): row j of
    a request races the context plus its first j drafts; each mutant changes the result."""
    from ersd.integrations.vllm.patches import draft_winners, row_keys
    from ersd.integrations.vllm.rows import race_argmin
    from tests.vllm_mutants import MUTANTS

    k = root_key(3, [1, 2])
    assert row_keys(k, [5, 6]) == [k, extend_key(k, 5), extend_key_many(k, [5, 6])]
    assert MUTANTS["row_keys"][2](k, [5, 6]) != row_keys(k, [5, 6])
    logits = torch.randn(32, 200, generator=torch.Generator().manual_seed(2)) * 2
    p = parse_extra_args({"ersd_seed": 0})
    assert p is not None
    keys = [root_key(0, [r]) for r in range(32)]
    assert torch.equal(draft_winners(logits, keys, [p] * 32), race_winners(logits, keys, [p] * 32))
    assert not torch.equal(
        MUTANTS["draft_noise"][2](logits, keys, [p] * 32), race_winners(logits, keys, [p] * 32)
    )
    probs = torch.softmax(logits.double(), dim=-1)
    e = torch.stack([RaceNoise(200).exponentials(key) for key in keys])
    assert not torch.equal(MUTANTS["gumbel_sign"][2](probs, e), race_argmin(probs, e))


# --- the watermark through extra_args ----------------------------------------------------------


@pytest.fixture
def wm_key_file(tmp_path):
    path = tmp_path / "wm.key"
    path.write_text("7e" * 32)
    path.chmod(0o600)
    return path


def test_watermark_extra_args_are_parsed_and_checked(wm_key_file, tmp_path) -> None:
    from ersd.watermark import load_watermark

    p = parse_extra_args(ersd_extra_args(4, 0.9, watermark_key_file=wm_key_file))
    assert p is not None and p.watermark == load_watermark(wm_key_file)
    p6 = parse_extra_args(
        ersd_extra_args(4, 0.9, watermark_key_file=wm_key_file, watermark_context=6)
    )
    assert p6 is not None and p6.watermark is not None and p6.watermark.context_width == 6
    assert parse_extra_args(ersd_extra_args(4, 0.9)).watermark is None  # type: ignore[union-attr]
    readable = tmp_path / "open.key"
    readable.write_text("7e" * 32)
    readable.chmod(0o644)
    for extra, needle in [
        ({"ersd_watermark_key_file": str(readable)}, "chmod 600"),
        ({"ersd_watermark_key_file": str(tmp_path / "none.key")}, "does not exist"),
        ({"ersd_watermark_key_file": 5}, "file path"),
        ({"ersd_watermark_context": 4}, "goes with ersd_watermark_key_file"),
        ({"ersd_watermark_key_file": str(wm_key_file), "ersd_temperature": 0.0}, "needs sampling"),
        ({"ersd_watermark_key_file": str(wm_key_file), "ersd_watermark_context": 0}, "width"),
    ]:
        with pytest.raises(VllmIntegrationError, match=needle):
            parse_extra_args({"ersd_seed": 1, **extra})
    # the message names the file, never its key
    with pytest.raises(VllmIntegrationError) as err:
        parse_extra_args({"ersd_seed": 1, "ersd_watermark_key_file": str(readable)})
    assert "7e7e" not in str(err.value)


def test_watermarked_rows_race_on_the_keyed_noise_of_ersd_generate(wm_key_file) -> None:
    """Keys and winners of watermarked rows (mixed with plain ones) equal the core's: the
    Request's root key extended by the output, raced on the watermark's noise."""
    from ersd.request import Request
    from ersd.watermark import load_watermark
    from ersd.watermark.keyed import WatermarkNoise

    wm = load_watermark(wm_key_file)
    vocab, prompt = 97, [5, 9, 13]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, vocab, generator=g) * 3
    keys = ContextKeys()
    marked = parse_extra_args(ersd_extra_args(8, 1.0, watermark_key_file=wm_key_file))
    plain = parse_extra_args(ersd_extra_args(8, 1.0))
    assert marked is not None and plain is not None
    outputs = [[], [3], [3, 3, 3, 3, 3], [3, 3, 3, 3, 3, 3], [1, 2], [1, 2]]
    params = [marked, marked, marked, marked, marked, plain]
    row_keys = [
        keys.key(f"r{i}", 8, prompt, out, p.watermark)
        for i, (out, p) in enumerate(zip(outputs, params, strict=True))
    ]
    noise = WatermarkNoise(vocab, wm)
    root = Request(prompt, max_new_tokens=8, seed=8, watermark=wm).root_key()
    for i in range(5):
        want = extend_key_many(root, outputs[i])
        assert int(row_keys[i]) == int(want) and row_keys[i].window == want.window  # type: ignore[attr-defined]
    assert row_keys[3].repeated  # type: ignore[attr-defined]  # the window (3,3,3,3) again
    got = race_winners(logits, row_keys, params).tolist()
    probs = logits_to_probs(logits, plain.sampling)
    for r in range(5):
        assert got[r] == race_winner(probs[r], noise.exponentials(row_keys[r]))
    assert got[5] == race_winner(probs[5], RaceNoise(vocab).exponentials(row_keys[5]))
    # the keyed race differs from the plain race of the same context
    assert int(row_keys[4]) != int(row_keys[5])
    # incremental: one more token extends the kept key
    assert keys.key("r1", 8, prompt, [3, 4], wm) == extend_key_many(root, [3, 4])


def test_race_scheme_v2_rows_race_on_ersd_v2_noise(monkeypatch, wm_key_file) -> None:
    """``ersd_race_scheme="v2"`` rows (mixed with v1 and watermarked rows) win exactly
    race_winner on ``RaceNoise(scheme="v2")``, with the NumPy and the torch noise; v2 and v1
    winners differ (a scheme that never reached the rows is caught); refusals name the fix."""
    vocab = 3000
    logits = torch.randn(30, vocab, generator=torch.Generator().manual_seed(5)) * 3
    v2 = parse_extra_args(ersd_extra_args(1, 0.9, race_scheme="v2"))
    v1 = parse_extra_args(ersd_extra_args(1, 0.9))
    marked = parse_extra_args(ersd_extra_args(1, 0.9, watermark_key_file=wm_key_file))
    assert v2 is not None and v1 is not None and marked is not None
    assert (v2.race_scheme, v1.race_scheme) == ("v2", "v1")
    keys = [root_key(1, [r, 7]) for r in range(30)]
    probs = logits_to_probs(logits, v2.sampling)
    want_v2 = [race_winner(probs[r], RaceNoise(vocab, scheme="v2").exponentials(k)) for r, k in
               enumerate(keys)]  # fmt: skip
    want_v1 = [race_winner(probs[r], RaceNoise(vocab).exponentials(k)) for r, k in enumerate(keys)]
    assert sum(a != b for a, b in zip(want_v2, want_v1, strict=True)) > 10
    for backend in ("numpy", "torch"):
        monkeypatch.setenv("ERSD_VLLM_NOISE", backend)
        assert race_winners(logits, keys, [v2] * 30).tolist() == want_v2, backend
        mixed = [v2 if r % 2 else v1 for r in range(30)]
        got = race_winners(logits, keys, mixed).tolist()
        assert got == [want_v2[r] if r % 2 else want_v1[r] for r in range(30)], backend
        with_mark = [v2, v1, marked] * 10
        ctx = ContextKeys()
        mark_keys = [
            ctx.key(f"m{r}", 1, [r, 7], [], marked.watermark) if r % 3 == 2 else k
            for r, k in enumerate(keys)
        ]
        got = race_winners(logits, mark_keys, with_mark).tolist()
        assert [got[r] for r in range(30) if r % 3 == 0] == want_v2[0::3], backend
        assert [got[r] for r in range(30) if r % 3 == 1] == want_v1[1::3], backend
    for extra, needle in [
        ({"ersd_race_scheme": "v3"}, "ersd_race_scheme must be one of"),
        ({"ersd_race_scheme": 2}, "ersd_race_scheme must be one of"),
        ({"ersd_race_scheme": "v2", "ersd_watermark_key_file": str(wm_key_file)}, "watermarked"),
    ]:
        with pytest.raises(VllmIntegrationError, match=needle):
            parse_extra_args({"ersd_seed": 1, **extra})
