"""`specsweep report`: every results file in one table (reports/runs.csv, reports/results.csv) and the analysis
report (reports/report.md, reports/report.html, reports/figures/)."""

from __future__ import annotations

import argparse

HELP = ("collect the results files named (runs; Optuna studies, kernel and sampler benchmarks when their folders are "
        "given) into one table and write the analysis report (reports/report.md and report.html)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", default="results/runs",
                   help="folder of results JSON files, or one results file (default: results/runs)")
    # Only the folders named are read: a report of the runs a user names holds nothing else (the pipeline's report
    # stage in dvc.yaml names all four).
    p.add_argument("--tune", default=None,
                   help="folder of Optuna studies: <task>-pareto.json and <task>/study.db, e.g. results/tune "
                        "(default: none; a missing folder adds nothing)")
    p.add_argument("--kernels", default=None,
                   help="folder of `specsweep bench kernels` JSON, e.g. kernels/results (default: none; a missing "
                        "folder adds nothing)")
    p.add_argument("--bench", default=None,
                   help="folder of `specsweep bench` JSON (samplers, engine, lossless, serve), e.g. results/bench "
                        "(default: none; a missing folder adds nothing)")
    p.add_argument("--max-quality-loss", "--max_quality_loss", type=float, default=0.01,
                   help="quality loss allowed for the 'fastest' recommendation, relative to the AR/exact reference "
                        "(default: 0.01 = 1 %%)")
    p.add_argument("--table-only", "--table_only", action="store_true",
                   help="write only runs.csv and summary.md (no figures, no report)")
    p.add_argument("--profile", default=None,
                   help="the pipeline's params file (dvc.yaml passes params.yaml): its `missing:` list, what the "
                        "profile does not run yet and why, becomes a section of the report (default: none)")
    p.add_argument("--out", default="reports", help="output folder (default: reports)")


def main(args: argparse.Namespace) -> int:
    from pipeline.report import write_report  # imports torch and matplotlib: kept out of `specsweep --help`

    csv_path, md_path, n = write_report(args.runs, args.out, tune=args.tune, kernels=args.kernels, bench=args.bench,
                                        max_quality_loss=args.max_quality_loss, analysis=not args.table_only,
                                        profile=args.profile)
    extra = "" if args.table_only else f"; report in {args.out}/report.md and {args.out}/report.html"
    print(f"{n} run(s): wrote {csv_path} and {md_path}{extra}")
    return 0
