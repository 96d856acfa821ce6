"""`specsweep report`: collect every run's results JSON into reports/runs.csv and reports/summary.md."""

from __future__ import annotations

import argparse

HELP = "collect results/runs/*.json into one table: reports/runs.csv and reports/summary.md"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", default="results/runs", help="folder of results JSON files (default: results/runs)")
    p.add_argument("--out", default="reports", help="output folder (default: reports)")


def main(args: argparse.Namespace) -> int:
    from pipeline.report import write_report

    csv_path, md_path, n = write_report(args.runs, args.out)
    print(f"{n} run(s): wrote {csv_path} and {md_path}")
    return 0
