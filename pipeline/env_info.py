"""Where a number came from, recorded in every results file: device, driver and library versions (provenance), and
how busy the machine was around a measurement and which thread settings it used (LoadProbe, ThreadSettings)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

_PACKAGES = ("specsweep", "torch", "transformers", "tokenizers", "numpy", "scipy", "cupy-cuda13x", "cupy-cuda12x",
             "datasets", "huggingface_hub", "pyarrow", "soundfile", "rouge_score", "jiwer", "wandb", "optuna", "dvc")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def device_info(device: str = "cpu") -> dict[str, str | int | None]:
    import torch

    info: dict[str, str | int | None] = {"device": str(device), "cpu": platform.processor() or platform.machine(),
                                         "cpu_model": cpu_model(), "cpu_threads": torch.get_num_threads()}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    compute_capability=f"{props.major}.{props.minor}", cuda_runtime=torch.version.cuda,
                    gpu_count=torch.cuda.device_count())
        try:
            import subprocess

            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                text=True, timeout=10).stdout.strip().splitlines()[0]
        except Exception:  # nvidia-smi absent or unusable: the driver stays unrecorded
            info["driver"] = None
    return info


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo's "model name"), else what platform reports (e.g. "x86_64")."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """The names of the machine's NVIDIA GPUs from nvidia-smi, without importing torch; [] where there is none (or
    no nvidia-smi)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def machine() -> dict:
    """The machine, for a file that publishes results: {"cpu": model name, "cores": logical cores, "gpus": [names]}.
    Needs no torch (unlike :func:`device_info`)."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "gpus": gpu_names()}


def git_commit(root: str | os.PathLike = ".", ignore: tuple[str, ...] = ()) -> dict:
    """The checkout's commit: {"commit": sha or None (not a git checkout, or no git), "dirty": whether tracked files
    differ from it anywhere in the checkout, also when ``root`` is a folder inside it (None where unknown)}; changes
    under the ``ignore`` paths (relative to the checkout's top) do not count."""
    import subprocess

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                                  check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ":/",
                 *(f":(top,exclude){path}" for path in ignore)) if sha else None
    return {"commit": sha.strip() if sha else None, "dirty": None if status is None else bool(status.strip())}


NOT_CODE = ("results", "docs", "*.md")
"""Paths whose changes do not make a checkout's code dirty (:func:`code_commit`): results, and the pages that
``make docs`` rewrites from them."""


def code_commit() -> dict | None:
    """The commit of the checkout this specsweep runs from ({"commit", "dirty"}, as :func:`git_commit`; changes under
    NOT_CODE do not count), or None where it runs from an installed copy rather than a git checkout."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():     # a wheel in site-packages: a repository above it is not its source
        return None
    return git_commit(root, ignore=NOT_CODE)


def provenance(device: str = "cpu") -> dict:
    """Everything a results file records about where and when it was measured; ``commit``: the code's commit
    (:func:`code_commit`), so a published record says which code measured it, whenever it is published."""
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "commit": code_commit(), "versions": versions(), "device": device_info(device)}


# ---------------------------------------------------------------------------------------------- load and threads

def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; the machine's count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def cpu_burners(n: int, seconds: float):
    """``n`` processes that spin on a CPU until ``seconds`` have passed or the block ends (then killed): other work on
    the machine, for measuring what contention does (tests/test_paired.py, pipeline/benchmarks/omp_wait.py)."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


def default_threads() -> int:
    """torch's intra-op threads when the run does not set them: half the usable cores (at least 1, at most 8).

    An intra-op pool as large as the machine stalls whenever other work takes a core: each parallel region waits
    for its slowest worker, and a descheduled worker holds up all the others (docs/measurement.md has
    the measurements). Half the cores leaves room for other work. ``--threads`` overrides it; the run records
    what it used."""
    return max(1, min(8, usable_cores() // 2))


OMP_SPIN_COUNT = 10000
"""The spins an idle OpenMP worker waits before it sleeps (GOMP_SPINCOUNT; libgomp reckons 100,000 spins a millisecond,
so about 0.1 ms): long enough to span the gap between two of a forward's parallel regions, short enough that a
worker whose partner was descheduled soon gives its core back. `python -m pipeline.benchmarks.omp_wait` measures it
(docs/measurement.md)."""


def bounded_omp_wait() -> None:
    """Let idle OpenMP workers spin OMP_SPIN_COUNT times before they sleep (GOMP_SPINCOUNT), unless OMP_WAIT_POLICY
    or GOMP_SPINCOUNT is set.

    libgomp's default spins 300,000 times (about 3 ms): on an oversubscribed machine the spinning workers take the
    cores the worker they wait for needs (the stalls of issue 14). Sleeping at once (OMP_WAIT_POLICY=PASSIVE)
    avoids that but pays a futex wake-up at each of a forward's hundreds of parallel regions: a third of an int4
    draft's forward on this CPU. torch's OpenMP runtime (libgomp) reads the variables once, when it is loaded:
    this only works before torch is imported, so the CLI calls it first thing."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", str(OMP_SPIN_COUNT))


def omp_wait_label(env: dict) -> str:
    """What idle OpenMP workers did in a run whose thread environment was ``env`` (a results file's
    ``measurement.threads.env``): "GOMP_SPINCOUNT=N", "OMP_WAIT_POLICY=P" (with the spin count if both were set) or
    "libgomp's default"."""
    said = [f"{k}={env[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in env]
    return ", ".join(said) or "libgomp's default"


@dataclass
class ThreadSettings:
    """torch's thread pools for one run. intra/inter: int >= 1 (None = leave torch's choice)."""

    intra: int | None
    inter: int | None

    def apply(self) -> dict:
        """Set torch's intra-op (any time) and inter-op threads (only before the first parallel work: once per
        process; a later different value is recorded as not applied); returns what is in force, with the
        thread-related environment."""
        import torch

        applied_inter = True
        if self.intra is not None:
            torch.set_num_threads(self.intra)
        if self.inter is not None and torch.get_num_interop_threads() != self.inter:
            try:
                torch.set_num_interop_threads(self.inter)
            except RuntimeError:  # torch allows it once, before inter-op work has started
                applied_inter = False
        return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
                "requested_intra_op": self.intra, "requested_inter_op": self.inter,
                "inter_op_applied": applied_inter, "usable_cores": usable_cores(),
                "env": {k: os.environ[k] for k in _THREAD_ENV if k in os.environ}}


_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "GOMP_SPINCOUNT")


def thread_schedstats(children: tuple[int, ...] = ()) -> dict[str, tuple[int, int]] | None:
    """{"pid/tid": (ns on a CPU, ns runnable but waiting for a CPU)} for every thread of this process and of the
    processes ``children`` (a run's own servers, e.g. llama.cpp's), from the Linux scheduler's
    /proc/<pid>/task/<tid>/schedstat; None where the kernel does not provide it (not Linux, or built without scheduler
    statistics)."""
    out = {}
    for pid in ("self", *map(str, children)):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    on_cpu, waiting = f.read().split()[:2]
            except (OSError, ValueError):  # the thread ended meanwhile, or no scheduler statistics
                continue
            out[f"{pid}/{tid}"] = (int(on_cpu), int(waiting))
    return out or None


def runqueue_wait(before: dict[str, tuple[int, int]] | None,
                  after: dict[str, tuple[int, int]] | None) -> dict | None:
    """Of the time this process's threads were ready to run between two :func:`thread_schedstats`, the part they
    spent waiting for a CPU: {"on_cpu_s", "waiting_s", "wait_fraction" = waiting / (on CPU + waiting)}. Threads
    that started in between count from zero; None where either snapshot is missing or nothing ran."""
    if before is None or after is None:
        return None
    on_cpu = sum(a[0] - before.get(tid, (0, 0))[0] for tid, a in after.items())
    waiting = sum(a[1] - before.get(tid, (0, 0))[1] for tid, a in after.items())
    ready = on_cpu + waiting
    if ready <= 0:
        return None
    return {"on_cpu_s": on_cpu / 1e9, "waiting_s": waiting / 1e9, "wait_fraction": waiting / ready}


OWN_PROCESSES: set[int] = set()
"""Processes whose work is the run's own (an engine's server: pipeline/decoding/llama_cpp/server.py), registered while
they live by :func:`count_as_own`: a :class:`LoadProbe` counts their CPU time and run-queue wait as the run's, not as
other processes' load. Other children (e.g. :func:`cpu_burners`) stay other processes."""


def count_as_own(pid: int, own: bool = True) -> None:
    """Register (``own``) or unregister the process ``pid`` as part of the run (:data:`OWN_PROCESSES`)."""
    (OWN_PROCESSES.add if own else OWN_PROCESSES.discard)(pid)


class LoadProbe:
    """How busy the machine is around a measurement: load average against cores at start and end, the CPU
    time other processes used in between (system-wide busy time minus the run's own, from psutil, so processes that
    started or ended meanwhile count too; the run's own: this process and :data:`OWN_PROCESSES`), how long the run's
    own threads waited for a CPU
    while ready to run (the Linux scheduler's run-queue wait: the direct sign that the measurement competed for
    cores), plus GPU utilisation and other processes on the GPU where nvidia-smi can tell.

    >>> probe = LoadProbe("cpu"); ...; record = probe.finish()
    record: {"start": {...}, "end": {...}, "seconds", "others_cpu_s", "others_busy_cores", "cores",
             "runqueue_wait": {"on_cpu_s", "waiting_s", "wait_fraction"} or None}
    """

    def __init__(self, device: str = "cpu") -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self.device = str(device)
        self.start = self.snapshot()
        children = self._children()
        self._sched0 = thread_schedstats(children)
        self._t0, self._busy0, self._own0 = time.perf_counter(), self._busy_s(), self._own_s(children)

    @staticmethod
    def _children() -> tuple[int, ...]:
        """The pids of the run's own servers now (:func:`count_as_own`: llama.cpp's start on first use)."""
        return tuple(sorted(OWN_PROCESSES))

    def _busy_s(self) -> float:
        t = self._psutil.cpu_times()
        return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))

    def _own_s(self, children: tuple[int, ...]) -> float:
        """This process's CPU seconds and those of ``children`` (a run's own servers, e.g. llama.cpp's,
        pipeline/decoding/llama_cpp/: their work is the run's, not another process's)."""
        t = self._me.cpu_times()
        own = t.user + t.system
        for pid in children:
            try:
                c = self._psutil.Process(pid).cpu_times()
            except self._psutil.Error:      # it ended meanwhile: its last seconds are lost to "others"
                continue
            own += c.user + c.system
        return own

    def snapshot(self) -> dict:
        """Load averages (1, 5, 15 min), per usable core, and the GPU's state (None where unreadable)."""
        try:
            load = list(os.getloadavg())
        except OSError:
            load = None
        cores = usable_cores()
        return {"loadavg": load, "loadavg_per_core": load[0] / cores if load else None,
                "gpu": gpu_activity(self.device)}

    def finish(self) -> dict:
        seconds = time.perf_counter() - self._t0
        children = self._children()     # a child started meanwhile counts whole, one that ended is lost to others
        others = max(0.0, (self._busy_s() - self._busy0) - (self._own_s(children) - self._own0))
        wait = runqueue_wait(self._sched0, thread_schedstats(children))
        return {"start": self.start, "end": self.snapshot(), "seconds": seconds, "cores": usable_cores(),
                "others_cpu_s": others, "others_busy_cores": others / seconds if seconds > 0 else None,
                "runqueue_wait": wait}


def gpu_activity(device: str) -> dict | None:
    """For a CUDA device: utilisation (%) and the compute processes on it other than this one (pids and MiB),
    from nvidia-smi; None on a CPU or where nvidia-smi cannot tell."""
    if not str(device).startswith("cuda"):
        return None
    import subprocess

    def query(*args: str) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
        return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]

    try:
        gpus = query("--query-gpu=index,utilization.gpu,memory.used")
        apps = query("--query-compute-apps=pid,used_memory")
    except Exception:  # no nvidia-smi, no permission, a container that hides it
        return None
    me = os.getpid()
    return {"utilization_pct": [float(g[1]) for g in gpus if g[1].replace(".", "").isdigit()],
            "other_processes": [{"pid": int(a[0]), "used_mib": a[1]} for a in apps
                                if a[0].isdigit() and int(a[0]) != me]}
