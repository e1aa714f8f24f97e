"""The report as a reader meets it, measured in headless Chromium (Debian's /usr/bin/chromium):
its height at 1400 px wide and its size, before and after, and screenshots of its first screen
and of one section. Prints a Markdown table; the screenshots go beside it.

    python benchmarks/report_screens.py BEFORE.html AFTER.html --section allocation \
        --out OUT_PREFIX --stderr before=BEFORE_STDERR --stderr after=AFTER_STDERR

The table and the screenshots of the default campaign: benchmarks/results/report_first_hour.md.

A stderr capture of a `snakemake` run can be given too (--stderr LABEL=FILE, repeated): its
line count, longest line and lines over 1,000 characters are added to the table.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]
WIDTH, HEIGHT = 1400, 900


def _chromium(page: Path, tmp: Path, *args: str) -> str:
    proc = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp / 'profile'}",
            f"--window-size={WIDTH},{HEIGHT}",
            "--virtual-time-budget=8000",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.stdout


def _with_script(report: Path, tmp: Path, script: str, name: str) -> Path:
    page = tmp / name
    page.write_text(report.read_text().replace("</body>", f"<script>{script}</script></body>"))
    return page


def height(report: Path, tmp: Path) -> int:
    """The page's height in px at 1400 px wide."""
    js = (
        "window.addEventListener('load',()=>document.body.setAttribute('data-height',"
        "document.documentElement.scrollHeight));"
    )
    out = _chromium(_with_script(report, tmp, js, "height.html"), tmp, "--dump-dom")
    return int(re.search(r'data-height="(\d+)"', out).group(1))


def screenshot(report: Path, out: Path, tmp: Path, section: str | None = None) -> None:
    """The first screen (1400 x 900), or the first screen of one section (the others hidden)."""
    js = (
        "document.addEventListener('DOMContentLoaded',()=>{for(const e of "
        f"document.querySelectorAll('main > *')){{if(e.id!=='{section}')e.style.display='none';}}}});"
        if section
        else ""
    )
    page = _with_script(report, tmp, js, "shot.html")
    _chromium(page, tmp, f"--screenshot={out}")


def stderr_stats(path: Path) -> tuple[int, int, int]:
    """(lines, longest line, lines over 1,000 characters) of a captured stderr."""
    lines = path.read_text(errors="replace").splitlines()
    return len(lines), max(map(len, lines), default=0), sum(len(x) > 1000 for x in lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--section", default="allocation", help="the section to screenshot")
    ap.add_argument("--out", type=Path, required=True, help="prefix of the screenshots")
    ap.add_argument("--stderr", action="append", default=[], metavar="LABEL=FILE")
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = ["| report | height at 1400 px | size (bytes) |", "| --- | ---: | ---: |"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for label, report in (("before", args.before), ("after", args.after)):
            rows.append(
                f"| {label}: `{report}` | {height(report, tmp):,} | {report.stat().st_size:,} |"
            )
            screenshot(report, Path(f"{args.out}_{label}_first_screen.png"), tmp)
        screenshot(args.after, Path(f"{args.out}_after_{args.section}.png"), tmp, args.section)
    print("\n".join(rows))
    if args.stderr:
        print("\n| run | stderr lines | longest line | lines over 1,000 characters |")
        print("| --- | ---: | ---: | ---: |")
        for item in args.stderr:
            label, _, path = item.partition("=")
            n, longest, over = stderr_stats(Path(path))
            print(f"| {label} | {n:,} | {longest:,} | {over:,} |")


if __name__ == "__main__":
    main()
