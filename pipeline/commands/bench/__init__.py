"""`specsweep bench SUBCOMMAND`: benchmarks that print a table and write JSON (speed goals are judged here).

One module per subcommand here (its flags and checks); the benchmarks themselves are in pipeline/benchmarks/.
"""

from __future__ import annotations

import argparse

from pipeline.commands.bench import block, distortion, drafters, engine, host, kernels, lossless, samplers, serve

HELP = "benchmarks: print a table and write JSON (speed goals are judged here)"
SUBCOMMANDS = {"samplers": samplers, "engine": engine, "kernels": kernels, "block": block, "lossless": lossless,
               "serve": serve, "drafters": drafters, "host": host, "distortion": distortion}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, module in SUBCOMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION))


def main(args: argparse.Namespace) -> int:
    return SUBCOMMANDS[args.bench].main(args)
