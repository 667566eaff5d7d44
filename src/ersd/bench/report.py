"""``ersd bench report``: JSONL records → markdown tables with 95% intervals, and PNG figures.

Aggregation unit: one **configuration** = (temperature, method, tree, budget k).  For each
configuration every metric is first averaged over seeds within a prompt, then summarised over
prompts with a Student-t 95% interval (:func:`ersd.bench.stats.t_interval`; prompts are the
independent units).  Speedups are per-(prompt, temperature, seed) ratios of tokens/s against the
two target-only baselines run on the same prompt, temperature and seed in the same process:

* ``speedup`` — against plain target-only decoding (one-token forwards);
* ``speedup vs 2-tok`` — against target-only decoding that pays a two-token forward per token
  (the cheaper CPU kernel; see :mod:`ersd.bench.baselines`), the honest denominator on CPUs.

Theory next to measurement (ERSD): the expected block efficiency of the run's tree under the
i.i.d.-rank model with the calibrated per-depth profile, the gap (measured − predicted), and the
paper's upper bound ``(log|Ω| + log(k+1)) / H[R]``.  For trees chosen by the cost model the
predicted speedup is shown with the measured/predicted ratio.

:mod:`ersd.bench.aggregate` builds the rows, :mod:`ersd.bench.markdown` the tables and
:mod:`ersd.bench.plots` the figures; :func:`write_report` ties them together.  Batched runs
(``run.batch_sizes``) get their own section: throughput per batch size, the time split and a plot
of total tokens/s against batch size (:mod:`ersd.bench.batch_report`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ersd.bench.aggregate import (
    ersd_vs_hf,
    rank_dependence,
    read_all,
    row_dict,
    summarise,
)
from ersd.bench.batch_report import batch_markdown, batch_row_dict, summarise_batches
from ersd.bench.markdown import markdown, run_header
from ersd.bench.plots import plot_batch_throughput, plot_block_efficiency, plot_speedup


def write_report(paths: Sequence[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Read records, write ``report.md``, ``summary.json`` and PNG figures into ``out_dir``
    (with batch records also ``batch_summary.json`` and ``batch_throughput.png``)."""
    metas, results, batches = read_all(paths)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs: dict[str, Path] = {}
    parts: list[str] = []
    rows = summarise(results, metas) if results else []
    if results:
        figs = {
            "block_efficiency": out / "block_efficiency_vs_k.png",
            "speedup": out / "speedup.png",
        }
        plot_block_efficiency(rows, figs["block_efficiency"])
        plot_speedup(rows, figs["speedup"])
        from ersd.bench.margin_report import write_section  # dynamic trees (empty without them)

        dynamic_md, dynamic_figs = write_section(results, out)
        parts.append(
            markdown(
                rows,
                metas,
                [str(f) for f in figs.values()],
                ersd_vs_hf(results, rows),
                rank_dependence(results),
            )
            + (("\n" + dynamic_md) if dynamic_md else "")
        )
        figs.update(dynamic_figs)
    else:
        parts.append(run_header(metas))
    extra: dict[str, Path] = {}
    if batches:
        brows = summarise_batches(batches)
        figs["batch_throughput"] = out / "batch_throughput.png"
        plot_batch_throughput(brows, figs["batch_throughput"])
        parts.append(batch_markdown(brows, figs["batch_throughput"].name))
        extra["batch_summary"] = out / "batch_summary.json"
        extra["batch_summary"].write_text(
            json.dumps([batch_row_dict(r) for r in brows], indent=1) + "\n"
        )
    md = out / "report.md"
    md.write_text("\n".join(parts))
    summary = out / "summary.json"
    summary.write_text(json.dumps([row_dict(r) for r in rows], indent=1) + "\n")
    return {"report": md, "summary": summary, **extra, **figs}
