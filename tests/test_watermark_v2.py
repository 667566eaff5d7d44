"""Issue 48's watermark items, library side: the prompt-aware keyed race (version 2), many samples
per prompt, an audit that never accuses authentic text, and the key-file / detector input checks.
Each test reproduces its defect under the old behaviour (version 1, or the input that crashed)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

import ersd
from ersd.errors import ErsdError, WatermarkError
from ersd.methods.catalog import CATALOG, race_winners_only
from ersd.watermark import Watermark, audit, detect, load_watermark, write_key_file
from ersd.watermark.audit import audit_text
from ersd.watermark.detect import scored_windows
from ersd.watermark.settings import LEGACY_NUM_SALTS, MAX_KEY_FILE_BYTES, check_tokenizer
from tests.toy import table_model

KS_ALPHA = 1e-3
KEY = bytes(range(32))
BIG = table_model(200, 0, scale=1.0)


def _random_key(i: int) -> bytes:
    return hashlib.sha256(b"test-key-v2" + i.to_bytes(8, "little")).digest()


def _flat(vocab: int) -> ersd.FunctionModel:
    """A model whose next-token law is the same whatever the context (uniform over ``vocab``):
    every opening difference then comes from the race's noise alone."""

    def fn(seqs: list[list[int]]) -> torch.Tensor:
        return torch.zeros((len(seqs), vocab))

    return ersd.FunctionModel(fn, vocab)


# --- 1. the prompt-aware race -------------------------------------------------------------------


def _openings(wm: Watermark | None, prompts: list[list[int]], n: int) -> int:
    model = _flat(50)
    outs = [
        tuple(ersd.generate(model, None, p, max_new_tokens=n, seed=0, watermark=wm).tokens)
        for p in prompts
    ]
    return len(set(outs))


def test_openings_differ_across_prompts_at_one_salt() -> None:
    """Issue 48 M1: version 1 keys the first ``h`` races by ``-1`` padding whatever the prompt,
    so at one salt 40 prompts over a context-free law open identically; version 2 keys them by
    the prompt's last tokens and opens as diversely as unwatermarked sampling (expected
    50 * (1 - 0.98**40) = 27.7 distinct first tokens of 40; binomial noise ~ +-3)."""
    prompts = [[i, (7 * i + 1) % 50, (3 * i + 2) % 50] for i in range(40)]
    v1 = Watermark(key=KEY, version=1, salt=0)
    v2 = Watermark(key=KEY, salt=0)
    # unwatermarked: one seed per prompt (the seeded race already hashes the prompt)
    plain = _openings(None, prompts, 1)
    assert _openings(v1, prompts, 1) == 1 and _openings(v1, prompts, 3) == 1
    assert abs(_openings(v2, prompts, 1) - plain) <= 8 and _openings(v2, prompts, 1) >= 20
    assert _openings(v2, prompts, 3) >= 38


def test_version_two_texts_are_detected_with_and_without_the_prompt() -> None:
    wm = Watermark(key=KEY)
    prompt = [5, 6, 7, 8, 9]
    toks = ersd.generate(BIG, None, prompt, max_new_tokens=64, seed=3, watermark=wm).tokens
    blind = detect(toks, wm, per_token=True)
    full = detect(toks, wm, prompt=prompt, per_token=True)
    h = wm.context_width
    assert blind.opening == h and min(blind.positions) >= h
    assert full.opening == 0 and full.positions[0] == 0
    assert full.scored >= blind.scored + h - 1  # the opening is scored given the prompt
    assert blind.p_value < 1e-6 and full.p_value < blind.p_value
    # the prompt's last h tokens are all the detector needs
    assert detect(toks, wm, prompt=prompt[-h:]).p_value == full.p_value
    # a wrong prompt: the opening terms are null terms, so the text is still found (from h on)
    other = detect(toks, wm, prompt=[1, 1, 1, 1])
    assert other.p_value > full.p_value and other.p_value < 1e-3


def test_old_texts_still_detect_under_the_old_version(tmp_path: Path) -> None:
    """A key file without a version (the first releases') is version 1 with 8 salts: its old
    texts still detect with it.  The versions differ only in the first ``h`` windows, so either
    version's detector finds the other's text from position ``h`` on (the opening terms are
    null terms then): switching a server's key to version 2 loses no old text."""
    legacy = tmp_path / "old.key"
    legacy.write_text(KEY.hex() + "\n")
    legacy.chmod(0o600)
    old = load_watermark(legacy)
    assert old.version == 1 and old.num_salts == LEGACY_NUM_SALTS
    toks = ersd.generate(BIG, None, [3, 4], max_new_tokens=64, seed=5, watermark=old).tokens
    found = detect(toks, old, per_token=True)
    assert found.p_value < 1e-6 and found.opening == 0 and found.positions[0] == 0
    new = Watermark(key=KEY, num_salts=LEGACY_NUM_SALTS)
    assert new.version == 2
    blind = detect(toks, new, per_token=True)
    assert blind.opening == new.context_width and blind.p_value < 1e-6
    # the scores from position h on are the same terms under both versions
    tail = dict(zip(found.positions, found.token_scores, strict=True))
    assert all(
        tail[p] == pytest.approx(v)
        for p, v in zip(blind.positions, blind.token_scores, strict=True)
    )
    # and the same text's opening is not version 2's: given the prompt, its terms are null ones
    new_text = ersd.generate(BIG, None, [3, 4], max_new_tokens=64, seed=5, watermark=new).tokens
    assert new_text[: new.context_width] != toks[: new.context_width]
    # keygen writes the version into the file, so it never depends on a default again
    fresh = write_key_file(tmp_path / "new.key")
    body = json.loads((tmp_path / "new.key").read_text())
    assert body["version"] == 2 == fresh.version and body["num_salts"] == 256


@pytest.mark.parametrize("scheme", ["ersd-v1", "vllm-philox"])
@pytest.mark.parametrize("version", [1, 2])
def test_both_versions_are_drafter_invariant(scheme: str, version: int) -> None:
    from tests.toy import mixed_draft

    draft = mixed_draft(BIG, table_model(200, 1), 0.3)
    key: bytes | int = KEY if scheme == "ersd-v1" else 987654321
    wm = Watermark(key=key, scheme=scheme, version=version, context_width=3)
    for seed in range(3):
        kw = dict(max_new_tokens=30, seed=seed, watermark=wm, temperature=0.9)
        solo = ersd.generate(BIG, None, [1, 2, 3], **kw).tokens  # type: ignore[arg-type]
        spec = ersd.generate(BIG, draft, [1, 2, 3], tree="multi:2x3", **kw)  # type: ignore[arg-type]
        assert spec.tokens == solo


def _law(version: int, seeds: range) -> float:
    """Exactness over a random key of the first two tokens on a 3-token vocabulary, with the
    prompt's token in the first window (version 2) -- chi-square p-value against the law."""
    model = table_model(3, 4, scale=1.5)
    prompt = [1]
    counts: dict[tuple[int, ...], int] = {}
    for s in seeds:
        wm = Watermark(key=_random_key(s), context_width=1, num_salts=1, version=version)
        out = tuple(
            ersd.generate(model, None, prompt, max_new_tokens=2, seed=s, watermark=wm).tokens
        )
        counts[out] = counts.get(out, 0) + 1
    p0 = torch.softmax(model.fn([prompt]).double()[0], -1).numpy()
    law = {}
    for a in range(3):
        p1 = torch.softmax(model.fn([[*prompt, a]]).double()[0], -1).numpy()
        for b in range(3):
            law[(a, b)] = p0[a] * p1[b]
    keys = sorted(law)
    obs = np.array([counts.get(k, 0) for k in keys])
    exp = np.array([law[k] for k in keys]) * len(seeds)
    return float(stats.chisquare(obs, exp).pvalue)


def test_version_two_law_is_the_targets_and_a_reused_window_is_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Version 2's first window is the prompt's token: when the first generated token repeats
    it, the second race's window repeats the first's and must fall back (the repeated-window
    rule over the prompt-aware windows).  The mutant that reuses the keyed noise there is
    rejected by the same test."""
    from ersd.watermark.keyed import WatermarkKey

    assert _law(2, range(2000)) >= KS_ALPHA
    assert _law(1, range(2000, 4000)) >= KS_ALPHA  # the old version stays exact too
    monkeypatch.setattr(WatermarkKey, "repeated", property(lambda self: False))
    assert _law(2, range(2000)) < KS_ALPHA


def test_version_two_null_is_uniform_with_and_without_the_prompt() -> None:
    """p-values of unwatermarked text are U(0, 1) for a version-2 key whether or not the prompt
    is given (KS at 1e-3); scoring the opening without the prompt by guessing ``-1`` padding is
    fine under the null too, but scoring repeated windows (the broken detector) is not."""
    small = table_model(5, 3, scale=2.5)
    blind, given, bad = [], [], []
    for s in range(300):
        wm = Watermark(key=_random_key(1000 + s), context_width=2, num_salts=1)
        toks = ersd.generate(small, None, [1, 2], max_new_tokens=64, seed=s).tokens
        blind.append(detect(toks, wm, min_tokens=1).p_value)
        given.append(detect(toks, wm, prompt=[1, 2]).p_value)
        windows = [tuple([1, 2, *toks][i : i + 2]) for i in range(len(toks))]
        u = wm.prf(0).uniform_at(windows, np.asarray(toks))
        bad.append(float(stats.gamma.sf(-np.log1p(-u).sum(), len(toks))))
    assert stats.kstest(blind, "uniform").pvalue >= KS_ALPHA
    assert stats.kstest(given, "uniform").pvalue >= KS_ALPHA
    assert stats.kstest(bad, "uniform").pvalue < KS_ALPHA


def test_scored_windows_start_and_initial() -> None:
    ids = [7, 8, 7, 8, 9]
    # the prompt's window (7, 8) keys position 0; positions 2 and 4 repeat it, 3 repeats 1's
    _, toks, pos = scored_windows(ids, 2, initial=[7, 8])
    assert pos == [0, 1] and toks == [7, 8]
    # without the prompt: from position 2 on, whose windows lie inside the text
    rows, toks, pos = scored_windows(ids, 2, start=2)
    assert pos == [2, 3] and toks == [7, 8] and rows.tolist() == [[7, 8], [8, 7]]


# --- 2. many samples per prompt -----------------------------------------------------------------


def test_many_distinct_texts_per_prompt() -> None:
    """Issue 48 L1: at most ``num_salts`` distinct texts per prompt (8 before); the default is
    now 256, so 100 seeds give 100 distinct texts where 8 salts give at most 8."""
    model = _flat(50)
    for wm, most in ((Watermark(key=KEY, num_salts=8), 8), (Watermark(key=KEY), 100)):
        texts = {
            tuple(ersd.generate(model, None, [1, 2], max_new_tokens=6, seed=s, watermark=wm).tokens)
            for s in range(100)
        }
        assert len(texts) == most


def test_detection_with_many_salts_keeps_an_exact_null_and_finds_the_salt() -> None:
    wm = Watermark(key=KEY)  # 256 salts
    rng = np.random.default_rng(9)
    ps = [detect(rng.integers(0, 1000, 40).tolist(), wm).p_value for _ in range(200)]
    assert stats.kstest(ps, "uniform").pvalue >= KS_ALPHA
    toks = ersd.generate(BIG, None, [4], max_new_tokens=64, seed=1234, watermark=wm).tokens
    d = detect(toks, wm)
    assert d.salt == 1234 % 256 and d.salts_tried == 256 and d.p_value < 1e-6


# --- 3. the audit -------------------------------------------------------------------------------


class _PieceTokenizer:
    """Pieces "a", "b", "ab", "c": the greedy longest-match encoder merges "a" + "b" into "ab",
    so a text generated as the ids of "a", "b" re-tokenizes to the id of "ab"."""

    pieces: tuple[str, ...] = ("a", "b", "ab", "c")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            if text.startswith("ab", i):
                out.append(2)
                i += 2
            else:
                out.append(self.pieces.index(text[i]))
                i += 1
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


def _pieces_model() -> ersd.FunctionModel:
    def fn(seqs: list[list[int]]) -> torch.Tensor:
        out = torch.zeros((len(seqs), 4))
        out[:, 2] = -40.0  # the model never writes the merged piece "ab" itself
        return out

    return ersd.FunctionModel(fn, 4)


@pytest.mark.parametrize("watermark", [None, Watermark(key=KEY)])
def test_audit_of_a_text_that_re_tokenizes_otherwise_is_not_a_forgery(
    watermark: Watermark | None,
) -> None:
    """Issue 48 M2: the ids audit clean; their text re-tokenizes to other ids (every "a", "b"
    becomes "ab").  The bare id audit of the re-tokenized text calls it a forgery (the old
    behaviour); :func:`audit_text` re-aligns and verifies it, and still catches an edit."""
    model, tok = _pieces_model(), _PieceTokenizer()
    res = ersd.generate(model, None, [3], max_new_tokens=40, seed=2, watermark=watermark)
    text = tok.decode(res.tokens)
    assert "ab" in text  # the case at hand
    assert audit(model, [3], res.tokens, seed=2, watermark=watermark).verified
    assert not audit(model, [3], tok.encode(text), seed=2, watermark=watermark).verified
    rep = audit_text(model, tok, [3], text, seed=2, watermark=watermark)
    assert rep.verified and rep.status == "verified" and rep.realigned
    edited = text[:20] + ("c" if text[20] != "c" else "a") + text[21:]
    bad = audit_text(model, tok, [3], edited, seed=2, watermark=watermark)
    assert bad.status == "forgery" and not bad.verified and bad.first_forgery is not None


class _SpecialTokenizer(_PieceTokenizer):
    """Piece 4 is a special token: decoding skips it, so the text does not show it."""

    pieces: tuple[str, ...] = ("a", "b", "ab", "c", "<s>")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids if not (skip_special_tokens and i == 4))


def test_audit_of_a_text_whose_special_tokens_were_skipped_is_not_a_forgery() -> None:
    """A generated special token (an EOS mid-text without eos_token_id) leaves no character in
    the decoded text: the audit inserts it where the race wrote it, instead of calling the text
    a forgery (SmolLM2: 1 of 24 watermarked 48-token texts)."""

    def fn(seqs: list[list[int]]) -> torch.Tensor:
        out = torch.zeros((len(seqs), 5))
        out[:, 2] = -40.0
        return out

    model, tok = ersd.FunctionModel(fn, 5), _SpecialTokenizer()
    res = ersd.generate(model, None, [3], max_new_tokens=40, seed=6, watermark=Watermark(key=KEY))
    assert 4 in res.tokens  # the case at hand
    text = tok.decode(res.tokens)
    rep = audit_text(model, tok, [3], text, seed=6, watermark=Watermark(key=KEY))
    assert rep.status == "verified" and rep.realigned


def test_audit_builds_its_key_through_the_request_and_reads_the_catalog() -> None:
    wm = Watermark(key=KEY)
    res = ersd.generate(BIG, None, [1, 2, 3, 4, 5], max_new_tokens=20, seed=4, watermark=wm)
    assert audit(BIG, [1, 2, 3, 4, 5], res.tokens, seed=4, watermark=wm).verified
    # version 2: the prompt keys the first windows, so another prompt's opening fails
    assert not audit(BIG, [9, 2, 3, 4, 6], res.tokens, seed=4, watermark=wm).verified
    assert race_winners_only("ersd") and not race_winners_only("sd")
    assert [n for n, i in CATALOG.items() if race_winners_only(i)] == ["ersd"]
    with pytest.raises(ErsdError, match="race's winner"):
        audit(BIG, [1], res.tokens, method="sd")


def test_audit_refuses_bad_types_with_clear_errors() -> None:
    toks = [1, 2, 3]
    for kw, word in (
        ({"tie_tolerance": "x"}, "tie_tolerance"),
        ({"tie_tolerance": -1.0}, "tie_tolerance"),
        ({"seed": 2.5}, "seed"),
        ({"temperature": "hot"}, "temperature"),
    ):
        with pytest.raises(ErsdError, match=word):
            audit(BIG, [1], toks, **kw)
    with pytest.raises(ErsdError, match="text"):
        audit(BIG, [1], "hello")  # type: ignore[arg-type]
    with pytest.raises(ErsdError, match="text"):
        audit_text(BIG, _PieceTokenizer(), [1], [1, 2])  # type: ignore[arg-type]


# --- 5. detector inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"salt": 2.7}, "salt"),
        ({"salt": True}, "salt"),
        ({"salt": "1"}, "salt"),
        ({"threshold": "0.1"}, "threshold"),
        ({"min_tokens": "8"}, "min_tokens"),
        ({"vocab_size": 1.5}, "vocab_size"),
        ({"prompt": "abc"}, "prompt"),
    ],
)
def test_detect_refuses_bad_types_without_coercion(kwargs: dict[str, object], word: str) -> None:
    wm = Watermark(key=KEY, num_salts=8)
    with pytest.raises(WatermarkError, match=word):
        detect(list(range(40)), wm, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("ids", [5, "1 2 3", [[1, 2], [3, 4]], [1.5, 2.0] * 10, {"a": 1}, None])
def test_detect_refuses_bad_token_ids_with_a_watermark_error(ids: object) -> None:
    with pytest.raises(WatermarkError):
        detect(ids, Watermark(key=KEY))  # type: ignore[arg-type]


# --- 5. key files ---------------------------------------------------------------------------------


def _private(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    ("body", "word"),
    [
        ('{"key": ' + "[" * 20_000 + "]" * 20_000 + "}", "JSON"),
        ('{"key": "' + "ab" * 16 + '", "num_salts": ' + "9" * 5000 + "}", "JSON"),
        ('{"key": ' + "1" * 32 + "}", "string of hex"),  # a JSON number is not hex digits
        ('{"scheme": "vllm-philox", "key": "12"}', "JSON integer"),
        ('{"key": "' + "ab" * 16 + '", "num_salts": 2.5}', "num_salts"),
        ('{"key": "' + "ab" * 16 + '", "scheme": ["x"]}', "scheme"),
        ('{"key": "' + "ab" * 16 + '", "version": 3}', "version"),
        ('{"key": "' + "ab" * 16 + '", "tokenizer": 5}', "tokenizer"),
        ("[1, 2]" * 10, "hex"),
    ],
)
def test_bad_key_files_give_one_clear_error(tmp_path: Path, body: str, word: str) -> None:
    path = _private(tmp_path / "k.key", body)
    with pytest.raises(WatermarkError, match=word) as err:
        load_watermark(path)
    assert len(str(err.value)) < 400 and "\n" not in str(err.value)


def test_key_file_with_a_bom_and_size_and_owner_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = json.dumps({"key": KEY.hex(), "version": 2, "num_salts": 8})
    bom = _private(tmp_path / "bom.key", "\ufeff" + body)
    assert load_watermark(bom) == Watermark(key=KEY, num_salts=8)
    hex_bom = _private(tmp_path / "hexbom.key", "\ufeff" + KEY.hex())
    assert load_watermark(hex_bom).key == KEY
    big = _private(tmp_path / "big.key", b" " * (MAX_KEY_FILE_BYTES + 1))
    with pytest.raises(WatermarkError, match="larger than"):
        load_watermark(big)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(bom).st_uid + 1)
    with pytest.raises(WatermarkError, match="another user"):
        load_watermark(bom)
    assert load_watermark(bom, require_private=False).key == KEY


def test_keygen_into_a_missing_folder_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WatermarkError, match="cannot create the key file"):
        write_key_file(tmp_path / "no-such-dir" / "x.key")


def test_the_keys_tokenizer_is_checked_by_vocabulary_not_by_name() -> None:
    class Tok:
        def __init__(self, vocab: dict[str, int]) -> None:
            self.vocab = vocab

        def get_vocab(self) -> dict[str, int]:
            return self.vocab

    wm = Watermark(key=KEY, tokenizer="smollm2-135m")
    check_tokenizer(wm, Tok({}), "smollm2-135m")  # the same name: no load needed
    with pytest.raises(WatermarkError, match="smollm2-135m"):
        check_tokenizer(wm, Tok({"a": 0}), "/some/other/folder")
    check_tokenizer(Watermark(key=KEY), Tok({}), "anything")  # the key names none
