"""CUDA verify kernels (sources compiled at run time by CuPy), their loader and benchmarks.

Installed as ``pipeline.kernels``; see pyproject.toml for why it is not a top-level package.
"""
