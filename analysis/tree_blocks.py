"""The generated blocks of docs/trees.md, from the paired comparisons the trees profile publishes.

Each comparison is one benchmark stage of params.trees.yaml, `python -m pipeline.analysis.paired_tokens --out` (A: a
`3,2,1` tree of a drafter without a model, B: the chain of its depth, γ = 3; the same 100 toy text prompts at one
temperature); `make publish PROFILE=trees` copies them into results/published/trees/results/bench/, named
``trees-<drafter>-t<T>.json``. A file whose sides ran other settings than its name says is a one-line error.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import SpecsweepError

from .doc_sources import commit_text, listing, num, prose, read_source, signed, table

FOLDER = "results/published/trees"
WRITER = "make profile PROFILE=trees"
TREE = "3,2,1"
NODES = 15                      # 3 + 3·2 + 6·1: the tokens a `3,2,1` tree scores per step besides the root
CHAIN = 3                       # the chain of the tree's depth
DRAFTERS = (("prompt-lookup", "prompt lookup"), ("suffix", "suffix decoding"))
TEMPERATURES = (1, 0)


def comparison_path(drafter: str, temperature: int) -> str:
    """The committed comparison of ``drafter``'s tree and chain at ``temperature``, from the repository root."""
    return f"{FOLDER}/results/bench/trees-{drafter}-t{temperature}.json"


def read_comparison(root: Path, drafter: str, temperature: int) -> dict:
    """The comparison file of ``drafter`` at ``temperature``, checked against what its name says."""
    path = comparison_path(drafter, temperature)
    data = read_source(root, path, WRITER)
    a, b = (data["sides"][k]["settings"] for k in ("a", "b"))
    expected = ({"drafter": drafter, "temperature": temperature, "draft_tree": TREE},
                {"drafter": drafter, "temperature": temperature, "draft_tree": None, "gamma": CHAIN})
    for side, settings, want in (("A", a, expected[0]), ("B", b, expected[1])):
        got = {k: settings.get(k) for k in want}
        if got != want:
            raise SpecsweepError(f"source {path}: side {side} ran {got}, not {want}: `{WRITER}` writes it")
    return data


def lookup_trees(root: Path) -> str:
    """The table of the `3,2,1` tree against the chain of 3 per drafter and temperature (tokens per step, the paired
    difference with its interval, the prompts where tree and chain emitted the same tokens), and where it ran."""
    rows, files = [], []
    for drafter, label in DRAFTERS:
        for t in TEMPERATURES:
            d = read_comparison(root, drafter, t)
            files.append(d)
            diff = f"{signed(d['mean_difference'])} [{signed(d['ci_low'])}, {signed(d['ci_high'])}]"
            same = "" if d["same_tokens"] is None else f"{d['same_tokens']} of {d['prompts']}"
            rows.append([label, str(t), num(d["a_tokens_per_step"]), num(d["b_tokens_per_step"]), diff,
                         f"{d['a_ahead']}, {d['a_behind']}", same])
    header = ["drafter", "T", f"`{TREE}` ({NODES} nodes)", f"chain γ = {CHAIN}",
              f"paired difference ({files[0]['confidence']:.0%} interval)".replace("%", " %"),
              "prompts the tree is ahead on, behind on", "prompts with the same tokens"]
    dates = sorted({d["date"][:10] for d in files})
    machines = sorted({f"{d['machine']['cpu']} ({d['machine']['cores']} cores)" for d in files})
    commits = sorted({commit_text(d.get("commit"), d.get("dirty")) for d in files})
    versions = sorted({str(d["version"]) for d in files})
    prompts = sorted({str(d["prompts"]) for d in files})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return (table(header, rows) + "\n\n" +
            prose(f"Measured on {listing(machines)}, {when}, specsweep {listing(versions)} at {listing(commits)}, "
                  f"{listing(prompts)} prompts per run (`{WRITER}`, {FOLDER}/)."))

