"""docs/index.md reaches every page of docs/, and every relative link of README.md and docs/ leads
somewhere: to a file of the repository and, when it names one, to a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"

# [text](target) and [text](target "title"); images too. Code spans are dropped first.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)

def unfenced(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """The page without its fenced blocks and code spans, where a `[x](y)` is not a link."""
    return re.sub(r"`[^`\n]*`", "", unfenced(text))


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in unfenced(page.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m[1])
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(page: Path) -> list[tuple[str, Path, str]]:
    """(as written, the file it names, the anchor or "") of each link to this repository."""
    out = []
    for target in links(page):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        out.append((target, (page.parent / unquote(path)).resolve() if path else page, anchor))
    return out


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_every_relative_link_leads_to_a_file_and_its_heading():
    broken = []
    for page in pages():
        for written, target, anchor in relative_links(page):
            where = f"{page.relative_to(ROOT)}: ({written})"
            if not target.exists():
                broken.append(f"{where}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{where}: {target.name} has no heading #{anchor}")
    assert broken == []


def test_every_page_of_docs_is_reachable_from_the_index():
    seen, todo = {INDEX}, [INDEX]
    while todo:
        for _, target, _ in relative_links(todo.pop()):
            if target.suffix == ".md" and target.parent == DOCS and target.exists() and target not in seen:
                seen.add(target)
                todo.append(target)
    assert sorted(p.name for p in DOCS.glob("*.md") if p not in seen) == []


def test_the_readme_leads_to_the_index():
    assert INDEX in {target for _, target, _ in relative_links(ROOT / "README.md")}


def test_the_link_checker_sees_a_broken_link_and_a_missing_heading(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# The `status --json` field\n\n## Twice\n\n## Twice\n")
    page.write_text("[ok](b.md#the-status---json-field) [2](b.md#twice-1) [gone](c.md) "
                    "[x](b.md#nowhere) `[not](a link)` [web](https://example.org/x)\n")
    found = [(w, t.exists(), not a or a in anchors(t)) for w, t, a in relative_links(page)]
    assert found == [("b.md#the-status---json-field", True, True), ("b.md#twice-1", True, True),
                     ("c.md", False, True), ("b.md#nowhere", True, False)]
