"""`specsweep --help` and `python -m pipeline --help` (and the subcommands' help) load neither torch nor transformers:
each runs in a subprocess under `python -X importtime`, whose report names every module the process imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers")
SCRIPT = Path(sys.executable).parent / "specsweep"       # the console script pyproject.toml installs
HELPS = (["--help"], ["run", "--help"], ["tune", "--help"], ["bench", "--help"], ["bench", "kernels", "--help"],
         ["serve", "--help"], ["distill", "--help"])


def imported(argv: list[str]) -> set[str]:
    """Every module a fresh interpreter imports running ``argv`` (after ``python -X importtime``); the run must exit
    0 and print its help."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]
    rows = [line.split("|")[-1] for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return {row.strip() for row in rows[1:]}         # rows[0] is the report's header


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


@pytest.mark.parametrize("args", HELPS, ids=lambda a: " ".join(a))
def test_specsweep_help_imports_no_torch_or_transformers(args):
    if not SCRIPT.is_file():
        pytest.skip(f"no specsweep console script beside {sys.executable} (pip install -e . makes it)")
    modules = imported([str(SCRIPT), *args])
    assert "pipeline.cli" in modules                 # the report does list our own modules
    assert not heavy(modules), f"specsweep {' '.join(args)} imports {heavy(modules)[:5]}"


def test_python_m_pipeline_help_imports_no_torch_or_transformers():
    modules = imported(["-m", "pipeline", "--help"])
    assert "pipeline.cli" in modules
    assert not heavy(modules), f"python -m pipeline --help imports {heavy(modules)[:5]}"


def test_the_check_sees_torch_where_it_is_imported():
    assert "torch" in imported(["-c", "import torch, argparse; argparse.ArgumentParser().parse_args(['--help'])"])
