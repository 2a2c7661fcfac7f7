"""Where each reproduction is documented: ``docs/reproductions/PAGE.md#ANCHOR`` in the repository.

Docstrings, claim statements and definitions refer to those pages by such repository paths (a test
checks that every one exists). :func:`ref` names a reproduction's own section (its heading is the
reproduction's name); the HTML report turns references into links (:func:`href`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tdyn import papers

DOCS_DIR = "docs/reproductions"
#: Web address of the repository tree that report links point into, ending in "/" (for example
#: "https://github.com/ORG/tdyn/blob/main/"). None: a report page inside the checkout links to the
#: pages by relative path, and one elsewhere shows the references as text.
DOCS_URL: str | None = None
#: A reference to a page (and heading) in text.
REF = re.compile(r"docs/reproductions/[a-z0-9_.-]+\.md(?:#[a-z0-9_-]+)?")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation other than ``-`` and ``_``
    dropped, spaces to hyphens (a repeated heading gets ``-1``, ``-2``, … from :func:`anchors`)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> list[str]:
    """The anchors of every heading of a Markdown text (fenced code skipped), in order."""
    out: list[str] = []
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r" {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            a = anchor(m.group(1))
            out.append(a if a not in seen else f"{a}-{seen[a]}")
            seen[a] = seen.get(a, 0) + 1
    return out


def ref(name: str) -> str | None:
    """``docs/reproductions/PAGE.md#ANCHOR`` of reproduction ``name`` (None for an unknown prefix)."""
    paper = papers.of(name)   # its paper's page in DOCS_DIR, from the manifest
    page = paper.docs if paper else None
    return f"{DOCS_DIR}/{page}#{anchor(name)}" if page else None


def repo_root() -> Path | None:
    """The checkout this tdyn is imported from, if it holds the pages (an installed wheel does not)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / DOCS_DIR).is_dir() else None


def href(reference: str, from_dir: Path) -> str | None:
    """A link for ``reference`` from a file in the directory ``from_dir``: into :data:`DOCS_URL` when
    set, else relative when ``from_dir`` lies inside the checkout that holds the pages, else None."""
    if DOCS_URL:
        return DOCS_URL + reference
    root = repo_root()
    if root is None:
        return None
    path, _, frag = reference.partition("#")
    base = Path(from_dir).resolve()
    if not (root / path).exists() or not base.is_relative_to(root):
        return None
    rel = Path(os.path.relpath(root / path, base)).as_posix()
    return rel + (f"#{frag}" if frag else "")
