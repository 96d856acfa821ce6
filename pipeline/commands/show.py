"""`specsweep show`: a results file's samples, each token coloured by where it came from (an accepted draft token,
the target's correction, a bonus token), with each sample's acceptance, the run's acceptance by token class and
its roofline (pipeline/origins.py, pipeline/roofline.py)."""

from __future__ import annotations

import argparse

from pipeline.errors import SpecsweepError
from pipeline.result import read_result
from pipeline.roofline import describe

HELP = ("print a results file's samples coloured by each token's origin (accepted draft, correction, bonus), with "
        "acceptance by token class and the run's roofline")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", help="a results JSON written by `specsweep run`")
    p.add_argument("--id", help="show only the sample with this id (default: every sample, then the run's summary)")
    p.add_argument("--plain", action="store_true",
                   help="plain markers instead of colours even on a terminal ([corrected], {bonus}, <target alone>)")


def main(args: argparse.Namespace) -> int:
    # imports torch: kept out of `specsweep --help`
    from pipeline.origins import class_table_lines, pieces_for, print_samples

    result = read_result(args.results)
    if result is None:
        raise SpecsweepError(f"{args.results} is not a specsweep results file: give one written by `specsweep run`")
    samples = result.get("samples") or []
    if args.id is not None:
        samples = [s for s in samples if str(s.get("id")) == args.id]
        if not samples:
            ids = [str(s.get("id")) for s in result.get("samples") or []]
            listed = ", ".join(ids[:8]) + (", ..." if len(ids) > 8 else "")
            raise SpecsweepError(f"no sample with id {args.id!r} in {args.results}: its ids are {listed or 'none'}")
    pieces, note = pieces_for(result.get("config") or {})
    print_samples(samples, pieces, terminal=False if args.plain else None, note=note)
    if args.id is None:
        metrics = result.get("metrics") or {}
        for line in ["", *class_table_lines(metrics.get("token_class_acceptance")), "",
                     *describe(metrics.get("roofline"))]:
            print(line)
    return 0
