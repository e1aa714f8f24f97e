"""mkdocs hook: a `\\|` inside a code span of a table row is GitHub's way to keep a pipe in a cell;
Python-Markdown keeps the backslash there (it ignores pipes in code spans anyway), so drop it."""

import re

CODE_SPAN = re.compile(r"`[^`\n]*`")


def on_page_markdown(markdown: str, **_) -> str:
    return "\n".join(
        CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
        if line.startswith("|")
        else line
        for line in markdown.split("\n")
    )
