"""The documentation reads in short blocks: every prose paragraph and list item of docs/
counted in words, median at most 35 and none over 150 (tables, code and headings aside)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
MEDIAN_WORDS, MAX_WORDS = 35, 150
ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def blocks(text: str) -> list[str]:
    """Prose blocks of a markdown page: paragraphs, and each list item with its continuation
    lines; code fences, tables, headings, HTML comments, admonition markers and indented code
    left out."""
    out: list[str] = []
    cur: list[str] = []
    fence = False

    def flush() -> None:
        if cur:
            out.append(" ".join(cur))
            cur.clear()

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("```"):
            fence = not fence
            flush()
            continue
        if (
            fence
            or not s
            or s.startswith(("#", "|", "<!--", "!!!", "--8<--"))
            or (line.startswith("    ") and not cur and not ITEM.match(line))
        ):
            flush()
            continue
        if ITEM.match(line):
            flush()
            cur.append(ITEM.sub("", line).strip())
            continue
        cur.append(s)
    flush()
    return out


def word_counts() -> list[tuple[int, str, str]]:
    return [
        (len(b.split()), page.name, b[:80])
        for page in sorted(DOCS.glob("*.md"))
        for b in blocks(page.read_text())
    ]


def test_paragraphs_are_short():
    counts = word_counts()
    assert counts
    median = statistics.median(n for n, _, _ in counts)
    assert median <= MEDIAN_WORDS, f"median prose block is {median} words (at most {MEDIAN_WORDS})"
    long = [f"{page}: {n} words: {start}..." for n, page, start in counts if n > MAX_WORDS]
    assert not long, "prose blocks over 150 words:\n" + "\n".join(long)


def test_the_counter_sees_paragraphs_and_items():
    text = "# T\n\nOne two three\nfour.\n\n- item one\n  more\n- two\n\n```\ncode code\n```\n| a | b |\n"
    assert [len(b.split()) for b in blocks(text)] == [4, 3, 1]
