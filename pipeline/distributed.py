"""Data-parallel runs: one run's examples split over several processes, gathered into one results file.

``specsweep run --processes N`` starts ``accelerate launch --num_processes N -m pipeline run ...`` (:func:`launch`);
``accelerate launch -m pipeline run ...`` works as well. Inside, every process (rank k of N, from torchrun's
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``) runs on its own device (GPU k of the visible ones, or the CPU), decodes
examples k, k + N, k + 2N, ... (:meth:`World.shard`) with per-example randomness (pipeline/rng.py, so the tokens
do not depend on N), and sends its samples and totals to every rank (``torch.distributed.all_gather_object``:
gloo on CPU, NCCL on GPUs, set up by accelerate's ``PartialState``). Rank 0 puts the samples back in the original
order (:func:`unshard`), merges the totals exactly (:func:`merge_totals`: counts and histograms summed, the
quality pass's wall time the slowest rank's), scores the whole set once, runs the paired speed measurement alone
and writes the one results file.

A rank that fails still takes part in the gather, with its error and the examples it was on (:class:`Where`), so
every rank learns of it and the run fails with one line naming the rank and the example (:func:`gather_shares`);
rank 0 then writes nothing, and an earlier results file stays as it was.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.decoding.drafters.base import add_counts
from pipeline.decoding.drafters.cross_tokenizer import merge_statistics
from pipeline.errors import SpecsweepError
from pipeline.origins import merge_counts
from pipeline.tree_plan import add_node_counts

# Set by `specsweep run --processes N` for its ranks: the file rank 0 writes a failure's one-line message to.
ERROR_FILE_ENV = "SPECSWEEP_ERROR_FILE"


@dataclass(frozen=True)
class World:
    """This process's place in a data-parallel run: rank of size, and its rank on this machine (its GPU)."""

    rank: int
    size: int
    local_rank: int

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list) -> list:
        """This rank's share, deterministically: items rank, rank + size, rank + 2 size, ..."""
        return items[self.rank:: self.size]


def current_world() -> World | None:
    """The World of a process started by ``accelerate launch``/torchrun with more than one process; else None."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1:
        return None
    return World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))


def rank_device(world: World, requested: str) -> str:
    """The device of this rank: the CPU for --device cpu (or auto without a GPU), else GPU ``local_rank`` of the
    visible ones (CUDA_VISIBLE_DEVICES chooses which)."""
    import torch

    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if requested not in ("auto", "cuda"):
        raise SpecsweepError(f"--device {requested} with several processes: each process takes GPU k (its local "
                             "rank); use --device cuda or auto, and CUDA_VISIBLE_DEVICES to choose the GPUs")
    if not torch.cuda.is_available():
        raise SpecsweepError(f"--device {requested} asked for, but torch sees no CUDA GPU: use --device cpu or auto")
    if world.local_rank >= torch.cuda.device_count():
        raise SpecsweepError(f"rank {world.rank} is local rank {world.local_rank} but this machine shows "
                             f"{torch.cuda.device_count()} GPUs: start at most one process per GPU")
    return f"cuda:{world.local_rank}"


def start(device: str) -> None:
    """Join the run's process group (accelerate's PartialState: gloo on the CPU, NCCL on GPUs)."""
    from accelerate import PartialState

    PartialState(cpu=device == "cpu")


def finish() -> None:
    """Leave the process group, if this process joined one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class Where:
    """Which examples a rank is working on, for the error message if it fails."""

    def __init__(self) -> None:
        self.examples: list | None = None

    def on(self, records: list[dict]) -> None:
        self.examples = [r.get("id") for r in records]

    def describe(self) -> str:
        if not self.examples:
            return "before decoding"
        if len(self.examples) == 1:
            return f"on example {self.examples[0]!r}"
        return f"on a batch of examples {self.examples}"


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = text if isinstance(error, SpecsweepError) else f"{type(error).__name__}: {text}"
    return text if len(text) <= 400 else text[:397] + "..."


def gather_shares(world: World, work) -> tuple[object, list]:
    """Run ``work(where)`` -> (local, share) on this rank and gather every rank's share (picklable) to every rank.

    Returns (local, [share of rank 0, share of rank 1, ...]). If any rank raised, every rank raises a one-line
    SpecsweepError naming the first failed rank and the example it was on (all ranks reach the gather either way,
    so none waits for a rank that died of a Python error)."""
    import torch.distributed as dist

    where = Where()
    local = None
    try:
        local, share = work(where)
        payload = ("ok", share)
    except Exception as e:  # sent to every rank, re-raised below as one line
        payload = ("failed", f"rank {world.rank} of {world.size} failed {where.describe()}: {one_line(e)}")
    gathered: list = [None] * world.size
    dist.all_gather_object(gathered, payload)
    failed = [message for status, message in gathered if status == "failed"]
    if failed:
        raise SpecsweepError(failed[0])
    return local, [share for _, share in gathered]


def unshard(shares: list[list]) -> list:
    """Rank shares (rank k holds items k, k + N, ...) back in the original order."""
    size = len(shares)
    out: list = [None] * sum(len(s) for s in shares)
    for rank, share in enumerate(shares):
        out[rank::size] = share
    return out


def merge_totals(parts: list[dict]) -> dict:
    """Every rank's quality-pass totals (pipeline/runner.py ``_quality_pass``) as one run's: the wall time is the
    slowest rank's (the ranks run at once), phase times and calls, draft forwards, the accepted-count histogram,
    the per-node counts, token classes, cuts, the drafter's counts and a cross-tokenizer draft's statistics are
    summed, peak memory is the largest.
    ``rank_wall`` lists each rank's wall time."""

    merged = {"wall": max(p["wall"] for p in parts), "rank_wall": [p["wall"] for p in parts],
              "draft_forwards": sum(p["draft_forwards"] for p in parts), "peak": max(p["peak"] for p in parts),
              "phase_time": {}, "phase_calls": {}}
    for key in ("phase_time", "phase_calls"):
        for part in parts:
            for k, v in part[key].items():
                merged[key][k] = merged[key].get(k, 0) + v
    hists = [p["hist"] for p in parts if p.get("hist")]
    if hists:
        merged["hist"] = [sum(column) for column in zip(*hists)]
    for part in parts:
        if part.get("nodes"):
            merged["nodes"] = add_node_counts(merged.get("nodes"), part["nodes"])
    classes = [p["token_classes"] for p in parts if p.get("token_classes")]
    if classes:
        merged["token_classes"] = {}
        for counts in classes:
            merge_counts(merged["token_classes"], counts)
    for part in parts:
        merged["drafter_counts"] = add_counts(merged.get("drafter_counts"), part.get("drafter_counts"))
    bridges = [p["cross_tokenizer"] for p in parts if p.get("cross_tokenizer")]
    if bridges:

        merged["cross_tokenizer"] = merge_statistics(bridges)
    cuts = parts[0]["cuts"]
    for part in parts[1:]:
        cuts = cuts + part["cuts"]
    merged["cuts"] = cuts
    return merged


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(processes: int, args: list[str], port: int | None = None) -> list[str]:
    """``accelerate launch`` of ``python -m pipeline <args>`` in ``processes`` processes on this machine.

    accelerate's ``--cpu`` starts a single process (its multi-CPU mode needs MPI), so CPU ranks are started by the
    same torchrun launcher as GPU ranks (``--multi_gpu``) and join a gloo group (:func:`start`). A free port is
    picked, so two runs on one machine do not meet at accelerate's default port."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(port or _free_port()), "-m", "pipeline", *args]


def launch(processes: int, cpu: bool, args: list[str]) -> None:
    """Run ``specsweep <args>`` in ``processes`` ranks through accelerate, and wait. A rank's failure is raised
    here as its one-line SpecsweepError (rank 0 writes it to a file named in the ranks' environment)."""
    with tempfile.TemporaryDirectory(prefix="specsweep-ranks-") as tmp:
        error_file = Path(tmp) / "error.txt"
        env = {**os.environ, ERROR_FILE_ENV: str(error_file)}
        if cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks: the launcher must not hand out GPUs
        code = subprocess.run(launch_command(processes, args), env=env).returncode
        message = error_file.read_text(encoding="utf-8").strip() if error_file.exists() else ""
    if message:
        raise SpecsweepError(message)
    if code != 0:
        raise SpecsweepError(f"accelerate launch of {processes} processes exited with code {code} (a rank died: "
                             "see its output above)")


def report_failure(error: SpecsweepError) -> bool:
    """In a rank started by :func:`launch`: rank 0 records the run's one-line error for the launching process;
    returns True there (the rank then exits quietly and the launcher prints the line once)."""
    path = os.environ.get(ERROR_FILE_ENV)
    world = current_world()
    if not path or world is None:
        return False
    if world.main:
        Path(path).write_text(str(error), encoding="utf-8")
    return True
