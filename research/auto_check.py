"""``tree="auto"`` against plain decoding and fixed trees on one backend (issue 30).

One process, one model pair, configurations interleaved (rotated per prompt) so that machine
drift hits them alike.  Cost curves come from the cost store (:mod:`ersd.cost_store`) or are
measured once before any timed run -- what a process pays on a machine it has not seen, reported
as ``measure_s`` -- and every timed ``auto`` run reports the time it spent finding out
(:attr:`ersd.GenerationResult.auto_finding_out`: measuring, exploring, a draft prefilled for an
exploring step).  Per category and temperature: ``auto ÷ plain`` and ``auto ÷ best fixed tree``
(the fixed tree with the highest mean rate in that category; and the harsher per-prompt best) as
means over prompts with Student-t 95% intervals.

``--control`` adds a second, identical plain configuration (``plain-b``) to the rotation: its
ratio to ``plain`` is what two runs of the same work differ by on this machine, the yardstick
for ``auto ÷ plain`` where auto drafts nothing.  Each cell also splits the difference between
auto and plain per token into the target's forwards (``target_ms/token``: the same forwards when
auto drafts nothing) and everything else a step does (``loop_ms/token``: choosing, verifying,
committing, drafting) -- auto's own cost, apart from the machine's noise in the forwards.

    python -m research.auto_check --backend llamacpp --threads 2 --tokens 96 \\
        --temperatures 0 1 --per-set 2 --fixed --out llamacpp.json
    python -m research.auto_check --backend hf --draft-dtype int8 --tokens 48 \\
        --temperatures 0 1 --per-set 2 --fixed chain:4 chain:6 --out hf.json
    python -m research.auto_check --backend llamacpp --threads 2 --tokens 96 --repeats 3 \\
        --temperatures 0 1 --per-set 2 --control --out llamacpp-control.json
    python -m research.auto_check --backend llamacpp --threads 2 --tokens 96 --batch 8 \\
        --repeats 3 --temperatures 0 1 --per-set 2 --out llamacpp-b8.json

``--old-auto REF`` adds ``auto-old`` to the rotation: ``auto`` as the library was at commit
``REF`` (``bd30beb^``: the code before issue 50's package), run in a subprocess of its own
(:class:`Worker`: the ``src`` of ``REF`` extracted with ``git archive``, the models loaded once,
each run asked for in turn) with its own copy of the cost store as this process prepared it (that
code writes every run's observations into its store, as it did then).  ``--auto-worker`` also
runs the current ``auto`` the same way (``auto-new``), so that new against old compares two
subprocesses alike.  Each cell then has ``auto/auto-old`` (and ``auto-new/auto-old``) and the
old code's draft forwards; ``checks`` lists issue 50's criteria per cell (auto ÷ the best fixed
tree ≥ 0.95 per category with ``--fixed``; on llama.cpp auto ÷ plain ≥ 0.98 with zero draft
forwards; new ÷ old not below 1 beyond its interval).

    python -m research.auto_check --backend hf --dtype float32 --draft-dtype int8 --tokens 96 \\
        --temperatures 0 1 --per-set 1 --fixed chain:4 chain:8 --old-auto 'bd30beb^' \\
        --out new-old.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SETS = ("humaneval", "mtbench", "math", "grounded")
REPO = Path(__file__).resolve().parents[1]
#: a line a worker writes for its parent (any other line on its stdout is the library's)
TAG = "@@auto_check "
#: the configurations run by a worker subprocess
WORKERS = ("auto-old", "auto-new")


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    import ersd

    if args.backend == "llamacpp":
        opts: dict[str, Any] = {"backend": "llamacpp", "threads": args.threads}
        return ersd.load_model(args.target, **opts), ersd.load_model(args.draft, **opts)
    target = ersd.load_model(args.target, dtype=args.dtype)
    return target, ersd.load_model(args.draft, dtype=args.draft_dtype or args.dtype)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ersd.auto import CurveCache, prepare_costs
    from ersd.bench.prompts import encode_prompt, load_prompts
    from ersd.tree import AutoTree

    target, draft = load(args)
    prompts = [p for s in args.sets for p in load_prompts([s], "eval", args.per_set)]
    encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
    # the curves measured here are kept in the store (a worker reads the same ones from its
    # copy); the timed runs only read it
    workers_wanted = bool(getattr(args, "old_auto", None) or getattr(args, "auto_worker", False))
    curves = CurveCache(learn=workers_wanted)
    t0 = time.perf_counter()
    prepare_costs(target, draft, encoded[0], args.batch, curves)
    setup: dict[str, Any] = {
        "measure_s": time.perf_counter() - t0,
        "measured": curves.measurements,
        "from_store": curves.store.hits if curves.store is not None else 0,
        "stale": curves.store.stale if curves.store is not None else 0,
    }
    if args.profile_tokens > 0 and curves.store is not None:
        # what `ersd models calibrate` stores: the pair's rank profiles (calibration prompts)
        from ersd.commands.models import _calibration_prompts, _rank_profile

        t1 = time.perf_counter()
        calib = _calibration_prompts(target, args.profile_prompts)
        for temp in args.temperatures:
            probs, trials = _rank_profile(target, draft, calib, temp, args.profile_tokens)
            curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
            setup[f"profile_T={temp:g}"] = [round(row[0], 3) for row in probs]
        setup["profile_s"] = time.perf_counter() - t1
    curves.learn = False  # a timed run writes nothing
    auto = AutoTree(costs=curves)
    with tempfile.TemporaryDirectory(prefix="auto_check-") as tmp:
        workers = start_workers(args, curves, encoded[0], setup, Path(tmp))
        try:
            configs = config_list(args, draft, auto, workers)
            rows = timed_runs(args, target, configs, prompts, encoded)
        finally:
            for w in workers.values():
                w.close()
    return {
        "args": vars(args),
        "setup": setup,
        "target": target.describe(),
        "draft": draft.describe(),
        "rows": rows,
        "summary": summarise(rows, list(args.fixed), args.backend),
    }


def timed_runs(
    args: argparse.Namespace,
    target: Any,
    configs: list[tuple[str, Any, Any]],
    prompts: list[Any],
    encoded: list[list[int]],
) -> list[dict[str, Any]]:
    """A warm-up of every configuration, then the timed runs in rotation."""
    import ersd

    eos = target.eos_token_ids or None
    for _, d, tree in configs:  # warm-up: every configuration once, untimed
        if isinstance(tree, Worker):
            tree.call(op="generate", prompt=encoded[0], tokens=4, temperature=1.0, seed=0)
            if args.batch > 1:
                tree.call(op="batch", prompts=encoded[: args.batch], tokens=4, temperature=1.0)
            continue
        ersd.generate(target, d, encoded[0], max_new_tokens=4, tree=tree, temperature=1.0)
        if args.batch > 1:
            group = encoded[: args.batch]
            ersd.generate_batch(target, d, group, max_new_tokens=4, tree=tree, temperature=1.0)
    if args.batch > 1:
        return run_batches(args, target, configs, encoded, eos)
    rows = []
    for i, temp, rep, (name, d, tree) in rotations(len(prompts), args, configs):
        p = prompts[i]
        stop = eos if args.eos else None
        if isinstance(tree, Worker):
            fields = tree.call(
                op="generate",
                prompt=encoded[i],
                tokens=args.tokens,
                temperature=temp,
                seed=i,
                eos=stop,
            )
        else:
            res = ersd.generate(
                target,
                d,
                encoded[i],
                max_new_tokens=args.tokens,
                tree=tree,
                temperature=temp,
                seed=i,
                eos_token_id=stop,
            )
            fields = single_fields(res)
        row = {
            "prompt": p.id,
            "set": p.set,
            "domain": p.domain,
            "temperature": temp,
            "repeat": rep,
            "config": name,
            **fields,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def single_fields(res: Any) -> dict[str, Any]:
    """What a row records of one ``ersd.generate`` result (any version of the library)."""
    return {
        "tokens": len(res.tokens),
        "seconds": res.wall_time,
        "rate": res.tokens_per_second,
        "target_s": res.target_time,
        "loop_s": res.wall_time - res.target_time,
        "target_calls": res.target_calls,
        "draft_forwards": res.draft_forwards,
        "auto_choices": getattr(res, "auto_choices", None) or None,
        "finding_out": getattr(res, "auto_finding_out", None),
        "trace": step_trace(res),
    }


#: the per-step fields of :func:`step_trace`, in order
TRACE_FIELDS = (
    "tree", "nodes", "accepted", "emitted", "draft_forwards", "target_s", "draft_s", "total_s",
    "predicted",
)  # fmt: skip


def step_trace(res: Any) -> list[list[Any]]:
    """One row per target call (:data:`TRACE_FIELDS`): what ``tree="auto"`` chose (or the
    drafted depth of a fixed tree), the tree's nodes, the accepted draft tokens, the tokens
    emitted, the draft forwards and the step's seconds, and auto's predicted tokens/s -- the
    per-step data a replay of a live run needs (the counts alone cannot say where a run lost
    its steps)."""
    rows = []
    for s in getattr(res, "steps", None) or []:
        choice = getattr(s, "choice", None) or {}
        rows.append(
            [
                choice.get("tree", f"depth:{s.tree_depth}"),
                s.num_draft_tokens,
                s.num_accepted,
                len(s.tokens),
                s.draft_forwards,
                round(s.target_time, 5),
                round(s.draft_time, 5),
                round(s.total_time, 5),
                choice.get("predicted"),
            ]
        )
    return rows


def batch_fields(out: list[Any], seconds: float) -> dict[str, Any]:
    """What a row records of one ``ersd.generate_batch`` call that took ``seconds``."""
    tokens = sum(len(r.tokens) for r in out)
    shares = [f for r in out if (f := getattr(r, "auto_finding_out", None))]
    choices: dict[str, int] = defaultdict(int)
    for r in out:
        for c, n in (getattr(r, "auto_choices", None) or {}).items():
            choices[c] += n
    return {
        "rows": len(out),
        "tokens": tokens,
        "seconds": seconds,
        "rate": tokens / seconds,
        "target_calls": max(r.target_calls for r in out),
        "draft_forwards": sum(r.draft_forwards for r in out),
        "auto_choices": dict(choices) or None,
        "finding_out": max(shares, key=lambda f: f.get("share", 0.0)) if shares else None,
    }


class WorkerError(RuntimeError):
    """A worker subprocess failed: it exited, or answered with an error."""


class Worker:
    """``auto`` run in a subprocess of its own (``--old-auto``, ``--auto-worker``): the library
    from ``src`` (first on its ``PYTHONPATH``), the cost store from ``store_dir`` (None: off),
    the models loaded once; :meth:`call` asks it for one run and returns that run's fields.
    The worker is this module's :func:`worker` (``--worker``)."""

    def __init__(
        self, name: str, src: Path, args: argparse.Namespace, store_dir: str | None
    ) -> None:
        self.name = name
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(src), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        env["ERSD_COST_STORE"] = store_dir if store_dir is not None else "off"
        cmd = [sys.executable, "-m", "research.auto_check", "--worker", *model_argv(args)]
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        hello = self._read()
        self.ersd_file = str(hello["ersd"])
        if not Path(self.ersd_file).resolve().is_relative_to(Path(src).resolve()):
            self.close()
            raise WorkerError(
                f"worker {name}: imported ersd from {self.ersd_file}, not from {src}; run "
                "without an installed copy of ersd shadowing PYTHONPATH"
            )

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                code = self.proc.wait()
                raise WorkerError(f"worker {self.name} exited with status {code} (see its stderr)")
            if line.startswith(TAG):
                msg = json.loads(line[len(TAG) :])
                if "error" in msg:
                    raise WorkerError(f"worker {self.name}: {msg['error']}")
                return msg

    def call(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def model_argv(args: argparse.Namespace) -> list[str]:
    """The model options of ``args`` as command-line arguments (for a worker)."""
    out = ["--backend", args.backend, "--target", args.target, "--draft", args.draft]
    out += ["--dtype", args.dtype]
    if args.draft_dtype:
        out += ["--draft-dtype", args.draft_dtype]
    if args.threads is not None:
        out += ["--threads", str(args.threads)]
    return out


def checkout_src(ref: str, into: Path) -> Path:
    """The ``src`` folder of commit ``ref`` of this repository, extracted under ``into``."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", ref, "src"],
            capture_output=True,
            check=True,
        ).stdout
    except subprocess.CalledProcessError as exc:
        msg = exc.stderr.decode(errors="replace").strip().splitlines()
        raise SystemExit(
            f"--old-auto {ref!r}: git archive failed ({msg[-1] if msg else exc}); give a commit "
            "of this repository, e.g. 'bd30beb^' (the code before issue 50's package)"
        ) from None
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into / "src"


def start_workers(
    args: argparse.Namespace, curves: Any, context: list[int], setup: dict[str, Any], tmp: Path
) -> dict[str, Worker]:
    """The worker configurations asked for (``--old-auto``, ``--auto-worker``), each with its
    own copy of the cost store as prepared so far (under ``tmp``, with the old checkout), its
    curves prepared before any timed run."""
    wanted: dict[str, Path] = {}
    if getattr(args, "old_auto", None):
        wanted["auto-old"] = checkout_src(args.old_auto, tmp / "old")
    if getattr(args, "auto_worker", False):
        import ersd

        wanted["auto-new"] = Path(ersd.__file__).resolve().parents[1]
    workers: dict[str, Worker] = {}
    try:
        for name, src in wanted.items():
            store_dir = None
            store = curves.store
            if store is not None and store.directory is not None:
                store_dir = str(tmp / f"store-{name}")
                if store.directory.exists():
                    shutil.copytree(store.directory, store_dir)
            w = Worker(name, src, args, store_dir)
            workers[name] = w
            t0 = time.perf_counter()
            got = w.call(op="prepare", context=context, batch=args.batch)
            setup[f"{name}_setup"] = {
                **got,
                "ersd": w.ersd_file,
                "prepare_s": time.perf_counter() - t0,
            }
    except BaseException:
        for w in workers.values():
            w.close()
        raise
    return workers


def worker(args: argparse.Namespace) -> None:
    """``--worker``: load the models, then answer the parent's requests (one JSON line each on
    stdin; each answer one line on stdout, tagged) with this process's ``ersd`` -- whichever
    version ``PYTHONPATH`` gives.  Uses only what every version since issue 30 has."""
    import ersd
    from ersd.auto import CurveCache, prepare_costs
    from ersd.tree import AutoTree

    out = sys.stdout

    def send(msg: dict[str, Any]) -> None:
        out.write(TAG + json.dumps(msg, default=str) + "\n")
        out.flush()

    target, draft = load(args)
    curves = CurveCache()
    auto = AutoTree(costs=curves)
    eos_ids = target.eos_token_ids or None
    send({"ersd": ersd.__file__})
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "exit":
                break
            if op == "prepare":
                prepare_costs(target, draft, req["context"], req["batch"], curves)
                store = curves.store
                send({"measured": curves.measurements, "from_store": store.hits if store else 0})
            elif op == "generate":
                res = ersd.generate(
                    target,
                    draft,
                    req["prompt"],
                    max_new_tokens=req["tokens"],
                    tree=auto,
                    temperature=req["temperature"],
                    seed=req.get("seed", 0),
                    eos_token_id=eos_ids if req.get("eos") else None,
                )
                send(single_fields(res))
            elif op == "batch":
                group = req["prompts"]
                t0 = time.perf_counter()
                res_b = ersd.generate_batch(
                    target,
                    draft,
                    group,
                    max_new_tokens=req["tokens"],
                    tree=auto,
                    temperature=req["temperature"],
                    seeds=list(range(len(group))),
                    eos_token_id=eos_ids if req.get("eos") else None,
                )
                send(batch_fields(res_b, time.perf_counter() - t0))
            else:
                send({"error": f"unknown op {op!r}"})
        except Exception as exc:  # the parent raises it, naming this worker
            send({"error": f"{type(exc).__name__}: {exc}"})


def config_list(
    args: argparse.Namespace, draft: Any, auto: Any, workers: dict[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """The compared configurations (name, draft, tree): plain, auto, the control (a second
    plain, with ``--control``), the workers' auto (``auto-old`` with ``--old-auto``,
    ``auto-new`` with ``--auto-worker``; the tree is the :class:`Worker`) and the fixed trees."""
    configs: list[tuple[str, Any, Any]] = [("plain", None, "chain:1"), ("auto", draft, auto)]
    if getattr(args, "control", False):
        configs.append(("plain-b", None, "chain:1"))
    workers = workers or {}
    if getattr(args, "old_auto", None):
        configs.append(("auto-old", draft, workers.get("auto-old")))
    if getattr(args, "auto_worker", False):
        configs.append(("auto-new", draft, workers.get("auto-new")))
    return configs + [(f, draft, f) for f in args.fixed]


def rotations(
    units: int, args: argparse.Namespace, configs: list[tuple[str, Any, Any]]
) -> Iterator[tuple[int, float, int, tuple[str, Any, Any]]]:
    """(unit, temperature, repeat, configuration) in run order: every configuration once per
    unit (a prompt, or a batch), temperature and repeat, the order rotated each time so that
    machine drift hits the configurations alike."""
    k = 0
    for i in range(units):
        for temp in args.temperatures:
            for rep in range(args.repeats):
                shift = k % len(configs)
                k += 1
                for config in configs[shift:] + configs[:shift]:
                    yield i, temp, rep, config


def run_batches(
    args: argparse.Namespace,
    target: Any,
    configs: list[tuple[str, Any, Any]],
    encoded: list[list[int]],
    eos: Any,
) -> list[dict[str, Any]]:
    """``--batch B``: the prompts in batches of B rows (every category in one batch when B
    covers them), each batch generated whole per configuration, rotated per repeat; a row of
    the output is one batch's run, its rate the batch's tokens over the call's wall time.  The
    repeats are the replicates of the summary's interval (machine noise, not prompts)."""
    import ersd

    rows: list[dict[str, Any]] = []
    eos_on = bool(eos) and bool(args.eos)
    batches = [encoded[j : j + args.batch] for j in range(0, len(encoded), args.batch)]
    for j, temp, rep, (name, d, tree) in rotations(len(batches), args, configs):
        group = batches[j]
        if isinstance(tree, Worker):
            fields = tree.call(
                op="batch", prompts=group, tokens=args.tokens, temperature=temp, eos=eos_on
            )
        else:
            t0 = time.perf_counter()
            out = ersd.generate_batch(
                target,
                d,
                group,
                max_new_tokens=args.tokens,
                tree=tree,
                temperature=temp,
                seeds=list(range(len(group))),
                eos_token_id=eos if args.eos else None,
            )
            fields = batch_fields(out, time.perf_counter() - t0)
        row = {
            "prompt": f"batch{j}/r{rep}",
            "set": f"batch{args.batch}",
            "domain": "mixed",
            "temperature": temp,
            "repeat": rep,
            "config": name,
            **fields,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's repeats on one prompt: the median rate, the mean finding-out share,
    the mean draft forwards, and 'cannot pay' if any repeat said so."""
    import statistics

    out = dict(runs[0])
    out["rate"] = statistics.median(r["rate"] for r in runs)
    for k in ("target_s", "loop_s"):
        if all(k in r for r in runs):
            out[k] = statistics.median(r[k] for r in runs)
    out["draft_forwards"] = sum(r["draft_forwards"] for r in runs) / len(runs)
    found = [r["finding_out"] for r in runs if r.get("finding_out")]
    if found:
        out["finding_out"] = {
            "share": sum(float(f.get("share", 0.0)) for f in found) / len(found),
            "can_pay": all(f.get("can_pay", True) for f in found),
        }
        if all("lost_share" in f for f in found):  # rows of runs before it was reported lack it
            out["finding_out"]["lost_share"] = sum(f["lost_share"] for f in found) / len(found)
    return out


def add(c: dict[str, list[float]], cfg: dict[str, dict[str, Any]], fixed: list[str]) -> None:
    """One prompt's runs into a summary cell."""
    a = cfg["auto"]
    c["auto/plain"].append(a["rate"] / cfg["plain"]["rate"])
    f = a["finding_out"] or {}
    c["finding_out_share"].append(float(f.get("share", 0.0)))
    if "lost_share" in f:
        c["finding_out_lost"].append(float(f["lost_share"]))
    c["cannot_pay"].append(0.0 if f.get("can_pay", True) else 1.0)
    c["draft_forwards"].append(float(a["draft_forwards"]))
    for name in fixed:
        c[f"rate:{name}"].append(cfg[name]["rate"])
    if fixed:
        c["auto/best-fixed(prompt)"].append(a["rate"] / max(cfg[n]["rate"] for n in fixed))
    c["rate:auto"].append(a["rate"])
    p = cfg["plain"]
    if "plain-b" in cfg:
        c["control/plain"].append(cfg["plain-b"]["rate"] / p["rate"])
    for k in ("target_s", "loop_s"):  # auto - plain, milliseconds per token
        if k in a and k in p:
            c[k].append(1e3 * (a[k] / a["tokens"] - p[k] / p["tokens"]))
    c["rate:plain"].append(p["rate"])
    for w in WORKERS:  # auto run by a worker (--old-auto, --auto-worker)
        if w in cfg:
            c[f"rate:{w}"].append(cfg[w]["rate"])
            c[f"{w}/plain"].append(cfg[w]["rate"] / p["rate"])
            c[f"{w}_draft_forwards"].append(float(cfg[w]["draft_forwards"]))
    if "auto-old" in cfg:
        c["auto/auto-old"].append(a["rate"] / cfg["auto-old"]["rate"])
        if "auto-new" in cfg:
            c["auto-new/auto-old"].append(cfg["auto-new"]["rate"] / cfg["auto-old"]["rate"])


def checks(cell_name: str, c: dict[str, list[float]], best: str | None, backend: str | None):
    """Issue 50's criteria for one cell: ``{criterion: True / False / None (n = 1: no
    interval)}``.  Auto ÷ the best fixed tree ≥ 0.95 in a category's mean (with fixed trees);
    on llama.cpp auto ÷ plain ≥ 0.98 in the mean with zero draft forwards; the new auto not
    below the old beyond its interval (the interval's upper end ≥ 1)."""
    from ersd.bench.stats import t_interval

    out: dict[str, bool | None] = {}
    if best is not None and not cell_name.startswith("all "):
        ratios = [x / y for x, y in zip(c["rate:auto"], c[f"rate:{best}"], strict=True)]
        out["auto/best-fixed mean >= 0.95"] = t_interval(ratios).mean >= 0.95
    if backend == "llamacpp":
        out["auto/plain mean >= 0.98"] = t_interval(c["auto/plain"]).mean >= 0.98
        out["auto draft forwards == 0"] = sum(c["draft_forwards"]) == 0
    for key in ("auto/auto-old", "auto-new/auto-old"):
        if c[key]:
            high = t_interval(c[key]).high
            out[f"{key} not below 1 beyond noise"] = None if high != high else high >= 1.0
    return out


def summarise(
    rows: list[dict[str, Any]], fixed: list[str], backend: str | None = None
) -> dict[str, Any]:
    from ersd.bench.stats import t_interval

    runs: dict[tuple[str, float, str], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in rows:  # a prompt's repeats of one configuration: merged (median rate)
        runs[(r["set"], r["temperature"], r["prompt"])][r["config"]].append(r)
    by = {key: {c: merged(rs) for c, rs in cfg.items()} for key, cfg in runs.items()}
    cells: dict[tuple[str, float], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (s, temp, _), cfg in by.items():
        for c in (cells[(s, temp)], cells[("all", temp)]):
            add(c, cfg, fixed)
    out: dict[str, Any] = {}
    for (s, temp), c in sorted(cells.items()):
        cell: dict[str, Any] = {
            "n": len(c["auto/plain"]),
            "auto/plain": t_interval(c["auto/plain"]).format(3),
            "auto/plain_min": min(c["auto/plain"]),
            "finding_out_share_mean": sum(c["finding_out_share"]) / len(c["finding_out_share"]),
            **(
                {"finding_out_lost_mean": sum(c["finding_out_lost"]) / len(c["finding_out_lost"])}
                if c["finding_out_lost"]
                else {}
            ),
            "cannot_pay_prompts": int(sum(c["cannot_pay"])),
            "auto_draft_forwards": int(sum(c["draft_forwards"])),
        }
        if c["control/plain"]:
            cell["control/plain"] = t_interval(c["control/plain"]).format(3)
            cell["control/plain_min"] = min(c["control/plain"])
        for k in ("target_s", "loop_s"):
            if c[k]:
                name = k.removesuffix("_s")
                cell[f"auto-plain {name}_ms/token"] = t_interval(c[k]).format(3)
        if fixed:
            means = {n: sum(c[f"rate:{n}"]) / len(c[f"rate:{n}"]) for n in fixed}
            best = max(means, key=lambda n: means[n])
            ratios = [a / b for a, b in zip(c["rate:auto"], c[f"rate:{best}"], strict=True)]
            cell["best_fixed"] = best
            cell["auto/best-fixed"] = t_interval(ratios).format(3)
            cell["auto/best-fixed(prompt)"] = t_interval(c["auto/best-fixed(prompt)"]).format(3)
        for w in WORKERS:
            if c[f"{w}/plain"]:
                cell[f"{w}/plain"] = t_interval(c[f"{w}/plain"]).format(3)
                cell[f"{w}_draft_forwards"] = int(sum(c[f"{w}_draft_forwards"]))
                if fixed:
                    old = [x / y for x, y in zip(c[f"rate:{w}"], c[f"rate:{best}"], strict=True)]
                    cell[f"{w}/best-fixed"] = t_interval(old).format(3)
        for key in ("auto/auto-old", "auto-new/auto-old"):
            if c[key]:
                cell[key] = t_interval(c[key]).format(3)
        name = f"{s} T={temp:g}"
        cell["checks"] = checks(name, c, cell.get("best_fixed"), backend)
        out[name] = cell
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["hf", "llamacpp"], default="hf")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft-dtype", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sets", nargs="+", default=list(SETS))
    ap.add_argument("--per-set", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--fixed", nargs="*", default=[], help="fixed trees to compare (e.g. chain:4)")
    ap.add_argument("--eos", action="store_true", help="stop at EOS (default: full length)")
    ap.add_argument(
        "--control",
        action="store_true",
        help="add a second plain configuration (plain-b) to the rotation: plain-b ÷ plain is "
        "the machine's noise on identical work, the yardstick for auto ÷ plain",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each configuration per prompt and temperature (rotated; a prompt's "
        "rate is the median of its repeats)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=1,
        help="rows per batch (> 1: the prompts run as batches through ersd.generate_batch; "
        "the interval is then over --repeats, not prompts)",
    )
    ap.add_argument(
        "--profile-tokens",
        type=int,
        default=0,
        help="first store the pair's rank profiles (as `ersd models calibrate`) from this many "
        "tokens of each calibration prompt per temperature (0: use what the store holds; "
        "`ersd models calibrate` takes 48)",
    )
    ap.add_argument(
        "--profile-prompts",
        type=int,
        default=2,
        help="calibration prompts of the stored profile (as `ersd models calibrate --prompts`, "
        "whose default this is: code, then chat, then maths; runs before 2026-12-05 took 1)",
    )
    ap.add_argument(
        "--old-auto",
        default=None,
        metavar="REF",
        help="add auto as it was at commit REF (e.g. 'bd30beb^', before issue 50's package) "
        "to the rotation, as auto-old, run in a subprocess from that commit's src",
    )
    ap.add_argument(
        "--auto-worker",
        action="store_true",
        help="also run the current auto in a subprocess (auto-new), as auto-old is: new "
        "against old then compares two subprocesses alike",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--from-log",
        type=Path,
        default=None,
        help="summarise the rows a (cut) run printed instead of running",
    )
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.out is None:
        ap.error("--out FILE is required (where the rows and the summary are written)")
    if args.from_log is not None:
        rows = []
        for line in args.from_log.read_text().splitlines():
            if line.startswith('{"prompt"'):
                rows.append(json.loads(line))
        done = {(r["prompt"], r["temperature"]) for r in rows if r["config"] == "auto"}
        complete = [
            r
            for r in rows
            if (r["prompt"], r["temperature"]) in done
            and sum(
                1
                for q in rows
                if (q["prompt"], q["temperature"]) == (r["prompt"], r["temperature"])
            )
            == len(config_list(args, None, None)) * args.repeats
        ]
        summary = {
            "rows": complete,
            "summary": summarise(complete, list(args.fixed), args.backend),
        }
        args.out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
        print(json.dumps(summary["summary"], indent=1))
        return
    result = run(args)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({"setup": result["setup"], "summary": result["summary"]}, indent=1))


if __name__ == "__main__":
    main()
