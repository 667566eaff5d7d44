"""``ersd theory``: tables and a figure of expected tokens per target call versus drafted tokens.

A thin layer over :mod:`ersd.theory` (curves, families, rank profiles, plot); no logic lives here.
"""

from __future__ import annotations

import json

import click

from ersd.methods.catalog import METHOD_NAMES

FAMILY_NAMES = ("zipf", "tempered", "sharp", "swap", "uniform", "dirichlet")
#: per-depth profiles stop at the first depth with fewer observations than this
MIN_DEPTH_COUNT = 20


@click.command()
@click.option(
    "--family",
    type=click.Choice(FAMILY_NAMES),
    default=None,
    help="Synthetic (p, q) family (default zipf); see docs/theory.md.",
)
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A recorded rank profile (JSON, ersd.theory.RankProfile.save): ERSD curves only.",
)
@click.option(
    "--per-depth",
    is_flag=True,
    help="With --profile: use the per-depth rank profile for the trees (bound: pooled).",
)
@click.option(
    "--vocab-size",
    type=click.IntRange(2, 20),
    default=8,
    show_default=True,
    help="Vocabulary size of the synthetic family.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the random families (zipf draft noise, dirichlet).",
)
@click.option(
    "--max-k",
    type=click.IntRange(1, 128),
    default=16,
    show_default=True,
    help="Largest number of drafted tokens per call.",
)
@click.option(
    "--methods",
    default=",".join(METHOD_NAMES),
    show_default=True,
    help="Comma-separated methods to compare (family mode).",
)
@click.option(
    "--out", type=click.Path(dir_okay=False), default=None, help="Write the figure (PNG) here."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Tables go to stderr; the last stdout line is a JSON object.",
)
def theory(
    family: str | None,
    profile_path: str | None,
    per_depth: bool,
    vocab_size: int,
    seed: int,
    max_k: int,
    methods: str,
    out: str | None,
    as_json: bool,
) -> None:
    """Expected tokens per target call versus k: chain, batch, M×L and optimal trees.

    For a synthetic family of (p, q) pairs every method is compared under the i.i.d. per-node
    model; for a recorded rank profile ERSD's curves are predicted.  The paper's bound
    (log|Ω| + log(k+1)) / H[R] and its asymptote log k / H[R] are printed and drawn.
    """
    from ersd.errors import ErsdError
    from ersd.theory import RankProfile
    from ersd.theory.curves import format_tables, pair_curves, profile_curves
    from ersd.theory.families import FAMILIES, family_pair

    log = (lambda msg: click.echo(msg, err=True)) if as_json else click.echo
    if family is not None and profile_path is not None:
        raise click.UsageError("give either --family or --profile, not both")
    if per_depth and profile_path is None:
        raise click.UsageError("--per-depth needs --profile (a recorded rank profile)")
    try:
        if profile_path is not None:
            prof = RankProfile.load(profile_path)
            vocab = prof.vocab_size or int(prof.counts.size)
            depth = prof.depth_rank_probs(min_count=MIN_DEPTH_COUNT) if per_depth else None
            curves = profile_curves(prof.rank_probs(), vocab, max_k, depth)
            source = {"profile": profile_path, "num_observations": prof.num_observations}
            title = f"rank profile {profile_path} ({prof.num_observations} ranks)"
            header = (
                f"rank profile {profile_path}: {prof.num_observations} ranks, |Ω| = {vocab}"
                + ("" if prof.vocab_size else " (vocab_size unknown: number of rank bins used)")
                + (f"\n  trees use per-depth P_R for {len(depth)} depths" if depth else "")
            )
        else:
            name = family or "zipf"
            wanted = [m.strip() for m in methods.split(",") if m.strip()]
            unknown = [m for m in wanted if m not in METHOD_NAMES]
            if unknown or not wanted:
                raise click.BadParameter(
                    f"unknown methods {unknown}; choose from {', '.join(METHOD_NAMES)}",
                    param_hint="--methods",
                )
            p, q = family_pair(name, vocab_size, seed)
            curves = pair_curves(p, q, max_k, wanted)
            source = {
                "family": name,
                "seed": seed,
                "target_probs": [round(float(x), 6) for x in p],
                "draft_probs": [round(float(x), 6) for x in q],
            }
            title = f"family {name!r}: {FAMILIES[name].description}"
            header = (
                f"family {name}: {FAMILIES[name].description}\n"
                f"  p = {[round(float(x), 3) for x in p]}\n"
                f"  q = {[round(float(x), 3) for x in q]}\n"
                f"  |Ω| = {vocab_size}, TV = {curves.info['tv']:.4f}, "
                f"KL(P||Q) = {curves.info['kl_nats']:.4f} nats"
            )
        log(header)
        log(
            f"  H[R] = {curves.rank_entropy_nats:.4f} nats (rank of the target's token in the "
            f"drafter's race)\n"
        )
        log(format_tables(curves))
        figure = None
        if out is not None:
            from ersd.theory.plot import plot_curves

            figure = str(plot_curves(curves, out, title))
            log(f"\nfigure: {figure}")
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({**source, **curves.to_dict(), "figure": figure}))
