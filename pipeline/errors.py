"""Errors a user can fix. The CLI prints them as one line and exits with code 2, as its parsers do for a bad flag."""

import argparse


class SpecsweepError(Exception):
    """Bad input or configuration: the message says what is wrong and what to do."""


class SamplerInputError(SpecsweepError, ValueError):
    """Tensors handed to a sampler disagree with the sampler contract (shapes, dtypes, vocabularies)."""


class NonFiniteLogitsError(SpecsweepError, FloatingPointError):
    """NaN or +inf (or a row of only -inf) reached a verify step; the message names the tensor."""


class BackendUnavailableError(SpecsweepError, RuntimeError):
    """A sampler backend was asked for on a machine that cannot run it (e.g. CUDA kernels without a GPU)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser with the house's error for a bad flag: one line on stderr, exit 2. (argparse prints its
    whole usage block first, which buries the line that says what is wrong.) Subcommands' parsers are of this
    class too (add_subparsers makes them of the parent's type); so are the benchmark scripts' (python -m
    pipeline.benchmarks.*)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags and their forms)\n")
