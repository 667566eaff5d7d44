"""docs/results/INDEX.md lists every study, and every doc link into docs/results/ resolves.

Reads whatever README.md and docs/**/*.md are on disk. A markdown link is an inline link or image
(`[text](target)`, `![alt](target)`) or a reference definition (`[label]: target`) outside fenced
code blocks and inline code spans; a relative target is resolved from the linking file's folder,
its `#anchor` and `?query` dropped. A doc also cites a study by naming its path in an inline code
span (`` `docs/results/NAME/` ``, from the repository root): those are checked the same way.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
INDEX = RESULTS / "INDEX.md"

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
_CITED_PATH = re.compile(r"^docs/results/[^\s<>*{}$]*$")  # a whole code span, a concrete path


def _prose_lines(path: Path):
    """(line number, line) of the file outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def markdown_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link in the file, code excluded."""
    links: list[tuple[int, str]] = []
    for number, line in _prose_lines(path):
        line = _CODE_SPAN.sub("", line)
        links.extend((number, m.group(1)) for m in _INLINE.finditer(line))
        ref = _REFERENCE.match(line)
        if ref:
            links.append((number, ref.group(1)))
    return links


def cited_paths(path: Path) -> list[tuple[int, str]]:
    """(line number, path) of every inline code span that is a path under docs/results/."""
    cited = []
    for number, line in _prose_lines(path):
        for match in _CODE_SPAN.finditer(line):
            text = match.group(0).strip("`").strip()
            if _CITED_PATH.match(text):
                cited.append((number, text))
    return cited


def resolve(source: Path, target: str) -> Path | None:
    """The local path a link points at, or None for an external or same-page link."""
    if _EXTERNAL.match(target) or target.startswith("#"):
        return None
    target = unquote(target.split("#", 1)[0].split("?", 1)[0])
    if not target:
        return None
    base = ROOT if target.startswith("/") else source.parent
    return (base / target.lstrip("/")).resolve()


def _under_results(path: Path) -> bool:
    return path == RESULTS or RESULTS in path.parents


def linking_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if f.is_file()]


def links_into_results() -> list[tuple[Path, int, str, Path]]:
    """(file, line, target, resolved) for every link meant to point into docs/results/.

    A link counts when it resolves under docs/results/, or when its text names `docs/results/`
    (so `docs/results/x` written from docs/foo.md, which resolves to docs/docs/results/x, is
    checked and reported rather than passed over). A code span naming `docs/results/...` is
    resolved from the repository root.
    """
    found = []
    for source in linking_files():
        for line, target in markdown_links(source):
            path = resolve(source, target)
            if path is None:
                continue
            if _under_results(path) or "docs/results/" in target:
                found.append((source, line, target, path))
        for line, cited in cited_paths(source):
            found.append((source, line, f"`{cited}`", (ROOT / cited.split("#", 1)[0]).resolve()))
    return found


def test_the_link_finder_finds_and_resolves_links(tmp_path):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        'See [a](results/x/README.md#top) and ![fig](../img.png "title").\n'
        "`[not](a-link)` and [web](https://example.org/results/x)\n"
        "```\n[inside](a/fence)\n```\n"
        "[ref]: results/y.md\n"
        "Cited as `docs/results/z/` and `docs/results/<folder>/`, `--out docs/results/w.jsonl`.\n",
        encoding="utf-8",
    )
    assert markdown_links(page) == [
        (1, "results/x/README.md#top"),
        (1, "../img.png"),
        (2, "https://example.org/results/x"),
        (6, "results/y.md"),
    ]
    assert cited_paths(page) == [(7, "docs/results/z/")]
    assert resolve(page, "results/x/README.md#top") == (page.parent / "results/x/README.md")
    assert resolve(page, "https://example.org/results/x") is None
    assert resolve(page, "#anchor") is None


def test_every_doc_link_into_results_resolves():
    links = links_into_results()
    # README.md and docs/*.md link dozens of studies; none found means the finder broke.
    assert len(links) >= 20, f"only {len(links)} links into docs/results/ found"
    broken = [
        f"{source.relative_to(ROOT)}:{line}: ({target}) -> "
        f"{path.relative_to(ROOT) if ROOT in path.parents else path} does not exist"
        for source, line, target, path in links
        if not path.exists()
    ]
    assert not broken, "broken links into docs/results/:\n" + "\n".join(broken)


def test_index_lists_every_study_left_in_results():
    assert INDEX.is_file(), "docs/results/INDEX.md is missing"
    listed = [
        path
        for _line, target in markdown_links(INDEX)
        if (path := resolve(INDEX, target)) is not None and _under_results(path)
    ]
    entries = sorted(p for p in RESULTS.iterdir() if p != INDEX and not p.name.startswith("."))
    assert entries, "docs/results/ holds no studies"
    missing = [
        entry.relative_to(ROOT).as_posix()
        for entry in entries
        if not any(p == entry or entry in p.parents for p in listed)
    ]
    assert not missing, (
        "not linked from docs/results/INDEX.md (add a row for each, or remove it from the tree): "
        + ", ".join(missing)
    )
