"""Report section of dynamic ERSD trees: the acceptance predictor's calibration and the trees'
predicted vs measured tokens per call.

From the ``margin_events`` of dynamic runs (:mod:`ersd.bench.dynamic`): at every verified context
with drafted children, the predicted probability that the target's race winner is among them
(``Σ a_r`` over the drafted ranks) against whether it was, per margin bucket
(:func:`ersd.theory.margin.calibration_curve`, 95% Wilson intervals), per temperature; and per
dynamic configuration the mean predicted tokens per call (``expected_tokens``) against the
measured block efficiency, with the policy's share of step time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from ersd.theory.margin import calibration_curve


def _dynamic(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r.get("margin_events") is not None and "error" not in r]


def calibration_rows(results: list[dict[str, Any]]) -> dict[float, list[dict[str, Any]]]:
    """Per temperature: predicted vs observed acceptance by margin bucket."""
    by_temp: dict[float, list[tuple[float, float, float]]] = defaultdict(list)
    for r in _dynamic(results):
        for _depth, margin, rank, children, pred in r["margin_events"]:
            if children and pred is not None:
                m = math.inf if margin is None else float(margin)
                by_temp[float(r["temperature"])].append((m, pred, float(rank <= children)))
    return {t: calibration_curve(ev) for t, ev in sorted(by_temp.items()) if ev}


def tree_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (temperature, dynamic tree): predicted vs measured tokens per call, policy share."""
    acc: dict[tuple[float, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in _dynamic(results):
        a = acc[(float(r["temperature"]), str(r.get("tree")))]
        exp = [e for e in r.get("expected_tokens", []) if e is not None]
        a["runs"] += 1
        a["pred"] += sum(exp)
        a["pred_n"] += len(exp)
        a["tokens"] += r["num_tokens"]
        a["calls"] += r["target_calls"]
        a["policy"] += r.get("policy_time", 0.0)
        a["wall"] += r["wall_time"]
    rows = []
    for (t, tree), a in sorted(acc.items()):
        rows.append(
            {
                "temperature": t,
                "tree": tree,
                "runs": int(a["runs"]),
                "predicted_tokens_per_call": a["pred"] / a["pred_n"] if a["pred_n"] else None,
                "measured_tokens_per_call": a["tokens"] / a["calls"] if a["calls"] else None,
                "policy_share": a["policy"] / a["wall"] if a["wall"] else None,
            }
        )
    return rows


def markdown_section(results: list[dict[str, Any]], figure: str | None = None) -> str:
    """The dynamic-tree section of ``report.md`` ("" when no dynamic run is in the records)."""
    cal = calibration_rows(results)
    trees = tree_rows(results)
    if not cal and not trees:
        return ""
    out = ["## Dynamic ERSD trees", ""]
    if trees:
        out += [
            "Predicted tokens per call (1 + Σ predicted reach of each step's tree) against the "
            "measured block efficiency; the policy's share of wall time (choosing nodes, not the "
            "draft's races or forwards).",
            "",
            "| T | tree | runs | predicted tokens/call | measured tokens/call | policy share |",
            "|---|---|---|---|---|---|",
        ]
        for r in trees:
            out.append(
                f"| {r['temperature']:g} | {r['tree']} | {r['runs']} | "
                f"{_f(r['predicted_tokens_per_call'])} | {_f(r['measured_tokens_per_call'])} | "
                f"{_pct(r['policy_share'])} |"
            )
        out.append("")
    if cal:
        out += [
            "Calibration of the acceptance predictor: at verified contexts with drafted children, "
            "the predicted probability that the target's race winner is among them against the "
            "observed rate (95% Wilson interval), by bucket of the draft race's margin "
            "log(s2/s1).",
            "",
            "| T | margin | n | predicted | observed [95% CI] |",
            "|---|---|---|---|---|",
        ]
        for t, rows in cal.items():
            for r in rows:
                out.append(
                    f"| {t:g} | {r['bucket']} | {r['n']} | {r['predicted']:.3f} | "
                    f"{r['observed']:.3f} [{r['low']:.3f}, {r['high']:.3f}] |"
                )
        out.append("")
    if figure:
        out += [f"![predictor calibration]({Path(figure).name})", ""]
    return "\n".join(out)


def plot_calibration(results: list[dict[str, Any]], path: str | Path) -> Path | None:
    """Predicted vs observed acceptance per margin bucket (one series per temperature)."""
    cal = calibration_rows(results)
    if not cal:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
    for t, rows in cal.items():
        x = [r["predicted"] for r in rows]
        y = [r["observed"] for r in rows]
        err = [[r["observed"] - r["low"] for r in rows], [r["high"] - r["observed"] for r in rows]]
        ax.errorbar(x, y, yerr=err, fmt="o-", ms=4, capsize=2, label=f"T = {t:g}")
    ax.set_xlabel("predicted P(target's winner among drafted children)")
    ax.set_ylabel("observed rate")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_title("Dynamic ERSD: predictor calibration by margin bucket")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def write_section(
    results: list[dict[str, Any]], out_dir: str | Path
) -> tuple[str, dict[str, Path]]:
    """The markdown section and the figure written into ``out_dir`` (hook of the report)."""
    fig = plot_calibration(results, Path(out_dir) / "dynamic_calibration.png")
    section = markdown_section(results, str(fig) if fig else None)
    return section, ({"dynamic_calibration": fig} if fig else {})


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"
