"""Suffix drafting: a suffix trie over the prompt, the generated text and an optional corpus.

After SuffixDecoding (Oliaro et al. 2024) and vLLM's suffix drafter.  A depth-limited suffix trie
holds every substring of at most ``max_depth`` tokens of the text with its number of occurrences
(and where it last ended).  At the end of the committed text the drafter finds the longest suffix
(at most ``match`` tokens) that occurred before with a continuation, then walks the trie below it:
the children of a trie node are the continuations, ranked by how often they occurred (most recent
on ties).  The tree is grown best-first by estimated path probability (count ratios), so several
frequent continuations become branches and a confident run becomes a long chain.

An optional corpus (documents of token ids, e.g. earlier outputs or reference code) is a second,
shared trie built once; at each step the longer of the two matches is used (the sequence's own
text on ties).  :meth:`SuffixDrafter.from_file` reads a corpus file.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path

from ersd.drafting.free import DrafterConfigError, DrafterStats, FreeSession, positive_int
from ersd.drafting.grow import Continuation


class _Node:
    __slots__ = ("children", "count", "last")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0  # occurrences of the substring this node spells
        self.last = -1  # position of the last token of its last occurrence


class SuffixTrie:
    """All substrings of at most ``max_depth`` tokens of a growing text, with counts."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = _Node()
        self.length = 0
        self._active: list[_Node] = []  # nodes of the suffixes ending at the last token, by depth

    def new_document(self) -> None:
        """Start a document: no substring spans the boundary."""
        self._active = []

    def append(self, tokens: Iterable[int]) -> None:
        for tok in tokens:
            tok = int(tok)
            grown: list[_Node] = []
            for node in (self.root, *self._active):
                child = node.children.get(tok)
                if child is None:
                    child = node.children[tok] = _Node()
                child.count += 1
                child.last = self.length
                grown.append(child)
            self._active = grown[: self.max_depth - 1]  # depth 1..max_depth-1 can still grow
            self.length += 1

    def longest_match(self, text: Sequence[int], limit: int) -> tuple[int, _Node | None]:
        """The longest suffix of ``text`` (at most ``limit`` tokens) spelled by a trie node that
        has a continuation: (its length, the node); (0, None) if none."""
        for m in range(min(limit, len(text)), 0, -1):
            node: _Node | None = self.root
            for tok in text[len(text) - m :]:
                node = node.children.get(tok)  # type: ignore[union-attr]
                if node is None:
                    break
            if node is not None and node.children:
                return m, node
        return 0, None


def read_corpus(
    path: str | Path, tokenize: Callable[[str], list[int]] | None = None
) -> list[list[int]]:
    """Documents of token ids from ``path``.

    ``.jsonl``: one document per line, a JSON list of ids, or an object with ``"ids"`` (list) or
    ``"text"`` (needs ``tokenize``).  Other files: one document per non-empty line, either
    whitespace-separated integers or text (needs ``tokenize``).
    """
    p = Path(path)
    if not p.is_file():
        raise DrafterConfigError(f"corpus file {str(p)!r} does not exist; give a path to a file")
    docs: list[list[int]] = []

    def text_doc(text: str, where: str) -> list[int]:
        if tokenize is None:
            raise DrafterConfigError(
                f"corpus {where} holds text but no tokenizer was given; give token ids "
                "(whitespace-separated integers or JSON lists) or pass the target's tokenizer"
            )
        return list(tokenize(text))

    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        where = f"{p.name} line {i}"
        if p.suffix == ".jsonl":
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DrafterConfigError(f"corpus {where} is not JSON: {exc}") from None
            if isinstance(item, dict) and "ids" in item:
                item = item["ids"]
            elif isinstance(item, dict) and "text" in item:
                docs.append(text_doc(str(item["text"]), where))
                continue
            if not isinstance(item, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in item
            ):
                raise DrafterConfigError(
                    f"corpus {where} must be a list of token ids >= 0, or an object with "
                    "'ids' or 'text'"
                )
            docs.append(item)
        else:
            fields = line.split()
            if all(f.isdigit() for f in fields):
                docs.append([int(f) for f in fields])
            else:
                docs.append(text_doc(line, where))
    return docs


class SuffixDrafter:
    """Suffix-trie drafter over prompt + generated text (+ an optional corpus of token ids).

    ``match``: longest suffix matched; ``k``: most tokens proposed per step; ``depth``: deepest
    draft (default ``k``); ``branches``: most continuations per context.  The step's tree shape
    caps ``k``, ``depth`` and ``branches`` (docs/drafters.md).
    """

    source = "suffix"

    def __init__(
        self,
        match: int = 8,
        k: int = 10,
        branches: int = 2,
        depth: int | None = None,
        corpus: Iterable[Sequence[int]] | None = None,
    ) -> None:
        self.match = positive_int("match", match)
        self.k = positive_int("k", k)
        self.depth = positive_int("depth", depth if depth is not None else k)
        self.branches = positive_int("branches", branches)
        self.max_depth = self.match + self.depth
        self.stats = DrafterStats()
        self.corpus: SuffixTrie | None = None
        if corpus is not None:
            self.corpus = SuffixTrie(self.max_depth)
            for doc in corpus:
                self.corpus.new_document()
                self.corpus.append(doc)

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        tokenize: Callable[[str], list[int]] | None = None,
        **options: int,
    ) -> SuffixDrafter:
        """A drafter whose corpus is read from ``path`` (see :func:`read_corpus`)."""
        return cls(corpus=read_corpus(path, tokenize), **options)

    @property
    def vocab_size(self) -> None:
        return None

    def start_drafting(self, prompt: Sequence[int]) -> SuffixSession:
        return SuffixSession(self, prompt)

    def __repr__(self) -> str:
        corpus = f", corpus={self.corpus.length} tokens" if self.corpus else ""
        return (
            f"SuffixDrafter(match={self.match}, k={self.k}, branches={self.branches}, "
            f"depth={self.depth}{corpus})"
        )


class SuffixSession(FreeSession):
    """The suffix trie of one sequence, plus the drafter's shared corpus trie."""

    source = "suffix"

    def __init__(self, drafter: SuffixDrafter, prompt: Sequence[int]) -> None:
        super().__init__(drafter.stats, drafter.k, drafter.depth, drafter.branches)
        self.match = drafter.match
        self.branches = drafter.branches
        self.corpus = drafter.corpus
        self.text: list[int] = []
        self.trie = SuffixTrie(drafter.max_depth)
        self.append(prompt)

    def append(self, tokens: Sequence[int]) -> None:
        self.text.extend(int(t) for t in tokens)
        self.trie.append(tokens)

    def root_match(self) -> tuple[int, _Node | None]:
        m, node = self.trie.longest_match(self.text, self.match)
        if self.corpus is not None:
            mc, node_c = self.corpus.longest_match(self.text, self.match)
            if mc > m:
                return mc, node_c
        return m, node

    def root_state(self) -> Hashable:
        return self.root_match()[1]

    def match_length(self, state: Hashable) -> int:
        return self.root_match()[0] if state is not None else 0

    def expand(self, state: Hashable) -> list[Continuation]:
        if state is None:
            return []
        node: _Node = state  # type: ignore[assignment]
        total = sum(c.count for c in node.children.values())
        best = heapq.nsmallest(
            self.branches, node.children.items(), key=lambda kv: (-kv[1].count, -kv[1].last)
        )
        return [Continuation(tok, child.count / total, child) for tok, child in best]
