"""The watermark attack suite (issue 52, ``ersd bench watermark attacks``): each attack does what it
says (exact counts, the original kept in order, seeded draws, uniform positions by a chi-square
test that rejects a deliberately biased variant), the one-line refusals, the table's intervals,
and a small end-to-end run on SmolLM2 (``realmodel``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from ersd.bench.errors import BenchConfigError
from ersd.bench.watermark_attacks import (
    ATTACKS,
    AttackSettings,
    attack_rng,
    check_rate,
    delete_tokens,
    insert_tokens,
    kept_windows,
    parse_settings,
    paste_into,
    replace_tokens,
    report_lines,
    span_iou,
    summarize,
)
from ersd.watermark.detect import encode_text

#: the chi-square tests' level: a correct attack fails one with probability 0.001
ALPHA = 1e-3
BASE = 10**6  # original tokens are BASE + i: never drawn from the small test vocabulary


def _is_subsequence(short: list[int], long: list[int]) -> bool:
    it = iter(long)
    return all(t in it for t in short)


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5])
@pytest.mark.parametrize("n", [16, 37, 128])
def test_each_edit_attack_changes_exactly_its_share(rate: float, n: int) -> None:
    orig = [BASE + i for i in range(n)]
    k = round(rate * n)
    rng = np.random.default_rng(0)
    rep = replace_tokens(orig, rate, 50, rng)
    assert len(rep) == n
    changed = [i for i in range(n) if rep[i] != orig[i]]
    assert len(changed) == k and all(0 <= rep[i] < 50 for i in changed)
    ins = insert_tokens(orig, rate, 50, rng)
    assert len(ins) == n + k and _is_subsequence(orig, ins)
    assert sum(t < BASE for t in ins) == k
    dele = delete_tokens(orig, rate, rng)
    assert len(dele) == n - k and _is_subsequence(dele, orig)


def test_a_replacement_is_never_the_original_token() -> None:
    """With a vocabulary of 2 every replaced position must flip: a replacement drawn over the
    whole vocabulary would keep the original half the time."""
    orig = [0, 1] * 50
    out = replace_tokens(orig, 0.5, 2, np.random.default_rng(1))
    assert sum(a != b for a, b in zip(orig, out, strict=True)) == 50


@pytest.mark.parametrize("attack", ["replace", "insert", "delete"])
def test_attacks_are_seeded(attack: str) -> None:
    orig = list(range(100, 164))

    def run(text: int) -> list[int]:
        rng = attack_rng(7, attack, 300, text, 0.7)
        if attack == "replace":
            return replace_tokens(orig, 0.3, 1000, rng)
        if attack == "insert":
            return insert_tokens(orig, 0.3, 1000, rng)
        return delete_tokens(orig, 0.3, rng)

    assert run(0) == run(0) != run(1)


def _positions(attack: str, n: int, rate: float, rng: Any, biased: bool) -> list[int]:
    """Where one draw of ``attack`` edited a text of ``n`` distinct tokens (for insert: the gap,
    0..n, of each inserted token).  ``biased``: a broken variant that edits only the first
    three quarters of the text."""
    orig = [BASE + i for i in range(n)]
    if biased:
        m = 3 * n // 4
        head = orig[:m]
        k = round(rate * n)
        sub_rate = k / m
        orig_tail = orig[m:]
        if attack == "replace":
            return [i for i, t in enumerate(replace_tokens(head, sub_rate, 50, rng)) if t < BASE]
        if attack == "delete":
            kept = set(delete_tokens(head, sub_rate, rng))
            return [i for i, t in enumerate(head) if t not in kept]
        out = insert_tokens(head, sub_rate, 50, rng) + orig_tail
    elif attack == "replace":
        return [i for i, t in enumerate(replace_tokens(orig, rate, 50, rng)) if t < BASE]
    elif attack == "delete":
        kept = set(delete_tokens(orig, rate, rng))
        return [i for i, t in enumerate(orig) if t not in kept]
    else:
        out = insert_tokens(orig, rate, 50, rng)
    gaps, seen = [], 0
    for t in out:
        if t >= BASE:
            seen += 1
        else:
            gaps.append(seen)
    return gaps


@pytest.mark.parametrize("attack", ["replace", "insert", "delete"])
def test_edit_positions_are_uniform_and_a_biased_variant_is_rejected(attack: str) -> None:
    """Chi-square of the edited positions (gaps for insert) over 1,500 seeded draws against the
    uniform law, at ALPHA; the same test rejects a variant that spares the last quarter."""
    n, rate, draws = 20, 0.3, 1500
    cells = n + 1 if attack == "insert" else n
    pvals = {}
    for biased in (False, True):
        rng = np.random.default_rng(20261206)
        counts = np.zeros(cells)
        for _ in range(draws):
            for p in _positions(attack, n, rate, rng, biased):
                counts[p] += 1
        pvals[biased] = stats.chisquare(counts).pvalue
    assert pvals[False] > ALPHA, pvals
    assert pvals[True] < ALPHA, pvals


def test_paste_puts_the_span_whole_inside_the_human_text_at_a_uniform_boundary() -> None:
    human = list(range(1000, 1030))
    span = [7, 8, 9, 10]
    rng = np.random.default_rng(3)
    starts = []
    for _ in range(3100):
        doc, a, b = paste_into(span, human, rng)
        assert len(doc) == len(human) + len(span) and b - a == len(span)
        assert doc[a:b] == span and doc[:a] + doc[b:] == human
        starts.append(a)
    counts = np.bincount(starts, minlength=len(human) + 1)
    assert stats.chisquare(counts).pvalue > ALPHA


def test_kept_windows_and_span_overlap() -> None:
    ids = list(range(40))
    assert kept_windows(ids, ids, 4) == 1.0
    assert kept_windows(ids, [t + 100 for t in ids], 4) == 0.0
    # one replacement in the middle breaks the h + 1 grams that hold it
    edited = [*ids[:20], 999, *ids[21:]]
    assert kept_windows(ids, edited, 4) == pytest.approx((36 - 5) / 36)
    assert span_iou([[10, 20, 0.001]], 10, 20) == 1.0
    assert span_iou([[15, 25, 0.001]], 10, 20) == pytest.approx(5 / 15)
    assert span_iou([[30, 40, 0.001]], 10, 20) == 0.0
    assert span_iou([], 10, 20) == 0.0


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "0.1", True, math.nan])
def test_a_bad_rate_is_a_one_line_error(bad: Any) -> None:
    with pytest.raises(BenchConfigError, match=r"must lie in \(0, 1\)") as exc:
        check_rate(bad)
    assert "\n" not in str(exc.value)
    with pytest.raises(BenchConfigError):
        replace_tokens([1, 2, 3], bad, 10, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"attacks": "replace,shuffle"}, "unknown attack"),
        ({"rates": "0.1,x"}, "--attack-rates must be comma-separated"),
        ({"rates": "0.1,2"}, "must lie in (0, 1)"),
        ({"spans": "8"}, "--span-tokens must be integers >= 16"),
        ({"human": "0"}, "--human-tokens must be positive"),
        ({"human": "1k"}, "comma-separated token counts"),
        ({"texts": 0}, "--attack-texts must be a positive integer"),
        ({"temperature": 0.0}, "--paraphrase-temperature"),
        ({"ptexts": 0}, "--paraphrase-texts must be a positive integer"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs: dict[str, Any], fragment: str) -> None:
    args = {
        "attacks": "all",
        "rates": "0.1,0.3",
        "spans": "64,256",
        "human": "1024",
        "texts": 4,
        "temperature": 0.7,
        **kwargs,
    }
    with pytest.raises(BenchConfigError) as exc:
        parse_settings(
            args["attacks"], args["rates"], args["spans"], args["human"], args["texts"],
            "qwen2.5-coder-0.5b", args["temperature"], args.get("ptexts"),
        )  # fmt: skip
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_settings_parse() -> None:
    s = parse_settings("replace, cut-paste", "0.1,0.5", "256", "1024,4096", 8, "p", 1.0)
    assert s.attacks == ("replace", "cut-paste") and s.rates == (0.1, 0.5)
    assert s.span_tokens == (256,) and s.human_tokens == (1024, 4096)
    assert parse_settings("all", "0.1", "64", "100", 1, "p", 1.0).attacks == ATTACKS


def test_cli_refuses_a_bad_rate_in_one_line_before_loading_a_model(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ersd.cli import main

    out = CliRunner().invoke(
        main,
        ["bench", "watermark", "attacks", "--out", str(tmp_path / "o"), "--attack-rates", "0.2,1.5",
         "--target", "no-such-model"],
    )  # fmt: skip
    assert out.exit_code == 2, out.output
    lines = [ln for ln in out.output.splitlines() if ln.startswith("Error")]
    assert len(lines) == 1 and "(0, 1)" in lines[0] and "no-such-model" not in out.output


def _records() -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [{"kind": "texts", "temperature": 1.0, "texts": 10}]
    for i in range(10):
        recs.append({"kind": "score", "temperature": 1.0, "attack": "none", "setting": "-",
                     "text": i, "tokens": 64, "p_model_free": 1e-6 if i < 9 else 0.5,
                     "p_weighted": 1e-8, "verdict_weighted": "watermarked",
                     "expected_power": 0.99})  # fmt: skip
        recs.append({"kind": "score", "temperature": 1.0, "attack": "replace", "setting": "30%",
                     "rate": 0.3, "text": i, "tokens": 64, "kept_windows": 0.2,
                     "p_model_free": 0.001 if i < 3 else 0.2, "p_weighted": 0.3,
                     "verdict_weighted": "not enough signal", "expected_power": 0.5})  # fmt: skip
        recs.append({"kind": "score", "temperature": 1.0, "attack": "cut-paste",
                     "setting": "64 in 1024", "text": i, "tokens": 1088, "span": [5, 69],
                     "iou": 0.9 if i < 8 else 0.0, "p_model_free": 0.5, "p_weighted": 0.02,
                     "p_scan": 1e-5 if i < 8 else 0.4})  # fmt: skip
        recs.append({"kind": "score", "temperature": 1.0, "attack": "human-only",
                     "setting": "1024 human tokens", "text": i, "tokens": 1024,
                     "p_model_free": 0.4, "p_weighted": 0.6, "p_scan": 1.0})  # fmt: skip
    return recs


def test_summary_rates_carry_clopper_pearson_intervals_and_the_table_shows_them() -> None:
    summary = summarize(_records())
    cells = {(c["attack"], c["setting"]): c for c in summary["cells"]}
    none = cells[("none", "-")]
    assert none["rate_model_free"]["k"] == 9 and none["rate_model_free"]["n"] == 10
    ci = stats.binomtest(9, 10).proportion_ci(0.95, method="exact")
    assert none["rate_model_free"]["ci95"] == pytest.approx([ci.low, ci.high])
    rep = cells[("replace", "30%")]
    assert rep["rate_model_free"]["k"] == 3 and rep["rate_weighted"]["k"] == 0
    assert rep["not_enough_signal"] == 10 and rep["median_kept_windows"] == 0.2
    cp = cells[("cut-paste", "64 in 1024")]
    assert cp["rate_scan"]["k"] == 8 and cp["span_found"]["k"] == 8
    assert cp["median_iou"] == pytest.approx(0.9)
    text = "\n".join(report_lines(summary))
    lo, hi = ci.low, ci.high
    assert f"0.90 [{lo:.2f}, {hi:.2f}]" in text
    assert "| 1 | cut-paste | 64 in 1024 | 10 | 1088 |" in text
    assert "False positives on the human chunks alone" in text
    assert "| 1 | 1024 | 10 | 0.00 [0.00, 0.31] |" in text
    # the order: none, the edits, cut-paste, then the control table
    assert text.index("| none |") < text.index("| replace |") < text.index("| cut-paste |")


def test_attacks_part_refuses_to_run_without_what_it_needs(tmp_path: Path) -> None:
    from ersd.bench.watermark import bench_watermark
    from ersd.bench.watermark_attacks import attacks_part

    class Model:
        vocab_size = 100

    with pytest.raises(BenchConfigError, match="paraphraser"):
        attacks_part({}, {}, Model(), None, bench_watermark(), AttackSettings(),
                     tmp_path / "a.jsonl")  # fmt: skip
    with pytest.raises(BenchConfigError, match="human text chunks"):
        attacks_part({}, {}, Model(), None, bench_watermark(),
                     AttackSettings(attacks=("cut-paste",)), tmp_path / "a.jsonl")  # fmt: skip


# --- end to end on SmolLM2 ------------------------------------------------------------------------


@pytest.mark.realmodel
@pytest.mark.usefixtures("one_torch_thread")
def test_attack_part_on_smollm2_end_to_end(tmp_path: Path) -> None:
    """Three watermarked texts at T = 1, every attack (SmolLM2 paraphrasing itself: the code path
    of the Qwen paraphraser), records as JSON lines, the report's table.  The edits and the
    paraphrase see the first 32 tokens; the texts are generated to 64 for the pasted span."""
    import ersd
    from ersd.bench import watermark as wb

    model = ersd.load_model("smollm2-135m", dtype="float32")
    settings = AttackSettings(
        attacks=ATTACKS, rates=(0.3,), span_tokens=(64,), human_tokens=(160,), texts=3,
        paraphraser="smollm2-135m", paraphrase_temperature=0.7, paraphrase_texts=2,
    )  # fmt: skip
    wb.run(["attacks"], tmp_path, target=model, tokenizer=model.tokenizer, temperatures=[1.0],
           max_new_tokens=32, batch_size=3, attacks=settings, paraphraser=model)  # fmt: skip
    recs = [json.loads(line) for line in (tmp_path / "attacks.jsonl").read_text().splitlines()]
    scored = [r for r in recs if r["kind"] == "score"]
    by = {a: [r for r in scored if r["attack"] == a] for a in {r["attack"] for r in scored}}
    assert set(by) == {"none", *ATTACKS, "human-only"}
    n = len(by["none"])
    assert n >= 2  # texts under 16 tokens (stopped at end-of-text) are left out, and counted
    assert all(len(by[a]) == n for a in ("replace", "insert", "delete"))
    assert len(by["paraphrase"]) == 2  # --paraphrase-texts 2: the first two texts
    for r in by["replace"]:
        assert r["tokens"] == r["tokens_in"] <= 32 and r["kept_windows"] < 1
    for r in by["insert"]:
        assert r["tokens"] == r["tokens_in"] + round(0.3 * r["tokens_in"])
    for r in by["delete"]:
        assert r["tokens"] == r["tokens_in"] - round(0.3 * r["tokens_in"])
    assert 1 <= len(by["cut-paste"]) <= n  # texts that stopped before 64 tokens have no span
    for r in by["cut-paste"]:
        a, b = r["span"]
        assert r["tokens"] == 160 + 64 and b - a == 64 and 0 <= a <= 160
        assert 0 <= r["iou"] <= 1 and 0 <= r["p_scan"] <= 1
    none = {r["text"]: r for r in by["none"]}
    for r in by["paraphrase"]:
        # the reply, re-encoded with the target's tokenizer, is what was scored
        assert r["paraphrase"] and r["tokens"] == len(encode_text(model.tokenizer, r["paraphrase"]))
        assert none[r["text"]]["tokens"] == r["tokens_in"] and 0 <= r["kept_windows"] <= 1
    for r in scored:
        assert 0 <= r["p_model_free"] <= 1 and 0 <= r["p_weighted"] <= 1
    summary = json.loads((tmp_path / "attacks.json").read_text())
    assert summary["settings"]["max_new_tokens"] == 32
    report = (tmp_path / "report.md").read_text()
    assert "## Attacks: TPR at 1% FPR" in report and "| 1 | paraphrase |" in report
    assert (tmp_path / "attacks.md").read_text().count("| 1 | replace | 30% |") == 1
