"""The analysis report behind ``specsweep report``: which verify kernel, γ and sigmoid setting to use for a model
pair, and what it costs in quality.

Installed as ``pipeline.analysis`` (see pyproject.toml: a top-level ``analysis`` package is a generic name that
could shadow another). Modules, in the order the report uses them:

  tables      every results file (runs, AR baselines, Optuna trials, kernel and sampler benchmarks) -> one table
  pareto      the speed/quality Pareto front
  theory      expected accepted tokens per step from acceptance rates (per position, and i.i.d.)
  speed_reference   one speed reference per task and target across dtypes (the target alone in its fastest
                    measured dtype): speedup_vs_reference
  recommend   the fastest setting within a quality loss, and the best lossless one
  figures     the matplotlib figures (Agg backend, PNG, written atomically)
  document    a small block model rendered to Markdown and to self-contained HTML
  build       assembles the sections and writes report.md, report.html, results.csv and figures/

Beside the report, the published results and the figures of README.md and docs/ (docs/README.md, "Generated figures"):

  publish         `make publish`: a profile's runs made small into results/published/<profile>/summary.json
  docs            `make docs` / `make check-docs`: the generated blocks and their registry
  run_tables, bench_blocks, gpu_blocks, doc_sources    what renders the blocks
  paired_tokens   two settings' tokens per step compared prompt by prompt (docs/trees.md)
"""
