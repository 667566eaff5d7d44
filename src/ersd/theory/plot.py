"""The ``ersd theory`` figure: expected tokens per target call versus drafted tokens ``k``.

Four panels (chain, batch, best M×L, optimal tree), one line per method, with the paper's bound
``(log|Ω| + log(k+1)) / H[R]`` and its asymptote ``log k / H[R]`` (ERSD's rank distribution) drawn
in every panel.  matplotlib is imported here only (Agg backend), never by ``import ersd.theory``.
"""

from __future__ import annotations

import math
from pathlib import Path

from ersd.methods.catalog import CATALOG
from ersd.theory.curves import Curves

_TITLES = {
    "chain": "chain:k (one draft sequence)",
    "batch": "batch:k (k siblings at the root)",
    "multi": "best multi:MxL (M, L ≥ 2, M·L ≤ k)",
    "optimal": "optimal k-node tree (i.i.d. ranks)",
}

_NOTES = {
    "chain": "one child per node: sd, specinfer, rrs-wor, spectr, spechub\n"
    "coincide (1 − TV per node); gls coincides with ersd",
    "optimal": "optimal trees exist for methods that try children in order\n("
    + ", ".join(m.name for m in CATALOG.values() if m.child_order and m.max_children != 1)
    + "; "
    + ", ".join(f"{m.name} = chain" for m in CATALOG.values() if m.max_children == 1)
    + ")",
}


def plot_curves(curves: Curves, path: str | Path, title: str = "") -> Path:
    """Write the 2×2 figure of ``curves`` to ``path`` (PNG) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = curves.ks
    finite = [x for d in curves.values.values() for v in d.values() for x in v if math.isfinite(x)]
    top = max(finite) if finite else 2.0
    y_max = max(top * 1.25, 2.0)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True, sharey=True)
    for ax, shape in zip(axes.flat, ("chain", "batch", "multi", "optimal"), strict=True):
        for method, by_shape in curves.values.items():
            ys = by_shape[shape]
            if not any(math.isfinite(y) for y in ys):
                continue
            ax.plot(
                ks,
                ys,
                marker="o",
                markersize=3,
                linewidth=2.2 if method == "ersd" else 1.4,
                color=CATALOG[method].colour if method in CATALOG else "black",
                label=method,
                zorder=3 if method == "ersd" else 2,
            )
        ax.plot(ks, curves.bound, "k--", linewidth=1.2, label="bound (log|Ω|+log(k+1))/H[R]")
        ax.plot(ks, curves.asymptote, ":", color="0.4", linewidth=1.2, label="asymptote log k/H[R]")
        off = [b for b in curves.bound if b > y_max]
        if off:
            ax.text(
                0.98,
                0.97,
                f"bound above the plot (≥ {min(off):.2f})",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=8,
                color="0.3",
            )
        if shape in _NOTES and len(curves.values) > 1:
            ax.text(
                0.98,
                0.03,
                _NOTES[shape],
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize=8,
                color="0.3",
            )
        ax.set_title(_TITLES[shape], fontsize=10)
        ax.set_ylim(0.9, y_max)
        ax.set_xlim(0.5, ks[-1] + 0.5)
        ax.grid(True, alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("drafted tokens per call k")
    for ax in axes[:, 0]:
        ax.set_ylabel("expected tokens per target call")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    for ax in axes.flat:
        h, lab = ax.get_legend_handles_labels()
        seen.update(zip(lab, h, strict=True))
    fig.legend(
        list(seen.values()),
        list(seen.keys()),
        loc="lower center",
        ncol=5,
        fontsize=9,
        frameon=False,
    )
    fig.suptitle(
        title + f"  (|Ω| = {curves.vocab_size}, H[R] = {curves.rank_entropy_nats:.3f} nats)",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
