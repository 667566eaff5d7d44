"""ERSD's draft sharpness ``beta``: the drafter races ``q**beta`` (``ersd.methods.ersd``).

Which tokens the drafter proposes never changes what ERSD emits (the target's race winners), so
every ``beta`` must keep the text equal to target-only race sampling (drafter invariance, chain,
multi-draft and dynamic trees) and the sequence law exact; a ``beta`` that matches how much
sharper the target is than its draft must raise acceptance (here to 100%: a target whose
probabilities are exactly ``q**beta``, normalised, has the sharpened race's winner as its own).
"""

from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

import ersd
from ersd.errors import GenerationInputError
from ersd.methods.base import NodeNoise
from ersd.methods.ersd import ERSD
from ersd.race import RaceNoise, race_winner
from tests.exactness_util import TableLM, make_drafts, make_target
from tests.test_exactness import ALPHA, sequence_law_test

PROMPT = [1, 2]
TARGET = make_target(6, seed=3)


@pytest.mark.parametrize("beta", [0.6, 1.3, 2.5])
@pytest.mark.parametrize("tree", ["chain:4", "multi:3x2", "dynamic:5"])
def test_any_sharpness_keeps_the_target_only_text(beta: float, tree: str) -> None:
    tmodel = TARGET.model()
    draft = make_drafts(TARGET, seed=7)["mild"].model()
    for seed in range(12):
        solo = ersd.generate(tmodel, None, PROMPT, max_new_tokens=12, seed=seed).tokens
        res = ersd.generate(
            tmodel,
            draft,
            PROMPT,
            max_new_tokens=12,
            seed=seed,
            method=ERSD(draft_sharpness=beta),
            tree=tree,
        )
        assert res.tokens == solo, (beta, tree, seed)


def test_sharpness_changes_the_drafts() -> None:
    """Not a no-op: over a few seeds some drafted token differs between beta = 1 and 2.5."""
    tmodel = TARGET.model()
    draft = make_drafts(TARGET, seed=7)["bad"].model()
    accepted = {}
    for beta in (1.0, 2.5):
        accepted[beta] = [
            ersd.generate(
                tmodel,
                draft,
                PROMPT,
                max_new_tokens=16,
                seed=s,
                method=ERSD(draft_sharpness=beta),
                tree="chain:3",
            ).num_accepted_tokens
            for s in range(20)
        ]
    assert accepted[1.0] != accepted[2.5]


def _sharpened_target(draft: TableLM, beta: float) -> TableLM:
    return TableLM(draft.table * beta)  # softmax(beta * l) is q**beta normalised


@pytest.mark.parametrize("beta", [1.5, 3.0])
def test_matched_sharpness_accepts_every_drafted_token(beta: float) -> None:
    draft = make_target(6, seed=9)
    tmodel = _sharpened_target(draft, beta).model()
    dmodel = draft.model()
    for seed in range(10):
        matched = ersd.generate(
            tmodel,
            dmodel,
            PROMPT,
            max_new_tokens=20,
            seed=seed,
            method=ERSD(draft_sharpness=beta),
            tree="chain:4",
        )
        assert matched.acceptance_rate == 1.0, (beta, seed)
    plain = [
        ersd.generate(
            tmodel, dmodel, PROMPT, max_new_tokens=20, seed=s, method="ersd", tree="chain:4"
        ).acceptance_rate
        for s in range(10)
    ]
    assert sum(plain) / len(plain) < 0.95


def test_rank_is_taken_in_the_sharpened_race() -> None:
    noise = NodeNoise(RaceNoise(50), key=1234)
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64) * 2, -1)
    for beta in (0.5, 1.0, 2.0):
        meth = ERSD(draft_sharpness=beta)
        best = meth.draft(q, 1, noise)[0]
        assert best == race_winner(q**beta / (q**beta).sum(), noise.exponentials())
        assert meth.rank(q, q, best, noise) == 1
        top = meth.draft(q, 5, noise)
        assert [meth.rank(q, q, t, noise) for t in top] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "1.3", True, None])
def test_bad_sharpness_is_refused(bad: object) -> None:
    with pytest.raises(GenerationInputError, match="draft_sharpness"):
        ERSD(draft_sharpness=bad)  # type: ignore[arg-type]


def test_repr_names_the_sharpness() -> None:
    assert repr(ERSD()) == "ERSD()"
    assert repr(ERSD(draft_sharpness=1.3)) == "ERSD(draft_sharpness=1.3)"


@pytest.mark.parametrize("shape", ["chain:3", "multi:2x2"])
def test_sequence_law_with_a_sharpened_draft(shape: str) -> None:
    """The statistical suite's chi-square test (its alpha, n and seeds) on ERSD with beta = 2."""
    draft = make_drafts(make_target(), seed=100)["mild"]
    res = sequence_law_test(ERSD(draft_sharpness=2.0), shape, "T1.0", draft, tag=("sharp", shape))
    assert res.pvalue >= ALPHA, f"ERSD(draft_sharpness=2) with {shape}: {res}"


def test_cli_refuses_sharpness_without_a_shared_race() -> None:
    from ersd.cli import main

    res = CliRunner().invoke(main, ["generate", "--method", "sd", "--draft-sharpness", "1.3", "hi"])
    assert res.exit_code == 2
    assert "--draft-sharpness 1.3" in res.output and "--method ersd" in res.output


def test_sharpness_fit_finds_the_sharpness_of_a_sharpened_target() -> None:
    """Calibration data (a chain drafted with beta = 1) scores every beta of the grid; the
    target's own sharpening (1.5) accepts every verified context, the others fewer."""
    from ersd.drafting import MarginRecorder
    from ersd.drafting.dynamic import SharpnessFit

    draft = make_target(6, seed=9)
    tmodel = _sharpened_target(draft, 1.5).model()
    fit = SharpnessFit(grid=(1.0, 1.25, 1.5, 2.0))
    recorder = MarginRecorder(draft.model(), fit=fit)
    for seed in range(8):
        ersd.generate(tmodel, recorder, PROMPT, max_new_tokens=16, seed=seed, tree="chain:3")
    assert fit.contexts == recorder.table.num_observations > 50
    rates = dict(zip(fit.grid, fit.rates(), strict=True))
    assert rates[1.5] == 1.0
    assert rates[1.0] < 0.95 and rates[2.0] < 1.0
    assert fit.best() == 1.5
    assert fit.to_dict()["best"] == 1.5


def test_sharpness_fit_refuses_a_bad_grid() -> None:
    from ersd.drafting.dynamic import SharpnessFit

    for grid in ((), (1.0, 0.0), (math.nan,)):
        with pytest.raises(GenerationInputError, match="sharpness grid"):
            SharpnessFit(grid=grid)


def test_bench_runs_ersd_with_the_configured_sharpness(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``run.draft_sharpness``: the run's ERSD rows (static and dynamic trees) and its
    calibration draft with it, the text stays target-only's, the calibration scores the grid."""
    import json

    from ersd.bench.config import config_from_dict
    from ersd.bench.running import run_bench
    from tests.test_bench_dynamic import _config

    data = _config(draft_sharpness=1.4, trees={"ersd": ["chain:3", "dynamic:4"]})
    out = tmp_path / "sharp.jsonl"
    run_bench(config_from_dict(data, source="sharp"), out, progress=False, log=lambda m: None)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["run"]["draft_sharpness"] == 1.4
    recs = [r for r in lines[1:] if r["kind"] == "result"]
    alone = {
        (r["prompt_id"], r["temperature"]): r["tokens"]
        for r in recs
        if r["method"] == "target-only"
    }
    ersd_rows = [r for r in recs if r["method"] == "ersd"]
    assert {r["tree"] for r in ersd_rows} >= {"chain:3", "dynamic:4"}
    for r in ersd_rows:
        assert r["tokens"] == alone[(r["prompt_id"], r["temperature"])]
    cal = json.loads(out.with_name("sharp.calibration.json").read_text())
    stats = cal["meta"]["stats"]["1.0"]
    assert stats["draft_sharpness"] == 1.4
    fit = stats["sharpness_fit"]
    assert fit["contexts"] > 0 and len(fit["acceptance"]) == len(fit["grid"])
    assert fit["best"] in fit["grid"]
