"""The backend contract: what every :class:`ersd.LanguageModel` must do (``docs/backends.md``).

Each ``check_*`` function takes a :class:`BackendCase` and the model it made and asserts one
property of the session protocol (:mod:`ersd.models.base`):

* the rows of a tree scored in one call (or level by level) equal the logits of each node's full
  sequence computed plainly (``case.reference``; default: a fresh session's prefill);
* ``commit`` then ``score`` equals a fresh prefill of the committed sequence, over many random
  steps, with accepted paths, unscored extra tokens and empty commits;
* ``score([], [])`` returns the root row, before and after a tree was scored;
* a session's ``cache_length`` (where it has one) never exceeds the committed sequence plus the
  pending nodes, and never the committed sequence after a commit;
* malformed ``parents`` / ``path`` raise ``ValueError``;
* a :class:`ersd.TextModel` also has a working tokenizer, JSON-ready ``describe()`` and accepts
  itself in ``check_compatible``.

``tests/test_backend_contract.py`` runs every check on every case in its ``BACKENDS`` list; a new
backend joins by appending one :class:`BackendCase` there.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import ersd
from ersd.models.base import LanguageModel, ModelSession


def prefill_reference(model: LanguageModel, seq: list[int]) -> torch.Tensor:
    """Next-token logits after ``seq`` from a fresh session: its root row."""
    return model.start(seq).score([], [])[0]


@dataclass(frozen=True)
class BackendCase:
    """One backend under test.

    ``make`` builds the model (once per test module); ``reference(model, seq)`` gives the
    next-token logits after the full sequence ``seq`` computed without trees or caches (for
    transformers, a plain no-cache forward); ``atol`` bounds ``|row - reference|`` (0 for exact
    backends; float32 kernels differ by rounding between a batched tree and a plain forward);
    ``max_token`` caps the random token ids used; ``steps`` is the length of the random
    sessions (fewer for slow models); ``marks`` are pytest marks (e.g. ``pytest.mark.realmodel``
    for cases that need bundled weights).
    """

    id: str
    make: Callable[[], LanguageModel]
    reference: Callable[[Any, list[int]], torch.Tensor] = prefill_reference
    atol: float = 1e-4
    max_token: int = 1000
    steps: int = 6
    marks: tuple[Any, ...] = field(default_factory=tuple)

    def param(self) -> Any:
        return pytest.param(self, id=self.id, marks=self.marks)


class Driver:
    """Drives one session, mirrors its pending tree, and checks every row it returns."""

    def __init__(self, case: BackendCase, model: LanguageModel, prompt: list[int]) -> None:
        self.case, self.model = case, model
        self.session: ModelSession = model.start(prompt)
        assert isinstance(self.session, ModelSession)
        assert self.session.committed == prompt
        self.ptok: list[int] = []
        self.ppar: list[int] = []

    def seq(self, node: int) -> list[int]:
        out: list[int] = []
        while node >= 0:
            out.append(self.ptok[node])
            node = self.ppar[node]
        return list(self.session.committed) + out[::-1]

    def expect(self, row: torch.Tensor, seq: list[int]) -> None:
        ref = self.case.reference(self.model, seq).float().cpu()
        err = (row.float().cpu() - ref).abs().max().item()
        assert err <= self.case.atol, f"{self.case.id}: row for {seq[-6:]} off by {err:.3g}"

    def score(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        rows = self.session.score(tokens, parents)
        assert rows.shape == (1 + len(tokens), self.model.vocab_size)
        assert rows.is_floating_point()
        self.check_scored(tokens, parents, rows)
        return rows

    def check_scored(self, tokens: list[int], parents: list[int], rows: torch.Tensor) -> None:
        """Record a score call's new nodes and check its rows (the committed sequence's next
        token, then each new node's path) and the cache against per-path references."""
        first = len(self.ptok)
        self.ptok += tokens
        self.ppar += parents
        self.expect(rows[0], list(self.session.committed))
        for i in range(len(tokens)):
            self.expect(rows[1 + i], self.seq(first + i))
        self.check_cache(pending=len(self.ptok))

    def commit(self, tokens: list[int], path: list[int]) -> None:
        before = list(self.session.committed)
        self.session.commit(tokens, path)
        assert list(self.session.committed) == before + tokens
        self.ptok, self.ppar = [], []
        self.check_cache(pending=0)

    def check_cache(self, pending: int) -> None:
        length = getattr(self.session, "cache_length", None)
        if length is not None:
            assert 0 <= length <= len(self.session.committed) + pending, (
                f"{self.case.id}: cache holds {length} entries for {len(self.session.committed)} "
                f"committed tokens and {pending} pending nodes"
            )

    def token(self, rng: random.Random) -> int:
        return rng.randrange(min(self.model.vocab_size, self.case.max_token))


def random_parents(rng: random.Random, num_pending: int, n: int) -> list[int]:
    return [rng.randrange(-1, num_pending + i) for i in range(n)]


def random_path(rng: random.Random, parents: Sequence[int]) -> list[int]:
    """A root-down chain of pending nodes, possibly stopping before a leaf."""
    path: list[int] = []
    prev = -1
    while True:
        kids = [i for i, p in enumerate(parents) if p == prev]
        if not kids or rng.random() < 0.2:
            return path
        prev = rng.choice(kids)
        path.append(prev)


# ----------------------------------------------------------------------------------------------
# the checks


def check_protocol(case: BackendCase, model: Any) -> None:
    assert isinstance(model, ersd.LanguageModel)
    assert isinstance(model.vocab_size, int) and model.vocab_size > 0
    assert model.max_length is None or model.max_length > 1
    if isinstance(model, ersd.TextModel):
        assert isinstance(model.tokenizer, ersd.Tokenizer)
        ids = model.tokenizer.encode("def f(x):\n    return x")
        assert ids and all(isinstance(i, int) and 0 <= i < model.vocab_size for i in ids)
        assert isinstance(model.tokenizer.decode(ids), str)
        assert all(0 <= e < model.vocab_size for e in model.eos_token_ids)
        about = model.describe()
        assert json.loads(json.dumps(about)) == about and "backend" in about
        assert isinstance(model.name, str) and model.name
        model.check_compatible(model)


def check_tree_rows(case: BackendCase, model: LanguageModel) -> None:
    """One-call trees and level-by-level trees: every row equals its path's plain logits."""
    rng = random.Random(11)
    for shape in ([-1, 0, 1, 2], [-1] * 5, [-1, -1, 0, 0, 1, 2, 4]):
        drv = Driver(case, model, [3, 1, 4, 1, 5])
        drv.score([drv.token(rng) for _ in shape], list(shape))
    drv = Driver(case, model, [2, 7])
    drv.score([], [])
    drv.score([drv.token(rng) for _ in range(2)], [-1, -1])
    drv.score([drv.token(rng) for _ in range(3)], [0, 1, 0])
    drv.score([drv.token(rng) for _ in range(2)], [2, 4])


def check_commit_then_score(case: BackendCase, model: LanguageModel) -> None:
    """Random steps of score / commit: after each commit the root row equals a fresh prefill."""
    for seed in range(2):
        rng = random.Random(seed)
        top = min(model.vocab_size, case.max_token)
        drv = Driver(case, model, [rng.randrange(top) for _ in range(rng.randrange(1, 6))])
        for _ in range(case.steps):
            if rng.random() < 0.5:  # drafter style: root first, then level by level
                drv.score([], [])
                for _level in range(rng.randrange(1, 3)):
                    par = random_parents(rng, len(drv.ptok), rng.randrange(1, 4))
                    drv.score([drv.token(rng) for _ in par], par)
            else:  # target style: the whole tree in one call
                par = random_parents(rng, 0, rng.randrange(0, 7))
                drv.score([drv.token(rng) for _ in par], par)
            path = random_path(rng, drv.ppar)
            extra = [drv.token(rng) for _ in range(rng.choice([0, 1, 1, 2]))]
            drv.commit([drv.ptok[i] for i in path] + extra, path)
            fresh = prefill_reference(model, list(drv.session.committed))
            got = drv.session.score([], [])[0]
            err = (got.float().cpu() - fresh.float().cpu()).abs().max().item()
            assert err <= case.atol, f"{case.id}: after commit, root row off by {err:.3g}"
        drv.commit([], [])  # an empty commit changes nothing
        drv.score([], [])


def check_empty_score_is_the_root(case: BackendCase, model: LanguageModel) -> None:
    sess = model.start([9, 8, 7])
    root = sess.score([], [])
    assert root.shape == (1, model.vocab_size)
    rows = sess.score([1, 2], [-1, 0])
    again = sess.score([], [])
    assert again.shape == (1, model.vocab_size)
    for other in (rows[0], again[0]):
        err = (other.float().cpu() - root[0].float().cpu()).abs().max().item()
        assert err <= case.atol, f"{case.id}: root row changed by {err:.3g}"


def check_cache_bounded(case: BackendCase, model: LanguageModel) -> None:
    """Long random sessions keep ``cache_length`` within the committed sequence + pending nodes
    (the Driver checks after every call; backends without a cache pass trivially)."""
    rng = random.Random(5)
    drv = Driver(case, model, [1, 2, 3])
    for _ in range(case.steps + 2):
        par = random_parents(rng, 0, rng.randrange(1, 6))
        drv.score([drv.token(rng) for _ in par], par)
        path = random_path(rng, drv.ppar)
        drv.commit([drv.ptok[i] for i in path] + [drv.token(rng)], path)
    length = getattr(drv.session, "cache_length", None)
    if length is not None:
        assert length <= len(drv.session.committed)


def check_bad_arguments_raise(case: BackendCase, model: LanguageModel) -> None:
    bad_scores: list[tuple[list[int], list[int]]] = [
        ([1, 2], [-1]),  # lengths differ
        ([1], [0]),  # a node cannot be its own parent
        ([1, 2], [-1, 5]),  # parent beyond the pending tree
        ([1], [-2]),  # below -1
    ]
    for tokens, parents in bad_scores:
        with pytest.raises(ValueError):
            model.start([1, 2]).score(tokens, parents)
    bad_commits: list[tuple[list[int], list[int]]] = [
        ([4], [3]),  # not a pending node
        ([5], [1]),  # node 1 is not a child of the root
        ([6, 5], [0, 1]),  # token differs from node 0's
        ([4], [0, 1]),  # path longer than the tokens
    ]
    for tokens, path in bad_commits:
        sess = model.start([1, 2])
        sess.score([4, 5], [-1, 0])
        with pytest.raises(ValueError):
            sess.commit(tokens, path)


def check_batched_rows(case: BackendCase, model: LanguageModel) -> None:
    """Several sessions scored together (``score_many``: one forward where the backend has
    ``score_batch``): ragged prompts and trees, rows in prefill next to rows mid-generation, rows
    leaving and joining; every row equals its path's plain logits and each cache stays within its
    own committed sequence + pending nodes."""
    from ersd.models.batch import score_many

    rng = random.Random(21)
    top = min(model.vocab_size, case.max_token)

    def new_driver() -> Driver:
        return Driver(case, model, [rng.randrange(top) for _ in range(rng.randrange(1, 12))])

    drivers = [new_driver() for _ in range(3)]
    for step in range(case.steps):
        calls: list[tuple[list[int], list[int]]] = []
        for drv in drivers:
            if rng.random() < 0.3:  # drafter style: root only
                calls.append(([], []))
            else:
                par = random_parents(rng, len(drv.ptok), rng.randrange(0, 6))
                calls.append(([drv.token(rng) for _ in par], par))
        firsts = [len(d.ptok) for d in drivers]
        outs = score_many(model, [d.session for d in drivers], calls)
        assert len(outs) == len(drivers)
        for drv, (tokens, parents), first, rows in zip(drivers, calls, firsts, outs, strict=True):
            assert rows.shape == (1 + len(tokens), model.vocab_size)
            drv.ptok += tokens
            drv.ppar += parents
            drv.expect(rows[0], list(drv.session.committed))
            for i in range(len(tokens)):
                drv.expect(rows[1 + i], drv.seq(first + i))
            drv.check_cache(pending=len(drv.ptok))
        if step % 2 == 1:  # commit a random accepted path in every row
            for drv in drivers:
                path = random_path(rng, drv.ppar)
                extra = [drv.token(rng) for _ in range(rng.choice([0, 1, 2]))]
                drv.commit([drv.ptok[i] for i in path] + extra, path)
            if step == 1:  # one row finishes, a new one (a prompt to prefill) joins
                drivers = [*drivers[1:], new_driver()]


CHECKS: dict[str, Callable[[BackendCase, Any], None]] = {
    "protocol": check_protocol,
    "tree_rows": check_tree_rows,
    "commit_then_score": check_commit_then_score,
    "empty_score_is_the_root": check_empty_score_is_the_root,
    "cache_bounded": check_cache_bounded,
    "bad_arguments_raise": check_bad_arguments_raise,
    "batched_rows": check_batched_rows,
}


def run_contract(case: BackendCase, model: LanguageModel | None = None) -> None:
    """Every check on one backend (for a backend's own test module)."""
    model = model if model is not None else case.make()
    for check in CHECKS.values():
        check(case, model)
