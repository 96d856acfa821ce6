"""analysis/budgets.py: the three commands' timings against their budgets, recorded and rendered."""

import json
import subprocess
import sys

import pytest

from pipeline.analysis import budgets
from pipeline.errors import SpecsweepError

TIME_LOG = """\tCommand being timed: "make profile PROFILE=real"
\tUser time (seconds): 3000.10
\tElapsed (wall clock) time (h:mm:ss or m:ss): 0:41:05.50
\tExit status: 0
"""


def test_a_timed_command_is_recorded_with_its_exit_status_and_the_table_says_within_or_over(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    fast = budgets.time_command("make", [sys.executable, "-c", "import time; time.sleep(0.3)"], tmp_path)
    assert 0 < fast["seconds"] < budgets.BUDGETS["make"] and fast["within"] and fast["returncode"] == 0
    budgets.save(tmp_path, "make", fast)
    failed = budgets.time_command("make test", [sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path)
    assert failed["returncode"] == 3
    budgets.save(tmp_path, "make test", failed)
    log = tmp_path / "time.log"
    log.write_text(TIME_LOG)
    slow = budgets.from_time_log("make profile PROFILE=real", log, tmp_path, "2026-11-27T17:28:29Z")
    assert slow["seconds"] == pytest.approx(41 * 60 + 5.5) and not slow["within"] and slow["returncode"] == 0
    budgets.save(tmp_path, "make profile PROFILE=real", slow)
    # the command line: what follows -- is the command, options before it are the tool's
    assert budgets.main(["--root", str(tmp_path), "time", "make", "--cwd", str(tmp_path), "--",
                         sys.executable, "-c", "import time; time.sleep(0.2)"]) == 0
    saved = json.loads((tmp_path / budgets.PATH).read_text())
    assert set(saved["commands"]) == {"make", "make test", "make profile PROFILE=real"}
    rows = {line.split("|")[1].strip(): line for line in budgets.render(tmp_path).splitlines()[2:]}
    assert "within" in rows["`make`"] and "failed: exit 3" in rows["`make test`"]
    assert "41 min 06 s" in rows["`make profile PROFILE=real`"] and "**over**" in rows["`make profile PROFILE=real`"]


def test_a_log_without_gnu_times_line_and_an_unknown_command_are_one_line_errors(tmp_path):
    log = tmp_path / "time.log"
    log.write_text("real 1m2s\n")
    with pytest.raises(SpecsweepError, match="no GNU time wall-clock line"):
        budgets.from_time_log("make", log, tmp_path, "2026-11-27")
    with pytest.raises(SpecsweepError, match="no budget for 'make docs'"):
        budgets.time_command("make docs", [sys.executable, "-c", "pass"], tmp_path)
