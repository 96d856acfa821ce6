"""The ``specsweep`` command line. Each subcommand lives in pipeline/commands/<name>.py.

Errors a user can fix (:class:`pipeline.errors.SpecsweepError`) print as one line and exit with code 2, as a bad
flag does (:class:`OneLineParser`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pipeline import __version__
from pipeline.env_info import bounded_omp_wait
from pipeline.errors import OneLineParser, SpecsweepError

# name -> module in pipeline.commands, in the order --help lists them
SUBCOMMANDS = ("run", "init", "fetch", "bench", "tune", "report", "toy", "show", "serve", "export", "distill", "speak")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="specsweep", description="Measure and tune speculative decoding: verify kernels, draft/target "
                                      "pairs, γ and dtypes, speed against quality.")
    parser.add_argument("--version", action="version", version=f"specsweep {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"pipeline.commands.{name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    bounded_omp_wait()  # before any command imports torch
    args = build_parser().parse_args(argv)
    try:
        return int(args._module.main(args) or 0)
    except SpecsweepError as e:
        print(f"specsweep {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specsweep {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
