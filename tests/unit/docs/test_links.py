"""Every relative link of the user docs resolves: the file exists and, with a `#anchor`, so does the heading.

The user docs are README.md, docs/*.md and deploy/README.md. Anchors are GitHub's: the heading in lower
case, punctuation dropped, spaces as hyphens, `-1`, `-2` ... for repeats. Links inside code are not links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DOCS = sorted([ROOT / "README.md", ROOT / "deploy/README.md", *(ROOT / "docs").glob("*.md")])
#: `[text](target)` and `![alt](target)`; the target ends at the first space or `)`.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")


def _prose(text: str, *, blank_code: bool = True) -> list[str]:
    """The lines outside fenced code blocks, with inline code blanked out unless `blank_code` is false."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(INLINE_CODE.sub("``", line) if blank_code else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading counts by its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for the headings of `path`."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(path.read_text(), blank_code=False):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The relative link targets of `path` (external ones, with a scheme, and mail links left out)."""
    targets = []
    for line in _prose(path.read_text()):
        targets += [t for t in LINK.findall(line) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    return targets


def test_slugs_are_githubs() -> None:
    assert slug("The host agent (`agent.toml`)") == "the-host-agent-agenttoml"
    assert slug("Scale path (past one machine)") == "scale-path-past-one-machine"
    assert slug("Agent shutdown, drain and rollouts") == "agent-shutdown-drain-and-rollouts"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [bad](#nowhere) [gone](missing.md)\n\n```\n[code](not-a-link.md)\n```\n")
    assert links(page) == ["#title", "#nowhere", "missing.md"]
    assert anchors(page) == {"title"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in links(doc):
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.relative_to(ROOT)}")
    assert broken == [], f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_user_docs_include_the_reference_pages() -> None:
    names = {path.name for path in DOCS}
    assert {"configuration.md", "operations.md", "benchmarks.md", "testing.md", "architecture.md"} <= names
