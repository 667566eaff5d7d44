"""Benchmark configurations: small TOML files, validated into a :class:`BenchConfig`.

A config names the models, the prompt sets, the sampling settings and which methods, budgets and
baselines to run.  Bundled configs live in ``ersd/configs/`` and are found by bare name
(``qwen-quick``); any other path is read as a file.  A ``[quick]`` table holds overrides applied by
``--quick`` (same sections and keys as the main file).  Unknown keys and bad values raise
:class:`BenchConfigError`, whose message names the key and the fix.
"""

from __future__ import annotations

import copy
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ersd.bench.errors import BenchConfigError
from ersd.errors import ErsdError

#: baseline names understood by the runner (``hf-generate``: plain Hugging Face ``generate`` of the
#: target, batched and left-padded at batch sizes > 1: :func:`ersd.bench.baselines.hf_generate`)
BASELINES = ("target-only", "target-only-2tok", "hf-assisted", "hf-prompt-lookup", "hf-generate")
#: the baselines a config runs when it lists none
DEFAULT_BASELINES = ("target-only", "target-only-2tok", "hf-assisted", "hf-prompt-lookup")
#: the baselines that run batched (``run.batch_sizes`` beyond [1]: :mod:`ersd.bench.batching`)
BATCH_BASELINES = ("target-only", "hf-generate")
#: prompt sets shipped in ``ersd/data`` (see its PROVENANCE.md)
PROMPT_SETS = ("humaneval", "mtbench", "math", "grounded")

# methods that grow `dynamic:K` trees (ERSD from its race, the others from draft confidence)
DYNAMIC_METHODS = ("ersd", "sd", "specinfer", "spectr")


@dataclass
class ModelsConfig:
    target: str = "qwen2.5-coder-1.5b"
    draft: str = "qwen2.5-coder-0.5b"
    dtype: str = "bfloat16"
    draft_dtype: str = ""  # "" = same as dtype; "int8" (CPU): a dynamically quantized draft
    linear: str = "auto"  # float32 CPU linears: auto/onednn (prepacked weights) or torch (stock)
    device: str = "cpu"
    threads: int = 0  # torch threads; 0 = leave torch's default
    draft_layers: int = 0  # > 0: keep only the draft's first N layers (a layer-truncated draft)


@dataclass
class PromptsConfig:
    sets: list[str] = field(default_factory=lambda: ["humaneval"])
    count: int = 4  # evaluation prompts per set (the first ``count`` of its eval split)
    calib_count: int = 4  # calibration prompts per set (its calib split)
    template: str = "auto"  # auto (code raw, others chat), raw, chat
    max_prompt_tokens: int = 512  # longer prompts keep their last tokens
    file: str = ""  # a user's prompt file, run after the sets (ersd.bench.drafters)


@dataclass
class RunConfig:
    max_new_tokens: int = 48
    temperatures: list[float] = field(default_factory=lambda: [1.0])
    seeds: list[int] = field(default_factory=lambda: [0])
    budgets: list[int] = field(default_factory=lambda: [4, 8])
    methods: list[str] = field(default_factory=lambda: ["ersd", "sd"])
    shapes: str = "natural"  # natural | minimal | chain (see ersd.bench.trees.natural_shapes)
    trees: dict[str, list[str]] = field(default_factory=dict)  # extra tree specs per method
    optimal: bool = True  # ERSD with optimal:K (K = each budget) from the rank profile
    cost_aware: bool = True  # ERSD with the cost-aware tree from the profile and cost curves
    baselines: list[str] = field(default_factory=lambda: list(DEFAULT_BASELINES))
    warmup_tokens: int = 4
    # ERSD's drafter races q**draft_sharpness (ersd.methods.ersd; 1 = the paper's rule), in the
    # run and in its calibration
    draft_sharpness: float = 1.0
    stop_at_eos: bool = False  # False: every run makes exactly max_new_tokens tokens
    profile: str = ""  # calibration file; "" = calibrate in the run when a profile is needed
    drafters: list[str] = field(default_factory=list)  # drafter specs: lookup, lookup+draft, ...
    # prompts generated together per run; beyond [1] every run is a batch (ersd.bench.batching)
    batch_sizes: list[int] = field(default_factory=lambda: [1])


@dataclass
class CalibrateConfig:
    temperatures: list[float] = field(default_factory=lambda: [1.0])
    max_new_tokens: int = 64
    tree: str = "chain:8"
    cost_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    cost_repeats: int = 3
    max_candidate_nodes: int = 24


@dataclass
class BenchConfig:
    name: str
    description: str = ""
    models: ModelsConfig = field(default_factory=ModelsConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    run: RunConfig = field(default_factory=RunConfig)
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


_SECTIONS: dict[str, type] = {
    "models": ModelsConfig,
    "prompts": PromptsConfig,
    "run": RunConfig,
    "calibrate": CalibrateConfig,
}


def bundled_configs() -> list[str]:
    """Names of the configs shipped in ``ersd/configs``."""
    folder = resources.files("ersd") / "configs"
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )


def _read(name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    p = Path(name_or_path)
    if p.is_file():
        text, source = p.read_text(), str(p)
    else:
        bundled = resources.files("ersd") / "configs" / f"{name_or_path}.toml"
        if not bundled.is_file():
            raise BenchConfigError(
                f"benchmark config {str(name_or_path)!r} is neither a file nor a bundled config; "
                f"bundled configs: {', '.join(bundled_configs())} (or give a path to a .toml file)"
            )
        text, source = bundled.read_text(), f"ersd/configs/{name_or_path}.toml"
    try:
        return tomllib.loads(text), source
    except tomllib.TOMLDecodeError as exc:
        raise BenchConfigError(f"{source} is not valid TOML: {exc}") from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, val in over.items():
        if isinstance(val, dict) and isinstance(out.get(key), dict) and key != "trees":
            out[key] = _merge(out[key], val)
        else:
            out[key] = copy.deepcopy(val)
    return out


def _type_name(t: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        t, str(t)
    )


def _check_value(where: str, key: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of the default; ints are accepted for floats."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise BenchConfigError(f"{where}.{key} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise BenchConfigError(f"{where}.{key} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BenchConfigError(f"{where}.{key} must be a number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise BenchConfigError(f"{where}.{key} must be a string (in quotes), got {value!r}")
        return value
    if isinstance(default, dict):
        if not isinstance(value, dict) or not all(
            isinstance(v, list) and all(isinstance(s, str) for s in v) for v in value.values()
        ):
            raise BenchConfigError(
                f"{where}.{key} must be a table of string lists, e.g. {key} = {{ ersd = "
                f'["paths:[[0],[1],[0,0]]"] }}'
            )
        return {str(k): list(v) for k, v in value.items()}
    if isinstance(default, list):
        if not isinstance(value, list):
            raise BenchConfigError(
                f"{where}.{key} must be a list in square brackets, e.g. {key} = {default!r}"
            )
        elem = type(default[0]) if default else str
        return [_check_value(where, f"{key}[{i}]", v, elem()) for i, v in enumerate(value)]
    return value


def _section(where: str, cls: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise BenchConfigError(f"[{where}] must be a table")
    obj = cls()
    known = list(obj.__dataclass_fields__)
    for key, value in data.items():
        if key not in known:
            raise BenchConfigError(
                f"unknown key {key!r} in [{where}]; known keys: {', '.join(known)}"
            )
        setattr(obj, key, _check_value(where, key, value, getattr(obj, key)))
    return obj


def _validate(cfg: BenchConfig) -> None:
    from ersd.methods import METHODS

    m, p, r, c = cfg.models, cfg.prompts, cfg.run, cfg.calibrate
    if m.dtype not in ("float32", "bfloat16", "float16"):
        raise BenchConfigError(
            f"models.dtype {m.dtype!r} is not supported; use 'bfloat16' (speed) or 'float32'"
        )
    if m.draft_dtype not in ("", "float32", "bfloat16", "float16", "int8"):
        raise BenchConfigError(
            f"models.draft_dtype {m.draft_dtype!r} is not supported; use '' (same as dtype), "
            "'int8' (CPU: dynamic int8 quantization), 'bfloat16' or 'float32'"
        )
    from ersd.models.cpu import LINEAR_MODES

    if m.linear not in LINEAR_MODES:
        raise BenchConfigError(
            f"models.linear {m.linear!r} is not supported; use one of {LINEAR_MODES}"
        )
    if m.threads < 0 or m.draft_layers < 0:
        raise BenchConfigError(
            "models.threads and models.draft_layers must be >= 0 (0 = the default)"
        )
    for s in p.sets:
        if s not in PROMPT_SETS:
            raise BenchConfigError(
                f"prompts.sets holds unknown set {s!r}; known sets: {', '.join(PROMPT_SETS)}"
            )
    if not p.sets and not p.file:
        raise BenchConfigError(f"prompts.sets is empty; list at least one of {PROMPT_SETS}")
    if p.count < 1 or p.calib_count < 0:
        raise BenchConfigError("prompts.count must be >= 1 and prompts.calib_count >= 0")
    if p.template not in ("auto", "raw", "chat"):
        raise BenchConfigError(
            f"prompts.template {p.template!r} must be 'auto' (code raw, chat/math with the chat "
            "template), 'raw' or 'chat'"
        )
    if r.max_new_tokens < 1 or c.max_new_tokens < 1:
        raise BenchConfigError("run.max_new_tokens and calibrate.max_new_tokens must be >= 1")
    for t in [*r.temperatures, *c.temperatures]:
        if not t >= 0:
            raise BenchConfigError(f"temperature {t} must be >= 0 (0 = greedy)")
    if not r.temperatures or not r.seeds:
        raise BenchConfigError("run.temperatures and run.seeds need at least one value each")
    if any(t <= 0 for t in c.temperatures) or not c.temperatures:
        raise BenchConfigError(
            "calibrate.temperatures must be > 0: ranks are recorded only when sampling (the T=0 "
            "runs reuse the profile of the lowest calibrated temperature)"
        )
    for k in r.budgets:
        if k < 1:
            raise BenchConfigError(f"run.budgets holds {k}; draft budgets must be >= 1 tokens")
    for name in [*r.methods, *r.trees]:
        if name not in METHODS:
            raise BenchConfigError(
                f"unknown method {name!r} in [run]; known methods: {', '.join(sorted(METHODS))}"
            )
    if r.shapes not in ("natural", "minimal", "chain"):
        raise BenchConfigError(
            f"run.shapes {r.shapes!r} must be 'natural' (chain, M×L and trees per method), "
            "'minimal' (one or two shapes per method and budget) or 'chain' (chain:K only)"
        )
    for b in r.baselines:
        if b not in BASELINES:
            raise BenchConfigError(
                f"unknown baseline {b!r} in run.baselines; known: {', '.join(BASELINES)}"
            )
    from ersd.bench.drafters import check_drafter_spec

    for spec in r.drafters:
        check_drafter_spec(spec)
    if r.warmup_tokens < 0:
        raise BenchConfigError("run.warmup_tokens must be >= 0")
    if not math.isfinite(r.draft_sharpness) or r.draft_sharpness <= 0:
        raise BenchConfigError(
            f"run.draft_sharpness must be a number > 0 (1 = ERSD's own draft race), got "
            f"{r.draft_sharpness!r}"
        )
    if c.cost_repeats < 1 or not c.cost_sizes or any(s < 1 for s in c.cost_sizes):
        raise BenchConfigError(
            "calibrate.cost_sizes must list forward sizes >= 1 and cost_repeats must be >= 1"
        )
    from ersd.drafting.dynamic import parse_dynamic
    from ersd.tree_spec import parse_tree

    for method, specs in r.trees.items():
        for spec in specs:
            try:
                dynamic = parse_dynamic(spec) is not None
            except ErsdError as exc:
                raise BenchConfigError(f"run.trees.{method}: {exc}") from None
            if dynamic and method not in DYNAMIC_METHODS:
                raise BenchConfigError(
                    f"run.trees.{method}: {spec!r} is a dynamic tree, which only "
                    f"{', '.join(DYNAMIC_METHODS)} grow (ERSD from the draft's race, the others "
                    "from the draft's confidence); list it under one of them"
                )
            if dynamic and method != "ersd" and spec.startswith("dynamic-cost"):
                raise BenchConfigError(
                    f"run.trees.{method}: {spec!r}: the cost-aware dynamic tree is ERSD's only; "
                    "use dynamic:K for the baselines"
                )
            if not dynamic and spec != "auto" and not spec.startswith(("optimal:", "cost-aware")):
                try:
                    parse_tree(spec)
                except ErsdError as exc:
                    raise BenchConfigError(f"run.trees.{method}: {exc}") from None
    try:
        parse_tree(c.tree)
    except ErsdError as exc:
        raise BenchConfigError(f"calibrate.tree: {exc}") from None
    _validate_batch(cfg)


def _validate_batch(cfg: BenchConfig) -> None:
    """``run.batch_sizes``: sizes >= 1, no repeats; batch runs take only what can run batched."""
    r = cfg.run
    sizes = r.batch_sizes
    if not sizes or any(b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
        raise BenchConfigError(
            f"run.batch_sizes {sizes!r} must list distinct batch sizes >= 1, e.g. [1, 4, 8]"
        )
    if sizes == [1]:
        return
    extra = [b for b in r.baselines if b not in BATCH_BASELINES]
    if extra:
        raise BenchConfigError(
            f"run.baselines lists {extra[0]!r}, which does not run batched; with run.batch_sizes "
            f"{sizes} the baselines can be {', '.join(BATCH_BASELINES)} (remove {extra[0]!r})"
        )
    if r.drafters:
        raise BenchConfigError(
            "run.drafters (model-free / hybrid drafters) do not run batched; remove them or set "
            "run.batch_sizes = [1]"
        )
    from ersd.drafting.dynamic import parse_dynamic

    dyn = [s for specs in r.trees.values() for s in specs if parse_dynamic(s) is not None]
    if dyn:
        raise BenchConfigError(
            f"run.trees: {dyn[0]!r} is a dynamic tree, which does not run batched; remove it or "
            "set run.batch_sizes = [1]"
        )


def config_from_dict(data: dict[str, Any], *, quick: bool = False, source: str = "") -> BenchConfig:
    """Validate a parsed TOML document (``quick`` applies its ``[quick]`` overrides)."""
    data = dict(data)
    overrides = data.pop("quick", None)
    if quick:
        if overrides is None:
            raise BenchConfigError(
                f"--quick: config {source or '(dict)'} has no [quick] table of overrides; add "
                "one (e.g. [quick.run] budgets = [4]) or drop --quick"
            )
        data = _merge(data, overrides)
    cfg = BenchConfig(name=str(data.pop("name", Path(source).stem or "bench")), source=source)
    cfg.description = str(data.pop("description", ""))
    for key, value in data.items():
        if key not in _SECTIONS:
            raise BenchConfigError(
                f"unknown top-level key {key!r} in {source or 'config'}; known: name, "
                f"description, {', '.join(_SECTIONS)}, quick"
            )
        setattr(cfg, key, _section(key, _SECTIONS[key], value))
    if quick:
        cfg.name += "+quick"
    _validate(cfg)
    return cfg


def load_config(name_or_path: str | Path, *, quick: bool = False) -> BenchConfig:
    """Read and validate a benchmark config (bundled name or file path)."""
    data, source = _read(name_or_path)
    return config_from_dict(data, quick=quick, source=source)
