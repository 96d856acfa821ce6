"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""


class SpecsweepError(Exception):
    """Bad input or configuration: the message says what is wrong and what to do."""


class SamplerInputError(SpecsweepError, ValueError):
    """Tensors handed to a sampler disagree with the sampler contract (shapes, dtypes, vocabularies)."""


class NonFiniteLogitsError(SpecsweepError, FloatingPointError):
    """NaN or +inf (or a row of only -inf) reached a verify step; the message names the tensor."""


class BackendUnavailableError(SpecsweepError, RuntimeError):
    """A sampler backend was asked for on a machine that cannot run it (e.g. CUDA kernels without a GPU)."""
