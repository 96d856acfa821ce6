"""Each test file's seconds in one `make test`, so the slowest files start first (tests/conftest.py).

pytest-xdist's ``--dist loadfile`` hands whole files to the workers in the order they were collected; with the
files in alphabetical order a long file that starts late leaves the other workers idle at the end. Collected
longest first, the workers finish together. Refresh the table after adding or slowing a test:

    .venv/bin/python -m pytest -n auto --maxprocesses 4 --dist loadfile --durations=0 -q > durations.log
    .venv/bin/python tests/file_durations.py durations.log

A file not in the table is collected after those that are, in its usual order; the table changes only the order.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_name("file_durations.json")
LINE = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(tests/[^:\s]+\.py)")


def seconds_by_file(log: str) -> dict[str, float]:
    """{test file: seconds} summed over the setup, call and teardown lines of pytest's ``--durations=0`` report."""
    total: Counter = Counter()
    for m in LINE.finditer(log):
        total[Path(m.group(2)).name] += float(m.group(1))
    return {name: round(s, 1) for name, s in total.most_common()}


def load() -> dict[str, float]:
    return json.loads(TABLE.read_text()) if TABLE.is_file() else {}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/file_durations.py DURATIONS_LOG (the output of pytest --durations=0)")
    table = seconds_by_file(Path(sys.argv[1]).read_text())
    if not table:
        sys.exit(f"{sys.argv[1]}: no duration lines: run pytest with --durations=0 and pass its output")
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE}: {len(table)} files, {sum(table.values()):.0f} s in all")
