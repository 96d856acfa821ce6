"""How long the three commands take against their budgets: timed here, kept in results/published/budgets.json.

    python -m pipeline.analysis.budgets time "make test" --cwd CLONE -- make test

runs the command in ``CLONE`` (a fresh clone, set up: `make setup`), times it from outside (wall seconds from start to
exit, and the load average before and after: an idle machine's is near 0), and records it under its name with the
budget, the date, the machine and the clone's commit. A command that fails is recorded as failed and the file still
written (its time says how far it got). A run timed by another tool can be added from GNU time's verbose log
(``/usr/bin/time -v CMD 2> LOG``): ``record NAME --time-log LOG --cwd CLONE --date ISO``.

docs/testing.md's generated block ``budgets`` renders the table (``make docs``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from pipeline.env_info import git_commit, machine
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic

from .doc_sources import read_source, table
from .run_tables import short_cpu

PATH = "results/published/budgets.json"
BUDGETS = {"make": 480, "make test": 600, "make test-all": 1200, "make profile PROFILE=real": 2400}     # seconds
WHAT = {"make": "`dvc repro` of the default profile (toy pairs), from no data, models or results",
        "make test": "the test suite but the tests marked slow (`python -m pytest -m 'not slow'`, parallel workers)",
        "make test-all": "every test, the slow ones too: what CI runs",
        "make profile PROFILE=real": "`dvc repro` of the real profile (pretrained models), from no data, models or "
                                     "results"}


def _load(root: Path) -> dict:
    full = Path(root) / PATH
    if not full.is_file():
        return {"published": "how long the three commands took against their budgets, each timed by "
                             "`python -m pipeline.analysis.budgets` in a fresh clone after `make setup`",
                "commands": {}}
    return read_source(root, PATH, "python -m pipeline.analysis.budgets")


def _entry(name: str, seconds: float, returncode: int, cwd: Path, date: str, load: dict) -> dict:
    if name not in BUDGETS:
        raise SpecsweepError(f"no budget for {name!r}: name one of {', '.join(BUDGETS)}")
    commit = git_commit(cwd)
    return {"seconds": round(seconds, 1), "budget_seconds": BUDGETS[name], "within": seconds <= BUDGETS[name],
            "returncode": returncode, "date": date, "commit": commit["commit"], "dirty": commit["dirty"],
            "machine": machine(), "load_average": load}


def save(root: Path, name: str, entry: dict) -> Path:
    """Add or replace ``name``'s entry in results/published/budgets.json (atomically)."""
    data = _load(root)
    data["commands"][name] = entry
    return write_json_atomic(Path(root) / PATH, data)


def time_command(name: str, command: list[str], cwd: Path) -> dict:
    """Run ``command`` in ``cwd``; its entry (wall seconds, exit status, load averages before and after)."""
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    before = os.getloadavg()
    start = time.perf_counter()
    returncode = subprocess.call(command, cwd=cwd)
    seconds = time.perf_counter() - start
    return _entry(name, seconds, returncode, cwd, date, {"before": list(before), "after": list(os.getloadavg())})


def from_time_log(name: str, log: Path, cwd: Path, date: str) -> dict:
    """The entry of a run GNU time timed (``/usr/bin/time -v``): its wall-clock time and exit status."""
    text = log.read_text(encoding="utf-8", errors="replace")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    status = re.search(r"Exit status: (\d+)", text)
    if not wall:
        raise SpecsweepError(f"{log} holds no GNU time wall-clock line: time the command with `/usr/bin/time -v`")
    seconds = 0.0
    for part in wall.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    return _entry(name, seconds, int(status.group(1)) if status else -1, cwd, date, {})


def _minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s"


def render(root: Path) -> str:
    """docs/testing.md's table: each command, what it does, its budget, the time measured, when, where and at which
    commit."""
    commands = _load(root)["commands"]
    if not commands:
        raise SpecsweepError(f"{PATH} holds no timings: `python -m pipeline.analysis.budgets time ...` writes them")
    rows = []
    for name in BUDGETS:
        e = commands.get(name)
        if e is None:
            rows.append([f"`{name}`", WHAT[name], _minutes(BUDGETS[name]), "not measured", "", ""])
            continue
        took = _minutes(e["seconds"]) + ("" if e["returncode"] == 0 else f" (failed: exit {e['returncode']})")
        verdict = "within" if e["within"] and e["returncode"] == 0 else "**over**" if not e["within"] else "failed"
        where = f"{e['date'][:10]}, {short_cpu(e['machine']['cpu'])} ({e['machine']['cores']} cores), at " \
                f"{(e['commit'] or 'an unknown commit')[:7]}"
        rows.append([f"`{name}`", WHAT[name], _minutes(BUDGETS[name]), took, verdict, where])
    return table(["command", "what it runs", "budget", "took", "", "measured"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.analysis.budgets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    t = sub.add_parser("time", help="time a command and record it")
    t.add_argument("name", help=f"one of: {', '.join(BUDGETS)}")
    t.add_argument("--cwd", type=Path, required=True, help="where to run it (a fresh clone after `make setup`)")
    r = sub.add_parser("record", help="record a run GNU time timed")
    r.add_argument("name", help=f"one of: {', '.join(BUDGETS)}")
    r.add_argument("--time-log", type=Path, required=True, help="the stderr of `/usr/bin/time -v CMD`")
    r.add_argument("--cwd", type=Path, required=True, help="the clone it ran in")
    r.add_argument("--date", required=True, help="when it started (ISO 8601, UTC)")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository to record into (default: .)")
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    try:
        if args.action == "time":
            if not command:
                raise SpecsweepError("give the command to time after --, e.g. `... time make --cwd CLONE -- make`")
            entry = time_command(args.name, command, args.cwd)
        else:
            entry = from_time_log(args.name, args.time_log, args.cwd, args.date)
        out = save(args.root, args.name, entry)
    except SpecsweepError as e:
        print(f"budgets: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.name}: {_minutes(entry['seconds'])} (budget {_minutes(BUDGETS[args.name])}, exit "
          f"{entry['returncode']}); wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
