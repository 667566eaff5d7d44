"""Does a loaded model keep ERSD's promise on this machine, and how close did a text come to a flip?

ERSD's text equals target-only race sampling (whatever the drafter) only if the target scores a
token the same in a tree forward (many new tokens in one call) as in the one-token forward of
target-only decoding.  Whether it does is a property of the *kernel*, not of the method: float32
with prepacked oneDNN linears (:mod:`ersd.models.cpu`) and llama.cpp's exact batch policy give
bit-identical rows; a bfloat16 GEMM whose blocking depends on the number of rows (AMX, oneDNN's
bf16 brgemm) rounds a row differently in a wide call than alone, so a near tie can flip.

* :func:`check_tree_identity` measures it on a loaded model, before a run: a small tree (a chain
  of 3 and two siblings of its root, after a pending token) scored in one call -- once after the
  prompt's prefill, once decoded together with the whole prompt (ERSD's first target call) --
  against the same nodes decoded one token at a time as target-only decoding does.
  ``identical`` is exact equality of every row; ``max_abs_diff`` is the largest logit
  difference (the numeric error between the two paths on this prompt: a measurement on one
  prompt, not a bound for all).
* :class:`IdentityRecords` keeps those results per model and environment next to the cost store
  (``<store dir>/identity.json``), so the configuration choice (:mod:`ersd.config_choice`)
  knows which configurations were seen to keep the identity without loading them.
* :func:`race_margins` reports, for a generated text, the smallest race margin (``log`` of the
  runner-up's race score over the winner's, by :func:`ersd.watermark.audit`: one target forward
  over prompt + text) and whether a flip was possible: a margin within ``2 · error / T`` (two
  logits each moved by ``error``, divided by the temperature) of zero could have gone the other
  way between the tree path and the one-token path.  A text whose every margin is above it is
  the same text target-only decoding gives, up to the error measured on the check prompt; one
  with a margin below it may be a lucky one.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

#: the check's tree after the pending token: node 0 <- 1 <- 2 is a chain, nodes 3 and 4 are
#: siblings of node 0 (6 rows in one forward with the pending token: a ``multi:3x..``-like call)
CHECK_PARENTS = (-1, 0, 1, -1, -1)
#: file of :class:`IdentityRecords` in the cost store's directory
IDENTITY_FILE = "identity.json"


@dataclass(frozen=True)
class IdentityCheck:
    """Tree rows vs one-token rows of one model on one prompt (:func:`check_tree_identity`)."""

    identical: bool
    max_abs_diff: float  # largest |logit difference| over the compared rows
    rows: int  # rows compared
    dtype: str  # the model's weights as described (float32, bfloat16, int8, gguf, ...)

    def summary(self) -> str:
        if self.identical:
            return (
                f"tree rows bit-identical to one-token rows ({self.rows} rows, {self.dtype}): "
                "ERSD's text equals target-only sampling"
            )
        if self.max_abs_diff <= 1e-3:
            return (
                f"tree rows differ from one-token rows by float rounding order only (up to "
                f"{self.max_abs_diff:.3g} in the logits, {self.dtype}): a race flips only if its "
                f"margin is below 2 x {self.max_abs_diff:.3g} / T (the margin report after the run "
                "says whether one was)"
            )
        return (
            f"tree rows differ from one-token rows by up to {self.max_abs_diff:.3g} in the logits "
            f"({self.dtype}): ERSD's text can differ from target-only sampling where a race is "
            "a near tie (the margin report after the run says whether one was)"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dtype_of(model: Any) -> str:
    describe = getattr(model, "describe", None)
    info = describe() if callable(describe) else {}
    if info.get("backend") == "llamacpp":
        return f"gguf, {info.get('batch_policy', '?')} policy"
    return str(info.get("dtype", "?"))


def _close(session: Any) -> None:
    close = getattr(session, "close", None)
    if callable(close):
        close()


def check_tree_identity(
    model: Any, prompt: Sequence[int], tokens: Sequence[int] | None = None
) -> IdentityCheck:
    """Score a small draft tree in one forward and the same nodes one token at a time (as
    target-only decoding feeds them), on fresh sessions of ``prompt``; compare every row.

    ``tokens``: the pending token and the 5 tree nodes (6 ids; default: taken from the prompt).
    Costs two tree forwards (one with the prompt) and three prefills plus 8 one-token
    forwards; use a prompt like the real ones (llama.cpp's attention takes another kernel from
    64 tokens in one call)."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("check_tree_identity needs a non-empty prompt")
    n = len(CHECK_PARENTS)
    if tokens is None:
        tokens = [prompt[(7 * i + 3) % len(prompt)] for i in range(n + 1)]
    tokens = [int(t) for t in tokens]
    if len(tokens) != n + 1:
        raise ValueError(f"check_tree_identity takes {n + 1} tokens, got {len(tokens)}")
    pending, nodes = tokens[0], tokens[1:]

    def fresh() -> Any:
        session = model.start(list(prompt))
        session.score([], [])  # the prefill: the same multi-token forward on both sides
        session.commit([pending], [])
        return session

    with torch.no_grad():
        # a steady-state call (the pending token and the tree) and a first call (the whole
        # prompt decoded together with the tree, as ERSD's first target call does)
        trees = []
        for session in (fresh(), model.start([*prompt, pending])):
            trees.append(session.score(nodes, list(CHECK_PARENTS)).float())
            _close(session)
        # one-token rows: each root-to-leaf path decoded token by token
        ref: dict[int, torch.Tensor] = {}
        leaves = [i for i in range(n) if i not in CHECK_PARENTS]
        for leaf in leaves:
            path = [leaf]
            while CHECK_PARENTS[path[-1]] >= 0:
                path.append(CHECK_PARENTS[path[-1]])
            path.reverse()
            session = fresh()
            ref[-1] = session.score([], [])[0].float()  # the pending token, alone
            for node in path:
                session.commit([nodes[node]], [])
                ref[node] = session.score([], [])[0].float()
            _close(session)
    diffs = []
    for tree in trees:
        diffs.append((tree[0] - ref[-1]).abs().max())
        diffs += [(tree[1 + i] - ref[i]).abs().max() for i in range(n)]
    worst = float(torch.stack(diffs).max())
    if not math.isfinite(worst):
        worst = math.inf
    return IdentityCheck(worst == 0.0, worst, len(diffs), _dtype_of(model))


# --- records ----------------------------------------------------------------------------------


class IdentityRecords:
    """Identity checks kept per model (its cost-store key) and environment, in
    ``<directory>/identity.json`` (default: the cost store's directory; None: memory only)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, env: Any = None) -> None:
        from ersd.cost_store import environment

        self.directory = Path(directory) if directory is not None else None
        self._env_fn = env or environment
        self._data: dict[str, Any] | None = None

    @classmethod
    def default(cls) -> IdentityRecords:
        from ersd.cost_store import default_dir

        return cls(default_dir())

    @property
    def path(self) -> Path | None:
        return self.directory / IDENTITY_FILE if self.directory is not None else None

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            self._data = {}
            path = self.path
            if path is not None and path.exists():
                try:
                    read = json.loads(path.read_text())
                    if isinstance(read, dict):
                        self._data = read
                except (OSError, ValueError):
                    pass  # unreadable: rewritten on the next put
        return self._data

    def get(self, key: str | None) -> IdentityCheck | None:
        """The check recorded for a model key (:func:`ersd.cost_store.model_key`) in this
        environment, or None."""
        if key is None:
            return None
        entry = self._load().get(key)
        if not isinstance(entry, dict) or entry.get("env") != self._env_fn():
            return None
        try:
            return IdentityCheck(
                bool(entry["identical"]),
                float(entry["max_abs_diff"]),
                int(entry["rows"]),
                str(entry["dtype"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, key: str | None, check: IdentityCheck) -> None:
        if key is None:
            return
        self._data = None  # re-read: another process may have written since
        data = self._load()
        data[key] = {**check.to_dict(), "env": self._env_fn()}
        path = self.path
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".identity-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, default=str)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only store: the check is simply made again next time


def checked_identity(
    model: Any, prompt: Sequence[int], records: IdentityRecords | None = None
) -> IdentityCheck:
    """:func:`check_tree_identity`, read from ``records`` when this model was checked in this
    environment already, else measured and recorded there."""
    from ersd.cost_store import model_key

    key = model_key(model)
    if records is not None:
        found = records.get(key)
        if found is not None:
            return found
    check = check_tree_identity(model, prompt)
    if records is not None:
        records.put(key, check)
    return check


# --- margins after a run ----------------------------------------------------------------------


@dataclass(frozen=True)
class MarginReport:
    """How close a generated text's races came to a flip (:func:`race_margins`)."""

    min_margin: float  # smallest race margin over the text (inf for an empty text)
    at_token: int | None  # where it was
    threshold: float  # 2 * error / T: a margin at or below this could flip
    near_ties: int  # positions with a margin at or below the threshold
    error: float  # the numeric error between the two paths used (IdentityCheck.max_abs_diff)

    @property
    def flip_possible(self) -> bool:
        return self.near_ties > 0

    def summary(self) -> str:
        if self.error == 0.0:
            return (
                f"smallest race margin {self.min_margin:.3g}; no flip possible (tree rows are "
                "bit-identical to one-token rows)"
            )
        if not self.flip_possible:
            return (
                f"smallest race margin {self.min_margin:.3g} (token {self.at_token}) > "
                f"{self.threshold:.3g} = 2 x {self.error:.3g} / T: no flip was possible; "
                "the text is target-only sampling's"
            )
        return (
            f"smallest race margin {self.min_margin:.3g} (token {self.at_token}) <= "
            f"{self.threshold:.3g} = 2 x {self.error:.3g} / T at {self.near_ties} token(s): a "
            "flip was possible, so an identical text here may be a lucky one"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "flip_possible": self.flip_possible}


def race_margins(
    target: Any,
    prompt: Sequence[int],
    tokens: Sequence[int],
    *,
    error: float,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    watermark: Any = None,
) -> MarginReport:
    """The smallest race margin of ``tokens`` (generated after ``prompt`` with these settings)
    and whether a flip was possible given ``error`` (the logit difference between a tree row and
    a one-token row, :attr:`IdentityCheck.max_abs_diff`): one target forward over prompt + text.
    At temperature 0 the margin is the winner's logit lead and the threshold ``2 · error``."""
    from ersd.watermark.audit import audit

    if not error >= 0:
        raise ValueError(f"error must be a number >= 0, got {error!r}")
    report = audit(
        target,
        prompt,
        tokens,
        seed=seed,
        watermark=watermark,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        tie_tolerance=0.0,
    )
    threshold = 2.0 * error / temperature if temperature > 0 else 2.0 * error
    margins = [p.margin for p in report.positions]
    if not margins:
        return MarginReport(math.inf, None, threshold, 0, error)
    at = min(range(len(margins)), key=margins.__getitem__)
    near = sum(1 for m in margins if m <= threshold) if error > 0 else 0
    return MarginReport(float(margins[at]), at, threshold, near, error)


__all__ = [
    "IdentityCheck",
    "IdentityRecords",
    "MarginReport",
    "check_tree_identity",
    "checked_identity",
    "race_margins",
]
