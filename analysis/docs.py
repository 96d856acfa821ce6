"""`make docs` and `make check-docs`: the generated blocks of README.md and docs/*.md, rewritten from committed files.

A generated block is every line between a line ``<!-- BEGIN GENERATED name -->`` and the next line
``<!-- END GENERATED -->``. :data:`REGISTRY` maps each name to the function that renders it (the repository root ->
Markdown) from committed files only: the benchmarks' JSON (results/bench/, kernels/results/), the profiles'
published summaries (results/published/<profile>/summary.json, analysis/publish.py) and the paired comparisons of
results/published/trees/ (the trees profile, analysis/tree_blocks.py).

    python -m pipeline.analysis.docs            rewrite every block that differs (make docs)
    python -m pipeline.analysis.docs --check    exit 1 and print a unified diff per block that differs (make check-docs)

An unknown block name, a block without its end line, or a missing source is a one-line error with exit code 2.
How to add a block: docs/README.md, "Generated figures".
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.io import write_text_atomic

from . import bench_blocks, budgets, gpu_blocks, headline, run_tables, tree_blocks
from .run_tables import TABLES

BEGIN = re.compile(r"<!-- BEGIN GENERATED (\S+) -->")
END = "<!-- END GENERATED -->"

# block name -> its renderer (root -> Markdown, without the marker lines)
REGISTRY: dict[str, Callable[[Path], str]] = {
    # README.md
    "headline": headline.render,
    # docs/gpu.md
    "gpu-summary": gpu_blocks.gpu_summary,
    # docs/testing.md
    "budgets": budgets.render,
    # docs/benchmarks.md
    "bench-kernels-gpu": gpu_blocks.bench_kernels_gpu,
    "bench-kernels-trees-gpu": gpu_blocks.bench_kernels_trees,
    "bench-engine-gpu": gpu_blocks.bench_engine_gpu,
    "bench-redesign": bench_blocks.bench_redesign,
    "bench-engine-qwen": bench_blocks.bench_engine_qwen,
    "bench-forward-smollm2-cpu": bench_blocks.bench_forward_smollm2_cpu,
    "bench-forward-cuda": gpu_blocks.bench_forward_cuda,
    "bench-forward-qwen-cuda": gpu_blocks.bench_forward_qwen_cuda,
    "bench-forward-whisper-cpu": bench_blocks.bench_forward_whisper_cpu,
    "bench-forward-dtypes": bench_blocks.bench_forward_dtypes,
    "bench-forward-packed": bench_blocks.bench_forward_packed,
    "bench-bf16-linear": bench_blocks.bench_bf16_linear,
    "bench-forward-few-rows": bench_blocks.bench_forward_few_rows,
    "bench-forward-amx": bench_blocks.bench_forward_amx,
    "bench-host": bench_blocks.bench_host,
    "bench-host-gpu": gpu_blocks.bench_host_gpu,
    "bench-block-gain": bench_blocks.bench_block_gain,
    "bench-distortion-qwen": bench_blocks.bench_distortion_qwen,
    "llama-cpp-rules-t1": bench_blocks.bench_rules_t1,
    "llama-cpp-quant-target": bench_blocks.bench_quant_target,
    "llama-cpp-quant-target-projections": bench_blocks.bench_quant_target_projections,
    "bench-replay-qwen": bench_blocks.bench_replay_qwen,
    "bench-replay-draft": bench_blocks.bench_replay_draft,
    "bench-deterministic-cpu": bench_blocks.bench_deterministic_cpu,
    "bench-deterministic-gpu": gpu_blocks.bench_deterministic_gpu,
    "bench-lossless-cpu": bench_blocks.bench_lossless_cpu,
    "bench-processes": bench_blocks.bench_processes,
    # docs/measurement.md
    "bench-omp-wait": bench_blocks.bench_omp_wait,
    "bench-quant-linear": bench_blocks.bench_quant_linear,
    "bench-quant-linear-prefill": bench_blocks.bench_quant_linear_prefill,
    "bench-quant-forward": bench_blocks.bench_quant_forward,
    # docs/serve.md
    "serve-toy": bench_blocks.serve_toy,
    "serve-smollm2": bench_blocks.serve_smollm2,
    # docs/trees.md
    "trees-lookup": tree_blocks.lookup_trees,
    # docs/gpu.md
    "gpu-machine": gpu_blocks.gpu_machine,
    "gpu-kernels": gpu_blocks.gpu_kernels_bullet,
    "gpu-host": gpu_blocks.gpu_host_bullet,
    "gpu-forward": gpu_blocks.gpu_forward_bullet,
    "gpu-lossless": gpu_blocks.gpu_lossless_bullet,
    "pair-provenance": run_tables.provenance("pair"),
    "pair-spec-bench-provenance": run_tables.provenance("pair-spec-bench"),
    "pair-spec-bench-categories-provenance": run_tables.provenance("pair-spec-bench-categories"),
    "pair-sigmoid-provenance": run_tables.provenance("pair-sigmoid"),
    "pair-sigmoid-study": run_tables.sigmoid_study,
    "real-provenance": run_tables.provenance("real"),
    "llama-cpp-provenance": run_tables.provenance("llama-cpp"),
    "toy-provenance": run_tables.provenance("default"),
    # tables of run results, from results/published/<profile>/ (analysis/run_tables.py)
    **{t.name: t.render for t in TABLES},
}


@dataclass(frozen=True)
class Block:
    name: str
    first: int      # index of the first line inside the block (after BEGIN)
    end: int        # index of the END line


def documents(root: Path) -> list[Path]:
    """The pages that may hold generated blocks: README.md and docs/*.md."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def find_blocks(lines: list[str], where: str) -> list[Block]:
    """The generated blocks of a page's ``lines`` (``where``: its name, for errors)."""
    blocks, open_at, name = [], None, None
    for i, line in enumerate(lines):
        begin = BEGIN.fullmatch(line.strip())
        if begin:
            if open_at is not None:
                raise SpecsweepError(f"{where}:{i + 1}: a BEGIN GENERATED inside block {name!r}: close it first")
            open_at, name = i, begin.group(1)
            if name not in REGISTRY:
                raise SpecsweepError(f"{where}:{i + 1}: unknown generated block {name!r}: name one of "
                                     "analysis/docs.py's REGISTRY or add it there")
        elif line.strip() == END:
            if open_at is None:
                raise SpecsweepError(f"{where}:{i + 1}: an END GENERATED without a BEGIN GENERATED")
            blocks.append(Block(name, open_at + 1, i))
            open_at = None
        elif "GENERATED" in line and line.lstrip().startswith("<!--"):
            raise SpecsweepError(f"{where}:{i + 1}: not a generated-block marker: write "
                                 f"`<!-- BEGIN GENERATED name -->` or `{END}` on a line of its own")
    if open_at is not None:
        raise SpecsweepError(f"{where}:{open_at + 1}: block {name!r} has no `{END}` line")
    return blocks


def render_all(root: Path, names: set[str]) -> dict[str, str]:
    """{name: the block's Markdown} for ``names``."""
    out = {}
    for name in sorted(names):
        try:
            out[name] = REGISTRY[name](root).rstrip("\n")
        except SpecsweepError as e:
            raise SpecsweepError(f"block {name}: {e}") from None
    return out


def rewrite(text: str, where: str, rendered: dict[str, str]) -> tuple[str, list[tuple[str, list[str], list[str]]]]:
    """``text`` with every block replaced by ``rendered[name]``, and the blocks that differed:
    [(name, lines now, lines generated)]."""
    lines = text.split("\n")
    out, last, changed = [], 0, []
    for b in find_blocks(lines, where):
        new = rendered[b.name].split("\n")
        old = lines[b.first:b.end]
        if old != new:
            changed.append((b.name, old, new))
        out += lines[last:b.first] + new
        last = b.end
    return "\n".join(out + lines[last:]), changed


def block_names(root: Path) -> set[str]:
    """Every block name the pages use."""
    return {b.name for page in documents(root) for b in
            find_blocks(page.read_text(encoding="utf-8").split("\n"), str(page.relative_to(root)))}


def run(root: Path, check: bool) -> int:
    """Rewrite (or with ``check``, compare) every page's blocks; the exit code (0, or 1 where a block differs)."""
    rendered = render_all(root, block_names(root))
    differing = 0
    for page in documents(root):
        where = str(page.relative_to(root))
        text = page.read_text(encoding="utf-8")
        new, changed = rewrite(text, where, rendered)
        for name, old, gen in changed:
            differing += 1
            if check:
                print(f"{where}: block {name} differs from what `make docs` writes:")
                sys.stdout.writelines(line + "\n" for line in difflib.unified_diff(
                    old, gen, f"{where} ({name}, as committed)", f"{where} ({name}, generated)", lineterm=""))
        if changed and not check:
            write_text_atomic(page, new)
            print(f"rewrote {where}: {', '.join(name for name, _, _ in changed)}")
    if check and differing:
        print(f"{differing} generated block(s) differ: run `make docs` and commit the result")
        return 1
    print(f"docs: {len(rendered)} generated blocks {'checked' if check else 'written'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.analysis.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block differs")
    parser.add_argument("--root", default=".", help="the repository root (default: the working directory)")
    args = parser.parse_args(argv)
    try:
        return run(Path(args.root), args.check)
    except SpecsweepError as e:
        print(f"docs: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
