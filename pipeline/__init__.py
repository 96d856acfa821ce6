"""specsweep: measure and tune speculative decoding.

Follow a run from the top: dvc.yaml stage -> ``specsweep`` CLI (pipeline/cli.py) -> engine -> sampler
(pipeline/samplers) -> CUDA kernel (kernels/, imported as pipeline.kernels).
"""

__version__ = "0.1.0"
