"""``ersd bench pairs``: paired ratios of benchmark records (:mod:`ersd.bench.pairs`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ersd.bench.pairs import budget, label, pairs_report, runs_by_temperature
from ersd.cli import main


def _rec(method: str, tree: str | None, prompt: str, tokens: list[int], calls: int, tps: float):
    return {
        "kind": "result",
        "method": method,
        "tree": tree,
        "drafter": None,
        "prompt_id": prompt,
        "seed": 0,
        "temperature": 1.0,
        "tokens": tokens,
        "num_tokens": len(tokens),
        "target_calls": calls,
        "draft_forwards": calls * 2,
        "tokens_per_second": tps,
        "wall_time": 1.0,
    }


RECORDS = [
    _rec("sd", "chain:4", "a", [1, 2, 3, 4], 2, 4.0),
    _rec("ersd", "chain:4", "a", [5, 6, 7, 8], 4, 2.0),
    _rec("ersd", "dynamic:4", "a", [5, 6, 7, 8], 2, 3.0),
    _rec("sd", "chain:4", "b", [1, 2, 3, 4], 4, 2.0),
    _rec("ersd", "chain:4", "b", [9, 9, 9, 9], 2, 4.0),
    _rec("ersd", "dynamic:4", "b", [9, 9, 9, 9], 4, 2.0),
    {**_rec("ersd", "chain:4", "c", [1], 1, 1.0), "error": "boom"},  # failed runs are left out
]


def test_labels_budgets_and_grouping() -> None:
    assert label(RECORDS[0]) == "sd chain:4"
    assert (
        label({"method": "ersd", "tree": "chain:8", "drafter": "lookup"}) == "ersd chain:8 @lookup"
    )
    assert label({"method": "target-only", "tree": None}) == "target-only"
    assert [budget(n) for n in ("sd chain:8", "ersd dynamic:8@4", "ersd multi:2x3", "x")] == [
        8,
        8,
        6,
        None,
    ]
    runs = runs_by_temperature(RECORDS)
    assert list(runs) == [1.0] and len(runs[1.0]) == 2


def test_ratios_are_paired_per_run() -> None:
    out = pairs_report(RECORDS, ["sd chain:{k}"])
    # run a: ersd chain 1.0 tokens/call vs sd 2.0 -> 0.5; run b: 2.0 vs 1.0 -> 2.0; mean 1.25
    line = next(x for x in out.splitlines() if x.startswith("- ersd chain:4 ÷ sd chain:4"))
    assert "tokens/call 1.250" in line and "tokens/s 1.250" in line and "same text in 0" in line
    assert "(2 runs;" in line
    assert "every ERSD configuration gave one text in 2 of 2 runs" in out
    row = next(x for x in out.splitlines() if x.startswith("| ersd chain:4 |"))
    assert row.startswith("| ersd chain:4 | 2 | 1.50")  # the mean of 1.0 and 2.0 per call
    assert "| 1.33 | 2.00 |" in row  # pooled: 8 tokens in 6 calls; 2 draft forwards per call


def test_cli(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    ok = RECORDS[:-1]  # (a failed run's record makes the reader warn)
    path.write_text("".join(json.dumps(r) + "\n" for r in ok))
    res = CliRunner().invoke(main, ["bench", "pairs", str(path), "--against", "sd chain:{k}"])
    assert res.exit_code == 0, res.output
    assert res.output == pairs_report(ok, ["sd chain:{k}"])
    missing = CliRunner().invoke(main, ["bench", "pairs", str(tmp_path / "none.jsonl")])
    assert missing.exit_code != 0


@pytest.mark.parametrize("against", [["target-only"], []])
def test_no_reference_in_the_records_gives_the_table_only(against: list[str]) -> None:
    out = pairs_report(RECORDS, against)
    assert "÷" not in out and "| sd chain:4 |" in out
