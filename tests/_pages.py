"""The code blocks of a section of a docs page, as the page shows them: tests run the
pages' examples (docs/*.md) so that they cannot drift from the code."""

from __future__ import annotations

import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def section_blocks(page: str, heading: str, langs: tuple[str, ...] = ("python",)) -> list[str]:
    """The fenced blocks of ``langs`` in the section of docs/``page`` that starts at the
    heading ``## heading``, in page order."""
    section = (DOCS / page).read_text().split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    fence = "|".join(map(re.escape, langs))
    return re.findall(rf"^```(?:{fence})\n(.*?)^```$", section, flags=re.M | re.S)
