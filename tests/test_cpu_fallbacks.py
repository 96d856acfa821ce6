"""Without a C++ compiler a run still completes on torch's products, gives the target alone's tokens at T = 0, and
its results say which path each forward took and why it fell back (``resolved.fallbacks``, pipeline/stack.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tiny_models import save_pair, write_prompts

from pipeline.decoding.static import packed


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("fallbacks")
    target, draft = save_pair(root, kind="llama", width=128)   # int4 groups inputs by 128
    return target, draft, write_prompts(root / "prompts.jsonl")


@pytest.mark.slow
def test_a_run_without_a_compiler_completes_and_says_why(pair, tmp_path):
    target, draft, data = pair
    bin_dir = tmp_path / "bin"      # a PATH holding only this Python: no c++, no g++
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "SPECSWEEP_CPU_KERNELS")}
    env.update(PATH=str(bin_dir), SPECSWEEP_CACHE_DIR=str(tmp_path / "cache"))   # no kernel built before either
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--target", str(target), "--draft", str(draft),
                           "--data", str(data), "--dtype", "bfloat16", "--draft-quant", "int4", "--gamma", "3",
                           "--temperature", "0", "--max-new-tokens", "12", "--repeats", "3", "--no-progress",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    resolved = result["resolved"]
    assert resolved["forward"] == {"target": "static", "draft": "static"}
    assert resolved["quant_kernel"]["draft"] == "torch" and "draft" not in resolved["row_kernel"]
    why = resolved["fallbacks"]["draft"]       # int4 without our kernels: the compiler, or this CPU's flags
    assert why == "no C++ compiler (set CXX or install g++)" or why.startswith("this CPU lacks"), why
    packed_why = packed.unavailable_reason("cpu", packed.torch.bfloat16)
    assert resolved["fallbacks"]["target"] == (packed_why or why)      # unpacked here, or packed without our kernel
    agreement = result["metrics"]["greedy_agreement"]
    assert agreement["identical"] == agreement["samples"] > 0, agreement
