"""Where a number came from: device, driver and library versions, recorded in every results file."""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata

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
                                         "cpu_threads": torch.get_num_threads()}
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


def provenance(device: str = "cpu") -> dict:
    """Everything a results file records about where and when it was measured."""
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "versions": versions(), "device": device_info(device)}
