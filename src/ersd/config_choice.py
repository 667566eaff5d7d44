"""Which PyTorch configuration to run a target/draft pair in: chosen by measurement, not CPU flags.

A configuration is a target dtype, a draft dtype and a draft tree.  :func:`choose_config` picks,
among :data:`CANDIDATES`, the one of highest predicted tokens/s that **keeps ERSD's identity on
this machine** (ERSD's text equals target-only sampling whatever the drafter):

* **identity** is what :func:`ersd.precision.check_tree_identity` measured for the target
  in that dtype on this machine (kept in :class:`~ersd.precision.IdentityRecords`, beside
  the cost store; ``ersd generate`` checks and records it before every ERSD run).  A target whose
  tree rows equal its one-token rows, or differ by float32 rounding order only (at most
  :data:`ROUNDING_TOLERANCE` in the logits), is eligible; one whose rows differ by more (bfloat16
  with a width-dependent GEMM: ~0.5 on SmolLM2 on an AMX Xeon) is not: its races flip at near
  ties.  A bfloat16 target never checked on this machine is not eligible either (run once with
  ``--dtype bfloat16``: the check is recorded).  The float32 target is eligible until a check
  says otherwise (it is checked before the run anyway).
* **speed** is predicted from the cost curves ``ersd models calibrate`` (or ``tree="auto"``)
  stored for both models in that configuration (:class:`ersd.cost_store.CostStore`) and the
  pair's stored rank profile at the temperature (another candidate's profile, else a nominal
  one, when the pair has none): :func:`ersd.costs.predict` of the candidate's tree, or of the
  best tree among :func:`ersd.costs.candidate_trees` when a profile is stored.
* With no measurement for an eligible candidate, the choice is the **invariant default**
  (float32 target with prepacked linears <- int8 draft, ``chain:6``) and the reason says which
  ``ersd models calibrate`` command would measure the others.

Nothing here reads ``/proc/cpuinfo``: the same code picks bfloat16 on a CPU where its kernels
keep tree rows equal to one-token rows and it is faster, and float32 elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: largest logit difference between a tree row and a one-token row taken as float32 rounding
#: order (measured 4e-5 - 6e-5 for float32 SmolLM2 on an AMX Xeon; bfloat16 differs by ~0.5)
ROUNDING_TOLERANCE = 1e-3
#: per-depth rank probabilities used when no rank profile is stored (P(rank 1) = 0.6, ...)
NOMINAL_PROFILE: list[list[float]] = [[0.6, 0.12, 0.05, 0.03]] * 8


@dataclass(frozen=True)
class Candidate:
    name: str
    dtype: str
    draft_dtype: str
    tree: str
    #: llama.cpp only: the target's batch policy (``"exact"`` keeps tree rows equal to one-token
    #: rows; ``"fast"`` is llama.cpp's own repacked weights, run target-only)
    batch_policy: str | None = None


#: the configurations considered, the invariant default first
CANDIDATES: tuple[Candidate, ...] = (
    Candidate("float32 <- int8", "float32", "int8", "chain:6"),
    Candidate("bfloat16 <- bfloat16", "bfloat16", "bfloat16", "multi:2x3"),
)


@dataclass
class ConfigChoice:
    """The chosen configuration, why, and what was known of every candidate."""

    candidate: Candidate
    tree: str  # the candidate's tree, or the best predicted tree when a profile is stored
    measured: bool  # chosen by stored measurements (False: the invariant default, unmeasured)
    reason: str
    #: per candidate name: eligible, identity (max |diff| or None), predicted tokens/s or None
    table: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def dtype(self) -> str:
        return self.candidate.dtype

    @property
    def draft_dtype(self) -> str:
        return self.candidate.draft_dtype

    def summary(self) -> str:
        return (
            f"config auto: target {self.dtype}, draft {self.draft_dtype}, tree {self.tree} "
            f"({self.reason})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.candidate.name,
            "dtype": self.dtype,
            "draft_dtype": self.draft_dtype,
            "tree": self.tree,
            "measured": self.measured,
            "reason": self.reason,
            "candidates": self.table,
        }


class Described:
    """A stand-in whose ``describe()`` is a given dict: the cost store's key of a model that is
    not loaded (:func:`describe_as`)."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info

    def describe(self) -> dict[str, Any]:
        return dict(self.info)


def _folder(name: str) -> Path | None:
    from ersd.models import bundled

    if name in bundled.BUNDLED:
        st = bundled.status(name)
        return Path(st.path) if st.path is not None and st.state == "prepared" else None
    path = Path(name).expanduser()
    return path if (path / "config.json").is_file() else None


def describe_as(name: str, dtype: str, device: str = "cpu") -> dict[str, Any] | None:
    """What ``ersd.load_model(name, dtype=dtype)`` (``linear="auto"``) would ``describe()``,
    without loading the weights (its ``config.json``); None when the folder is not at hand (a
    hub id, an unprepared bundled model).  ``tree_attention`` is left out: the cost store drops
    it from keys."""
    from ersd.models import cpu

    folder = _folder(name)
    if folder is None:
        return None
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or config
    archs = config.get("architectures") or []
    info: dict[str, Any] = {
        "backend": "hf",
        "name": name,
        "architecture": archs[0] if archs else None,
        "dtype": dtype,
        "device": device,
        "linear": "torch",
    }
    if dtype == "int8":
        info["linear"] = "int8"
    elif dtype == "float32" and device == "cpu" and cpu.onednn_available():
        info["linear"] = "onednn"
        info["linear_layout"] = (
            f"packed:{cpu.PACK_ROWS}" if cpu.packed_linear_available() else "plain"
        )
    layers = text.get("num_hidden_layers")
    window = text.get("max_position_embeddings")
    info["layers"] = int(layers) if layers is not None else None
    info["vocab_size"] = int(text["vocab_size"]) if "vocab_size" in text else None
    info["max_length"] = int(window) if window else None
    return info


def _predict(
    tree: str, curves: tuple[list[float], list[float]], profile: Sequence[Any] | None
) -> tuple[float, str]:
    from ersd.costs import DEFAULT_SIZES, CostModel, candidate_trees, predict
    from ersd.tree import parse_tree

    costs = CostModel(sizes=list(DEFAULT_SIZES), target=curves[0], draft=curves[1])
    probs = list(profile) if profile else NOMINAL_PROFILE
    best = predict(parse_tree(tree), probs, costs, tree)
    if profile:  # a measured profile: the best tree of the usual candidates, too
        for spec, shape in candidate_trees(probs, 8).items():
            p = predict(shape, probs, costs, spec)
            if p.tokens_per_second > best.tokens_per_second:
                best = p
    return best.tokens_per_second, best.spec


def choose_config(
    target: str,
    draft: str,
    *,
    temperature: float = 1.0,
    store: Any = None,
    records: Any = None,
    candidates: Sequence[Candidate] = CANDIDATES,
    describe: Any = describe_as,
) -> ConfigChoice:
    """Pick the configuration to run ``target`` <- ``draft`` in (module docstring).

    ``store``: a :class:`ersd.cost_store.CostStore` (default: the machine's); ``records``: an
    :class:`ersd.precision.IdentityRecords` (default: beside the store); ``describe``:
    ``(name, dtype) -> describe() dict or None`` (tests pass their own)."""
    from ersd.cost_store import CostStore, model_key
    from ersd.costs import DEFAULT_SIZES
    from ersd.precision import IdentityRecords

    store = store if store is not None else CostStore.default()
    if records is None:
        records = IdentityRecords(store.directory)
    default = candidates[0]
    table: dict[str, dict[str, Any]] = {}
    profiles: dict[str, Any] = {}
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for cand in candidates:
        tinfo, dinfo = describe(target, cand.dtype), describe(draft, cand.draft_dtype)
        tm = Described(tinfo) if tinfo is not None else None
        dm = Described(dinfo) if dinfo is not None else None
        check = records.get(model_key(tm)) if tm is not None else None
        row: dict[str, Any] = {
            "identity_checked": check is not None,
            "max_abs_diff": check.max_abs_diff if check is not None else None,
        }
        if check is not None:
            row["eligible"] = check.max_abs_diff <= ROUNDING_TOLERANCE
        else:  # float32: checked before the run; reduced precision: must have been checked
            row["eligible"] = cand.dtype == "float32"
        if tm is not None and dm is not None:
            tc = store.get_curve(tm, 1, DEFAULT_SIZES)
            dc = store.get_curve(dm, 1, DEFAULT_SIZES)
            if tc is not None and dc is not None:
                curves[cand.name] = (tc, dc)
            prof = store.get_profile(tm, dm, "ersd", temperature)
            if prof:
                profiles[cand.name] = prof
        table[cand.name] = row
    fallback_profile = next(iter(profiles.values()), None)
    for cand in candidates:
        row = table[cand.name]
        if cand.name in curves:
            rate, spec = _predict(
                cand.tree, curves[cand.name], profiles.get(cand.name, fallback_profile)
            )
            row["predicted_tokens_per_second"] = rate
            row["tree"] = spec
        else:
            row["predicted_tokens_per_second"] = None
    measured = [c for c in candidates if table[c.name]["eligible"] and c.name in curves]
    why_not = []
    for c in candidates:
        row = table[c.name]
        if not row["eligible"]:
            if row["identity_checked"]:
                why_not.append(
                    f"{c.name} left out: its tree rows differ from one-token rows by "
                    f"{row['max_abs_diff']:.3g} on this machine"
                )
            else:
                why_not.append(
                    f"{c.name} left out: not checked on this machine (run once with "
                    f"--dtype {c.dtype} --draft-dtype {c.draft_dtype}: the check is recorded)"
                )
    if not measured:
        missing = [c for c in candidates if table[c.name]["eligible"]]
        cmds = "; ".join(
            f"`ersd models calibrate --target {target} --draft {draft} --dtype {c.dtype} "
            f"--draft-dtype {c.draft_dtype}`"
            for c in missing
        )
        reason = (
            "no stored cost measurement for an eligible configuration: the invariant default"
            + (f"; {cmds} measures" if cmds else "")
        )
        if why_not:
            reason += "; " + "; ".join(why_not)
        return ConfigChoice(default, default.tree, False, reason, table)
    best = max(measured, key=lambda c: table[c.name]["predicted_tokens_per_second"])
    row = table[best.name]
    rates = ", ".join(
        f"{c.name} {table[c.name]['predicted_tokens_per_second']:.2f}" for c in measured
    )
    reason = f"highest predicted tokens/s from the stored measurements ({rates})"
    if why_not:
        reason += "; " + "; ".join(why_not)
    return ConfigChoice(best, str(row["tree"]), True, reason, table)


#: llama.cpp: ERSD under the exact batch policy (``tree="auto"``, the invariant default), or the
#: fast policy target-only -- the exact policy is paid only where a draft can repay it
LLAMACPP_CANDIDATES: tuple[Candidate, ...] = (
    Candidate("llama.cpp exact policy <- draft", "gguf", "gguf", "auto", "exact"),
    Candidate("llama.cpp fast policy, target-only", "gguf", "none", "none", "fast"),
)


def fast_twin(info: dict[str, Any]) -> dict[str, Any]:
    """What the same GGUF loaded with ``exact=False`` (repacked weights, f16 cache) would
    ``describe()``, from an exact-policy model's description: the cost store's key of the fast
    policy without loading a second copy."""
    return {**info, "batch_policy": "fast", "repack": True, "kv_cache": "f16"}


def choose_llamacpp(
    target: Any,
    draft: Any,
    *,
    temperature: float = 1.0,
    store: Any = None,
    candidates: Sequence[Candidate] = LLAMACPP_CANDIDATES,
) -> ConfigChoice:
    """The batch policy (and tree) for a llama.cpp ``target`` (loaded with the exact policy)
    and its ``draft`` (a model or None), by this machine's stored curves.

    The exact policy keeps ERSD's text drafter-invariant but costs every forward (unrepacked
    weights: 1.5x a one-token decode on a 2-core Sapphire Rapids, docs/llamacpp.md); it is chosen
    when its best predicted tree (or target-only, whichever is faster) beats the fast policy's
    one-token decode, and is the default while either is unmeasured.  The fast policy runs
    target-only, so its text is trivially the same whatever the draft (there is none)."""
    from ersd.cost_store import CostStore
    from ersd.costs import DEFAULT_SIZES

    store = store if store is not None else CostStore.default()
    exact_c, fast_c = candidates
    tinfo = target.describe()
    table: dict[str, dict[str, Any]] = {}
    tc = store.get_curve(target, 1, DEFAULT_SIZES)
    dc = store.get_curve(draft, 1, DEFAULT_SIZES) if draft is not None else None
    fc = store.get_curve(Described(fast_twin(tinfo)), 1, DEFAULT_SIZES)
    exact_rate: float | None = None
    if tc is not None:  # target-only or the best usual tree (a nominal profile if none stored)
        exact_rate = 1.0 / tc[0]
        if dc is not None:
            prof = store.get_profile(target, draft, "ersd", temperature)
            exact_rate = max(exact_rate, _predict("chain:1", (tc, dc), prof or NOMINAL_PROFILE)[0])
    fast_rate = 1.0 / fc[0] if fc is not None else None
    table[exact_c.name] = {"eligible": True, "predicted_tokens_per_second": exact_rate}
    table[fast_c.name] = {"eligible": True, "predicted_tokens_per_second": fast_rate}
    calib = f"`ersd models calibrate --backend llamacpp --target {tinfo.get('name')}" + (
        f" --draft {draft.describe().get('name')}`" if draft is not None else " --draft none`"
    )
    if exact_rate is None or fast_rate is None:
        missing = [c.name for c, r in ((exact_c, exact_rate), (fast_c, fast_rate)) if r is None]
        reason = (
            f"no stored cost measurement for {' and '.join(missing)}: the invariant default "
            f"(exact batch policy); {calib} measures both"
        )
        return ConfigChoice(exact_c, exact_c.tree, False, reason, table)
    rates = f"{exact_c.name} {exact_rate:.2f}, {fast_c.name} {fast_rate:.2f}"
    if exact_rate >= fast_rate:
        reason = f"highest predicted tokens/s from the stored measurements ({rates})"
        return ConfigChoice(exact_c, exact_c.tree, True, reason, table)
    reason = (
        f"highest predicted tokens/s from the stored measurements ({rates}): no draft repays "
        "the exact policy's forwards on this machine, so the draft is not used"
    )
    return ConfigChoice(fast_c, fast_c.tree, True, reason, table)


__all__ = [
    "CANDIDATES",
    "LLAMACPP_CANDIDATES",
    "Candidate",
    "ConfigChoice",
    "choose_config",
    "choose_llamacpp",
    "describe_as",
    "fast_twin",
]
