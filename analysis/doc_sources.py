"""What every generated block of README.md and docs/*.md shares: reading a committed source file, and writing numbers.

A source is a committed JSON file named by its path from the repository root (results/bench/..., kernels/results/...,
results/published/<profile>/summary.json). A missing or unreadable one is a one-line :class:`SpecsweepError` that
names it and the command that writes it; ``python -m pipeline.analysis.docs`` adds the block's name.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from pipeline.errors import SpecsweepError


def read_source(root: Path, path: str, writer: str) -> dict:
    """The JSON at ``root / path``; ``writer`` is the command that writes it (said in the error when it is missing)."""
    full = Path(root) / path
    if not full.is_file():
        raise SpecsweepError(f"source {path} is missing: `{writer}` writes it, then commit it")
    try:
        return json.loads(full.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecsweepError(f"source {path} is not readable JSON ({' '.join(str(e).split())[:100]})") from None


def num(value: float, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals ("1.44")."""
    return f"{value:.{digits}f}"


def minus(value: float, digits: int = 2) -> str:
    """``value`` with the minus sign the pages use and no plus sign ("−20.0", "1.00")."""
    return num(value, digits).replace("-", "−")


def commit_text(commit: str | None, dirty: bool | None = False) -> str:
    """A commit as the pages name it: "1a2b3c4", "1a2b3c4 with local changes", or "an unknown commit"."""
    return (commit or "an unknown commit")[:7] + (" with local changes" if dirty else "")


def at_commit(provenance: dict) -> str:
    """" at 1a2b3c4" (or " at 1a2b3c4 with local changes") for a result's provenance; "" where it recorded no commit
    (run from an installed copy)."""
    commit = provenance.get("commit")
    return f" at {commit_text(commit['commit'], commit.get('dirty'))}" if commit else ""


def signed(value: float, digits: int = 2) -> str:
    """With its sign ("+0.09", "−0.72": the minus sign the pages use)."""
    text = f"{value:+.{digits}f}"
    return text.replace("-", "−")


def interval(median: float, low: float, high: float, digits: int = 2, suffix: str = "") -> str:
    """"1.44 [1.41, 1.56]" (``suffix`` after the median: "2.92x [2.29, 3.35]")."""
    return f"{num(median, digits)}{suffix} [{num(low, digits)}, {num(high, digits)}]"


def ci(record: dict, digits: int = 2, suffix: str = "") -> str:
    """A median-and-interval record of pipeline/measure.py ({"median", "ci_low", "ci_high"}) as :func:`interval`."""
    return interval(record["median"], record["ci_low"], record["ci_high"], digits, suffix)


def micros(seconds: float) -> str:
    """Seconds as µs with three significant figures at most ("24.6", "422", "1.1")."""
    us = seconds * 1e6
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"


def percent(fraction: float) -> str:
    """A fraction as the pages write a share: "4 %"."""
    return f"{fraction * 100:.0f} %"


def listing(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


WIDTH = 120                                   # the pages' line length
# a line that would start a list, a heading or a quote if a wrapped paragraph's line began with it
_UNBROKEN = "\x00=\x00"
_STARTS_BLOCK = re.compile(r"([-+*] |#|>|\d+[.)] )")


def prose(text: str) -> str:
    """A paragraph wrapped at :data:`WIDTH` columns; a bullet ("- ...") has its later lines indented two spaces."""
    bullet = text.startswith("- ")
    kept = text.replace(" = ", _UNBROKEN)          # "B = 128" stays on one line
    lines = [line.replace(_UNBROKEN, " = ") for line in
             textwrap.wrap(kept, WIDTH, subsequent_indent="  " if bullet else "", break_long_words=False,
                           break_on_hyphens=False)]
    for line in lines[1:]:
        if _STARTS_BLOCK.match(line.lstrip() if bullet else line):
            raise ValueError(f"a wrapped line would start a Markdown block: {line[:40]!r}; reword the text")
    return "\n".join(lines)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (an empty cell is written "| |")."""
    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])
