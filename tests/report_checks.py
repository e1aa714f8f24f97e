"""What a built report must hold for a reader, checked on its HTML and in a real headless
Chromium (Debian's chromium): no number in scientific notation, no raw Markdown or <pre> table,
every published column visible without scrolling sideways, every figure embedded with its SVG
beside it. Used on the tiny campaign's report (tests/workflow/test_report.py) and on reports
built in-process (tests/unit/test_report.py)."""

from __future__ import annotations

import html as htmllib
import json
import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
#: Columns whose values the report documents as written in scientific notation: none.
SCIENTIFIC_COLUMNS: frozenset[str] = frozenset()

_SCI = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+)?[eE][-+]?\d+(?![\w.])")
_TABLE = re.compile(r"<table[^>]*>(.*?)</table>", re.S)
_CELL = re.compile(r"<(td|th)[^>]*>(.*?)</\1>", re.S)
_TAG = re.compile(r"<[^>]+>")


def _text(cell: str) -> str:
    return htmllib.unescape(_TAG.sub("", cell)).strip()


def scientific_cells(page: str) -> list[str]:
    """Cells (``column: value``) written in scientific notation, outside ``SCIENTIFIC_COLUMNS``."""
    bad = []
    for table in _TABLE.findall(page):
        rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
        if not rows:
            continue
        head = [_text(c) for _, c in _CELL.findall(rows[0])]
        for row in rows[1:]:
            for i, (_, cell) in enumerate(_CELL.findall(row)):
                col = head[i] if i < len(head) else "?"
                if col not in SCIENTIFIC_COLUMNS and _SCI.search(_text(cell)):
                    bad.append(f"{col}: {_text(cell)}")
    return bad


def scientific_text(page: str) -> list[str]:
    """Numbers in scientific notation anywhere a reader sees text (tables, prose), outside
    code, the config's YAML, scripts and styles."""
    body = re.sub(r"<(script|style|pre|code)[^>]*>.*?</\1>", "", page, flags=re.S)
    text = htmllib.unescape(_TAG.sub(" ", body))
    return [m.group(0) for m in _SCI.finditer(text)]


def raw_markdown(page: str) -> list[str]:
    """Markdown shown as text: a <pre> other than the config's YAML, a pipe table's rule
    (``|---|``), a ``#`` heading at the start of a text line."""
    found = [m.group(0)[:80] for m in re.finditer(r"<pre(?! class=\"yaml\")[^>]*>", page)]
    body = re.sub(r"<pre class=\"yaml\">.*?</pre>", "", page, flags=re.S)
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", "", body, flags=re.S)
    text = _TAG.sub("\n", body)
    found += [m.group(0) for m in re.finditer(r"\|\s*:?-{3,}", text)]
    found += [line for line in text.splitlines() if re.match(r"\s*#{1,6} \S", line)]
    return found


def figures_without_svg(page: str, report_dir: Path) -> list[str]:
    """Embedded figures (by alt text) with no SVG link beside them, or whose SVG is missing."""
    bad = []
    for fig in re.findall(r"<figure>(.*?)</figure>", page, re.S):
        if 'src="data:image/png;base64,' not in fig:
            bad.append(f"not embedded: {fig[:80]}")
            continue
        alt = htmllib.unescape(re.search(r'alt="([^"]*)"', fig).group(1))
        link = re.search(r'<a class="svg" href="([^"]+)"', fig)
        if not link:
            bad.append(f"no SVG link: {alt}")
        elif not (report_dir / htmllib.unescape(link.group(1))).is_file():
            bad.append(f"SVG missing: {link.group(1)}")
    return bad


# After load: every <details> opened, then each published column's header checked against the
# visible box of the table's scroller and of the window (1400 px wide).
_PROBE = """<script>window.addEventListener('load', () => {
  document.querySelectorAll('details').forEach(d => d.open = true);
  const hidden = [];
  let n = 0;
  document.querySelectorAll('th.pub').forEach(th => {
    n += 1;
    const box = th.closest('.tbl') || document.body;
    const b = box.getBoundingClientRect(), r = th.getBoundingClientRect();
    const right = Math.min(b.left + box.clientWidth, window.innerWidth);
    if (r.right > right + 1 || r.width === 0) hidden.push(th.textContent);
  });
  document.body.setAttribute('data-probe', JSON.stringify({n: n, hidden: hidden}));
});</script>"""


def probe_page(report: Path, probe: str, tmp: Path) -> str:
    """The ``<body ...>`` tag of ``report`` after ``probe`` (a script appended to a copy of it)
    ran on load, in headless Chromium 1400 px wide."""
    page = tmp / "probe.html"
    page.write_text(report.read_text().replace("</body>", probe + "</body>"))
    proc = subprocess.run(
        [
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp / 'chromium-profile'}",
            "--window-size=1400,900",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert body, proc.stderr[-2000:]
    return body.group(1)


def hidden_published_columns(report: Path, tmp: Path) -> tuple[int, list[str]]:
    """(published column headers, those a reader cannot see without scrolling sideways),
    with every folded table opened, in headless Chromium 1400 px wide."""
    m = re.search(r"data-probe=\"([^\"]*)\"", probe_page(report, _PROBE, tmp))
    assert m, "the probe did not run"
    doc = json.loads(htmllib.unescape(m.group(1)))
    return doc["n"], doc["hidden"]
