"""Prompt-lookup drafting: propose what followed the last n tokens earlier in the text.

The n-gram drafter of Hugging Face (``prompt_lookup_num_tokens``), vLLM (``ngram``) and "LLMA",
as a :class:`~ersd.drafting.Drafter`.  The session indexes every n-gram of the prompt and of the
generated text (``n`` from ``min_n`` to ``n``) with the tokens that followed it: how often, and
where last.  At a tree context it takes the longest n-gram ending there that occurred before
(``n`` first, then ``n - 1``, ...) and proposes its followers, most frequent first, most recent
on ties.  Several distinct followers become several branches (up to the branching budget); each
drafted token is looked up again (the n-gram now ends with it), so a copied run continues.

The index costs ``len(ns)`` dictionary updates per committed token; a look-up is one dictionary
probe per n.  See :mod:`ersd.drafting.grow` for how the proposal becomes a tree and why it is
exact under every method.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

from ersd.drafting.free import DrafterConfigError, DrafterStats, FreeSession, positive_int
from ersd.drafting.grow import Continuation

# follower token -> [count, last position], per n-gram
_Followers = dict[int, list[int]]


class LookupDrafter:
    """Prompt-lookup / n-gram drafter.

    ``n``: longest n-gram matched (then shorter ones, down to ``min_n``); ``k``: most tokens
    proposed per step; ``depth``: deepest draft (default ``k``); ``branches``: most distinct
    continuations per context.  The step's tree shape caps all three (docs/drafters.md).
    """

    source = "lookup"

    def __init__(
        self, n: int = 3, k: int = 10, branches: int = 2, min_n: int = 1, depth: int | None = None
    ) -> None:
        self.n = positive_int("n", n)
        self.min_n = positive_int("min_n", min_n)
        if self.min_n > self.n:
            raise DrafterConfigError(f"lookup min_n={min_n} is larger than n={n}; use min_n <= n")
        self.k = positive_int("k", k)
        self.depth = positive_int("depth", depth if depth is not None else k)
        self.branches = positive_int("branches", branches)
        self.stats = DrafterStats()

    @property
    def vocab_size(self) -> None:
        return None  # any vocabulary: the text's own token ids are proposed

    def start_drafting(self, prompt: Sequence[int]) -> LookupSession:
        return LookupSession(self, prompt)

    def __repr__(self) -> str:
        return (
            f"LookupDrafter(n={self.n}, k={self.k}, branches={self.branches}, "
            f"min_n={self.min_n}, depth={self.depth})"
        )


class LookupSession(FreeSession):
    """The n-gram index of one sequence (prompt + committed tokens)."""

    source = "lookup"

    def __init__(self, drafter: LookupDrafter, prompt: Sequence[int]) -> None:
        super().__init__(drafter.stats, drafter.k, drafter.depth, drafter.branches)
        self.ns = list(range(drafter.n, drafter.min_n - 1, -1))  # longest first
        self.branches = drafter.branches
        self.text: list[int] = []
        self.index: dict[int, dict[tuple[int, ...], _Followers]] = {n: {} for n in self.ns}
        self.append(prompt)

    def append(self, tokens: Sequence[int]) -> None:
        text = self.text
        for tok in tokens:
            tok = int(tok)
            end = len(text)  # the n-grams ending at end - 1 get follower ``tok`` at ``end``
            for n in self.ns:
                if end >= n:
                    followers = self.index[n].setdefault(tuple(text[end - n : end]), {})
                    entry = followers.get(tok)
                    if entry is None:
                        followers[tok] = [1, end]
                    else:
                        entry[0] += 1
                        entry[1] = end
            text.append(tok)

    def root_state(self) -> Hashable:
        return tuple(self.text[-self.ns[0] :])

    def match(self, tail: tuple[int, ...]) -> tuple[int, _Followers | None]:
        """The longest n-gram ending ``tail`` that occurred with a follower: (n, followers)."""
        for n in self.ns:
            if len(tail) >= n:
                followers = self.index[n].get(tail[-n:])
                if followers:
                    return n, followers
        return 0, None

    def match_length(self, state: Hashable) -> int:
        return self.match(state)[0]  # type: ignore[arg-type]

    def expand(self, state: Hashable) -> list[Continuation]:
        tail: tuple[int, ...] = state  # type: ignore[assignment]
        _, followers = self.match(tail)
        if not followers:
            return []
        total = sum(e[0] for e in followers.values())
        best = heapq.nsmallest(
            self.branches, followers.items(), key=lambda kv: (-kv[1][0], -kv[1][1])
        )
        keep = self.ns[0] - 1
        return [
            Continuation(tok, e[0] / total, (*tail[-keep:], tok) if keep else (tok,))
            for tok, e in best
        ]
