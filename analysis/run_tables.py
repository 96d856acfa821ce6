"""Tables of run results in README.md and docs/, declared once each and rendered from a profile's published summary
(results/published/<profile>/summary.json, written by ``make publish``: analysis/publish.py).

A :class:`RunTable` names its profile, its rows and its columns. A cell is the run its column's ``run`` template names
once the row's ``keys`` are filled in (``"{pair}-main-float32/{pair}-exact-torch-g2-float32"``: the run's path under
the profile's runs folder, without ".json"), written by the column's ``cell`` function; a row lists the columns it
leaves empty. A run the summary does not hold is a one-line error. Adding a table: declare it in TABLES, then put
``<!-- BEGIN GENERATED name -->`` and ``<!-- END GENERATED -->`` around its place and run ``make docs``
(docs/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import MODEL_DRAFTERS
from pipeline.errors import SpecsweepError
from pipeline.tasks import quality_metric
from pipeline.tasks.spec_bench import GROUP_NAMES, GROUPS, MT_BENCH

from .doc_sources import commit_text, interval, minus, num, percent, prose, read_source, signed, table
from .publish import summary_path


@dataclass(frozen=True)
class Column:
    header: str
    run: str                          # the run: a template over the row's keys
    cell: Callable[[dict], str]       # a published record -> the cell's text


@dataclass(frozen=True)
class Row:
    label: str
    keys: dict = field(default_factory=dict)     # what the columns' run templates name
    empty: tuple[str, ...] = ()                  # headers of the columns this row leaves empty
    absent: str | None = None                    # a run the summary may lack: this text in its first cell instead


@dataclass(frozen=True)
class RunTable:
    name: str                         # the block's name in the pages
    profile: str                      # whose published summary it reads
    corner: str                       # the header of the label column
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]

    def render(self, root: Path) -> str:
        path = summary_path(self.profile)
        runs = read_source(root, path, f"make publish PROFILE={self.profile}")["runs"]
        body = []
        for row in self.rows:
            cells = [row.label]
            if row.absent and any(col.run.format(**row.keys) not in runs for col in self.columns):
                body.append([row.label, row.absent, *[""] * (len(self.columns) - 1)])
                continue
            for col in self.columns:
                if col.header in row.empty:
                    cells.append("")
                    continue
                run = col.run.format(**row.keys)
                if run not in runs:
                    raise SpecsweepError(f"{path} holds no run {run!r} (table {self.name}, row {row.label!r}): "
                                         "publish the profile's runs again, or fix the table in "
                                         "analysis/run_tables.py")
                cells.append(col.cell(runs[run]))
            body.append(cells)
        return table([self.corner, *(c.header for c in self.columns)], body)


# ---------------------------------------------------------------------------------------------- cells

def speedup(r: dict) -> str:
    """The paired speedup with its interval: "1.44 [1.41, 1.56]"."""
    m = r["metrics"]
    return interval(m["speedup"], m["speedup_ci_low"], m["speedup_ci_high"])


def speedup_unpaired(r: dict) -> str:
    """Then the unpaired figure in parentheses: "1.44 [1.41, 1.56] (1.53)"."""
    return f"{speedup(r)} ({num(r['metrics']['unpaired_speedup'])})"


def quality_text(r: dict, digits: int) -> str:
    """The task's quality score: "0.992", or an error rate as a percentage: "4 %" (``digits`` for the percentage)."""
    metric = quality_metric(r["config"]["task"])
    value = r["quality"][metric.key]
    return f"{value * 100:.{digits}f} %" if metric.error_rate else num(value, 3)


def speedup_quality(r: dict) -> str:
    """"1.62 [1.43, 1.81], 0.992" (ROUGE-L) or "1.18 [1.13, 1.20], 4 %" (WER)."""
    return f"{speedup(r)}, {quality_text(r, 0)}"


def named_quality(r: dict) -> str:
    """The quality with its name: "ROUGE-L 0.192", "WER 5.7 %"."""
    metric = quality_metric(r["config"]["task"])
    return f"{metric.display} {quality_text(r, 1)}"


def _cost(r: dict) -> str | None:
    """c for a drafter that runs a draft model; None for a drafter without one."""
    c = r["metrics"]["cost_ratio"]
    return None if c is None or (r["config"]["drafter"] or "model") not in MODEL_DRAFTERS else f"c {num(c)}"


def _draft_model_theory(r: dict) -> str:
    """Leviathan et al.'s speedup at the run's α and c (no prefill; r = 1), for a draft model proposing γ tokens
    alone: blank for a drafter without a model or with a lookup before it (part of its proposal costs no draft
    forward), and for an adaptive draft length (the formula fixes γ; the run's γ is where each row starts)."""
    theory, config = r["metrics"].get("theoretical_speedup"), r["config"]
    adaptive = (config.get("draft_schedule") or "constant") != "constant" or (config.get("draft_confidence") or 0) > 0
    return "" if theory is None or adaptive or (config["drafter"] or "model") != "model" else num(theory)


def metric(key: str, digits: int = 2) -> Callable[[dict], str]:
    """A metric of the record, with ``digits`` decimals."""
    return lambda r: num(r["metrics"][key], digits)


def metric_ratio(top: str, bottom: str) -> Callable[[dict], str]:
    """One metric over another ("measured / theoretical")."""
    return lambda r: num(r["metrics"][top] / r["metrics"][bottom])


# ---------------------------------------------------------------------------------------------- the tables

def _main_grid(cell: Callable[[dict], str]) -> tuple[Column, ...]:
    return tuple(Column(f"{rule} γ {g}", f"{{pair}}-main-float32/{{pair}}-{rule}-torch-g{g}-float32", cell)
                 for rule in ("exact", "sigmoid", "greedy") for g in (2, 4))


TOY_PAIRS = (Row("text", {"pair": "text"}), Row("speech", {"pair": "speech"}))
TOY_RULES = tuple(Column(label, f"{{pair}}-rules-float32/{{pair}}-{rule}-torch-g4-float32", speedup_quality)
                  for rule, label in (("block", "block"), ("typical", "typical"), ("fuzzy", "fuzzy"),
                                      ("relaxed", "relaxed"), ("accept_all", "accept-all")))
THEORY = (Column("α", "{run}", metric("iid_alpha")), Column("c", "{run}", metric("cost_ratio", 3)),
          Column("r", "{run}", metric("verify_cost_ratio")), Column("measured", "{run}", metric("speedup")),
          Column("predicted", "{run}", metric("predicted_speedup")),
          Column("theoretical", "{run}", metric("theoretical_speedup")),
          Column("measured / theoretical", "{run}", metric_ratio("speedup", "theoretical_speedup")),
          Column("measured / predicted", "{run}", metric_ratio("speedup", "predicted_speedup")))
def provenance(profile: str) -> Callable[[Path], str]:
    """A renderer of one line saying where and when ``profile``'s published runs were measured."""
    def render(root: Path) -> str:
        data = read_source(root, summary_path(profile), f"make publish PROFILE={profile}")
        first, last = ((data["measured"].get(k) or "")[:10] for k in ("first", "last"))
        when = first if first == last else f"{first} to {last}"
        def at(source: dict) -> str:
            return commit_text(source.get("commit"), source.get("dirty"))

        # runs counted by the commit that ran them (ran.commit); a record from before runs recorded it, by the commit
        # it was published at (its kept entry's, or this summary's)
        kept = {name: k for k in data.get("kept") or [] for name in k["runs"]}
        counts: dict[str, int] = {}
        for name, r in data["runs"].items():
            code = at(r["ran"] if r["ran"].get("commit") else kept.get(name, data))
            counts[code] = counts.get(code, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])
        where = f" at {ranked[0][0]}" if len(ranked) == 1 else ": " + ", ".join(
            f"{n} run{'' if n == 1 else 's'} at {code}" if i == 0 else f"{n} at {code}"
            for i, (code, n) in enumerate(ranked))
        return prose(f"Measured on {_machines(data, when)}, {made_by(profile, data)}, specsweep {data['version']}"
                     f"{where}.{_omp_wait(data['runs'].values())}")
    return render


def made_by(profile: str, data: dict) -> str:
    """What wrote a published summary's runs: the profile's `dvc repro` ("by `make profile PROFILE=real`"), or, for
    runs published before every experiment was a profile, the hand-run commands that wrote its ``source`` folder."""
    source = data.get("source") or ""
    if profile == "default" and source == "results/runs":
        return "by `make`"
    if source in (f"{profile}/results/runs", f"workspaces/{profile}/results/runs"):
        return f"by `make profile PROFILE={profile}`"
    return f"by hand-run commands into {source}, before this experiment was a profile"


def _machines(data: dict, when: str) -> str:
    """"CPU (N cores), dates" for a summary whose runs ran on one machine; with several, each CPU with its runs and
    dates (a record that does not name its CPU ran on the one that published it)."""
    m = data["machine"]
    dates: dict[str, list[str]] = {}
    for r in data["runs"].values():
        dates.setdefault(short_cpu(r["ran"].get("machine") or m["cpu"]), []).append((r["ran"].get("date") or "")[:10])
    if len(dates) == 1:
        return f"{next(iter(dates))} ({m['cores']} cores), {when}"

    def span(days: list[str]) -> str:
        known = sorted(d for d in days if d)
        return "" if not known else f", {known[0]}" if known[0] == known[-1] else f", {known[0]} to {known[-1]}"

    parts = [f"{cpu} ({len(days)} run{'' if len(days) == 1 else 's'}{span(days)})"
             for cpu, days in sorted(dates.items(), key=lambda kv: -len(kv[1]))]
    return f"{', '.join(parts[:-1])} and {parts[-1]}, {m['cores']} cores each"


def sigmoid_study(root: Path) -> str:
    """The table of the sigmoid profile's study: a row per trial (its α and β, paired speedup, ROUGE-L and ROUGE-L
    against the target alone's). The tuned row's α and β come from the distortion map, not from these trials
    (bench_blocks.bench_distortion_qwen)."""
    profile = "pair-sigmoid"
    runs = read_source(root, summary_path(profile), f"make publish PROFILE={profile}")["runs"]
    trials = sorted(name for name in runs if name.startswith("study/trials/"))
    if "qwen-ar-t1-bfloat16" not in runs or not trials:
        raise SpecsweepError(f"{summary_path(profile)} holds no {'study trials' if trials else 'target alone'}: run "
                             "the sigmoid profile, then publish it again")
    key = quality_metric("cnn_dailymail").key
    reference = runs["qwen-ar-t1-bfloat16"]["quality"][key]
    body = [[str(int(name.rsplit("/", 1)[1])), rule_params(runs[name]), speedup(runs[name]),
             num(runs[name]["quality"][key], 3), signed((runs[name]["quality"][key] / reference - 1) * 100, 1) + " %"]
            for name in trials]
    return table(["trial", "parameters", "paired speedup", "ROUGE-L", "ROUGE-L against the target alone's"], body)


def _omp_wait(records) -> str:
    """" Idle OpenMP workers: GOMP_SPINCOUNT=10000." (with each setting's run count where runs differ), from the
    records that say (docs/measurement.md: the policy moves a small draft's cost); "" where none does."""
    said = [r["measurement"].get("omp_wait") for r in records]
    counts = {label: said.count(label) for label in dict.fromkeys(s for s in said if s)}
    if not counts:
        return ""
    if len(counts) == 1 and None not in said:
        return f" Idle OpenMP workers: {next(iter(counts))}."
    parts = [f"{label} ({n} run{'' if n == 1 else 's'})" for label, n in counts.items()]
    unknown = said.count(None)
    return " Idle OpenMP workers: " + ", ".join(parts + ([f"not recorded ({unknown})"] if unknown else [])) + "."


def decode_speedup(r: dict) -> str:
    """The paired speedup of decoding alone (prefill left out) with its interval, where the run measured it."""
    m = r["metrics"]
    if m.get("decode_speedup") is None:
        return ""
    return interval(m["decode_speedup"], m["decode_speedup_ci_low"], m["decode_speedup_ci_high"])


def setting(key: str) -> Callable[[dict], str]:
    """A run setting of the record, as it is."""
    return lambda r: str(r["config"][key])


def dtype_weights(r: dict) -> str:
    """The run's dtype, "packed weights" where its target multiplied packed copies of them
    (pipeline/decoding/static/packed.py: on by default on a CPU since 2026-11-28; earlier runs, transformers'
    assisted generation and runs with --no-packed-weights multiplied the models' own), "bf16_linear" where the packed
    target multiplied its few-row products with our kernel (kernels/bf16_linear.cpp, since 2026-11-29; earlier runs
    with oneDNN's), "int4_linear" where its int4 draft ran our kernel (kernels/int4_linear.cpp, since 2026-11-29;
    earlier int4 runs ran torch's), "int4_layers" where the draft's one-token forwards ran in one call
    (kernels/int4_layers.cpp, since 7b0a789 on 2026-11-29; earlier ones operator by operator), and "amx_linear" where
    the packed target's few rows ran our AMX kernel (kernels/amx_linear.cpp, on a CPU with AMX, since 00bd65a on
    2026-12-02)."""
    few = r.get("few_rows_kernel") if r.get("packed_weights") else None
    parts = [str(r["config"]["dtype"]), *(["packed weights"] if r.get("packed_weights") else []),
             *([few] if few in ("bf16_linear", "amx_linear") else []),
             *(["int4_linear"] if r.get("quant_kernel") == "int4_linear" else []),
             *(["int4_layers"] if r.get("row_kernel") == "int4_layers" else [])]
    return ", ".join(parts)


def short_cpu(name: str) -> str:
    """A CPU's model name, short: "Intel(R) Xeon(R) Processor" -> "Intel Xeon", "AMD EPYC 7B13" -> "AMD EPYC"."""
    for noise in ("(R)", "(TM)", " Processor", " CPU"):
        name = name.replace(noise, "")
    return " ".join(name.split()[:2])


def cpu_name(r: dict) -> str:
    """The CPU the run ran on, short (:func:`short_cpu`), from its record's ``ran.machine`` (publish.py); "" where
    the record does not say."""
    return short_cpu(r["ran"].get("machine") or "")


def agreement(r: dict) -> str:
    """"3 of 3": the samples whose greedy tokens are the target alone's, token for token; "2 of 2 timed" where the
    comparison covered fewer samples than the run decoded (a run without --baseline compares against its paired
    γ = 0 loop, which decodes only the timed samples)."""
    a = r.get("greedy_agreement")
    if not a:
        return ""
    decoded = (r.get("config") or {}).get("limit")
    return f"{a['identical']} of {a['samples']}" + (" timed" if decoded and a["samples"] < decoded else "")


def tokens_digest(r: dict) -> str:
    """The first 8 hex digits of the run's tokens' sha256: equal digests, equal tokens."""
    return r["tokens_sha256"][:8]


def prefix_share(r: dict) -> str:
    """"78 %": the share of the run's tokens that come before each sample's first difference from the target alone."""
    a = r.get("greedy_agreement")
    return "" if not a else percent(a["shared_prefix_share"])


def by(key: str, name: str) -> Callable[[dict], str]:
    """A Spec-Bench run's figures for one leaderboard group (``key`` "by_group") or one category ("by_category"):
    the paired speedup with its interval, then tokens per step: "2.13 [1.90, 2.40], 3.1"."""
    def cell(r: dict) -> str:
        f = (r.get(key) or {}).get(name)
        if not f or f.get("speedup") is None:
            raise SpecsweepError(f"a published Spec-Bench run has no timed {name!r} in {key}: run it on every "
                                 "category (the spec-bench profile) and publish it again")
        return (f"{interval(f['speedup'], f['speedup_ci_low'], f['speedup_ci_high'])}, "
                f"{num(f['mean_accepted_tokens'], 1)}")
    return cell


PARAM_SYMBOLS = {"alpha": ("α", 2), "beta": ("β", 1), "epsilon": ("ε", 2), "delta": ("δ", 2)}
"""How the tables write a rule parameter: its symbol and decimals (others: their name, 2 decimals)."""


def rule_params(r: dict) -> str:
    """The acceptance rule's parameters as it ran: "α 1.00, β −20.0" (blank for a rule without any)."""
    written = []
    for name, value in (r.get("params") or {}).items():
        symbol, digits = PARAM_SYMBOLS.get(name, (name, 2))
        written.append(f"{symbol} {minus(value, digits)}")
    return ", ".join(written)


REAL_RUNS = (  # (label, run, pair) of the real profile (params.real.yaml); pair None: no target alone to compare
    *(("Qwen2.5-Coder-1.5B, 0.5B draft in int4", f"qwen-model-bfloat16/qwen-model-bfloat16-exact-torch-g{g}", "qwen")
      for g in (4, 5)),
    ("Qwen2.5-Coder-1.5B, prompt lookup", "qwen-lookup-bfloat16/qwen-exact-torch-g4-bfloat16", "qwen"),
    ("Qwen2.5-Coder-1.5B, 0.5B draft, transformers' assisted generation",
     "qwen-hf-bfloat16/qwen-hf-bfloat16-exact-torch-g4", "qwen"),
    ("Qwen2.5-Coder-1.5B, 0.5B draft (head: 32768 tokens)",
     "qwen-model-float32/qwen-model-float32-exact-torch-g4", None),
    ("SmolLM2-135M-Instruct, prompt lookup", "smollm2-lookup-bfloat16/smollm2-exact-torch-g4-bfloat16", "smollm2"),
    ("Whisper base, tiny.en draft", "whisper-base-model-bfloat16/whisper-base-model-bfloat16-exact-torch-g3",
     "whisper-base"),
    ("Whisper base, prompt lookup", "whisper-base-lookup-bfloat16/whisper-base-exact-torch-g4-bfloat16",
     "whisper-base"))

PAIR_SPEC_BENCH_RUNS = (("draft in int4, head cut to 32768 tokens", "qwen-model-k32768-int4-g5-bfloat16"),
                        ("prompt lookup", "qwen-lookup-g4-bfloat16"),
                        ("prompt lookup's match, then the int4 draft", "qwen-lookup-model-k32768-int4-g5-bfloat16"))
PAIR_RUNS = (("draft, head cut to 32768 tokens, γ 3", "qwen-model-k32768-g3-bfloat16-128"),
             ("draft, head cut to 32768 tokens, γ 4", "qwen-model-k32768-g4-bfloat16-128"),
             ("draft in int8 (--draft-quant), head cut to 32768 tokens, γ 4", "qwen-model-k32768-int8-g4-bfloat16-128"),
             ("draft in int4, head cut to 32768 tokens, γ 4", "qwen-model-k32768-int4-g4-bfloat16-128"),
             ("draft in int4, head cut to 32768 tokens, γ 5", "qwen-model-k32768-int4-g5-bfloat16-128"),
             ("draft in int4, head cut to 32768 tokens, γ 6", "qwen-model-k32768-int4-g6-bfloat16-128"),
             ("draft in int4, whole head, γ 5 (6 repeats: a 97 % interval)", "qwen-model-kall-int4-g5-bfloat16-128"),
             ("draft in int4, whole head, its prefill int8 by int8 (int4+a8), γ 5",
              "qwen-model-kall-int4+a8-g5-bfloat16-128"),
             *((f"draft in int4, head cut to 32768 tokens, up to γ {g}, drafting stops below confidence 0.4 "
                "(--draft-confidence; before 2026-12-02, rows padded after their fall)",
                f"qwen-model-k32768-int4-g{g}-conf0.4-bfloat16-128") for g in (6, 8)),
             *((f"prompt lookup, γ {g}", f"qwen-lookup-g{g}-bfloat16-128") for g in (4, 6, 8, 10, 12)),
             ("prompt lookup's match, then the draft (head: 32768 tokens), γ 4",
              "qwen-lookup-model-k32768-g4-bfloat16-128"),
             ("prompt lookup's match, then the int4 draft (head: 32768 tokens), γ 4",
              "qwen-lookup-model-k32768-int4-g4-bfloat16-128"),
             *((f"draft in int4, whole head, γ {g}, on 24 articles", f"qwen-model-kall-int4-g{g}-bfloat16-128-a24")
               for g in (5, 6, 7)),
             ("draft in int4, whole head, γ 6, on 24 articles, run again (its own process)",
              "qwen-model-kall-int4-g6-bfloat16-128-a24-2"),
             ("prompt lookup, γ 12, on 24 articles", "qwen-lookup-g12-bfloat16-128-a24"),
             ("prompt lookup, γ 8, n-grams of 1-4 tokens (the replay's pick), on 24 articles",
              "qwen-lookup-g8-n4-bfloat16-128-a24"),
             ("suffix decoding, factor 4, γ 16, on 24 articles", "qwen-suffix-f4-g16-bfloat16-128-a24"),
             ("prompt lookup, γ 8, n-grams of 1-4 tokens, on 24 articles", "qwen-lookup-g8-n4-bfloat16-128-a24-xeon"),
             ("prompt lookup, γ 12, n-grams of 1-4 tokens (the replay's pick over amx_linear's forwards), on 24 "
              "articles", "qwen-lookup-g12-n4-bfloat16-128-a24"),
             ("draft in int4, whole head, γ 6, on 24 articles", "qwen-model-kall-int4-g6-bfloat16-128-a24-xeon"),
             ("draft in int4, whole head, up to γ 8, drafting stops in the step below confidence 0.5 (the replay's "
              "pick), on 24 articles", "qwen-model-kall-int4-g8-conf0.5-bfloat16-128-a24"),
             ("draft, γ 4, our loop", "qwen-model-g4-float32-24"),
             ("draft, γ 4, transformers' assisted generation", "qwen-model-g4-float32-24-hf"))

PAIR_SBC_RUNS = (("the int4 draft (whole head), γ 5", "qwen-model-kall-int4-g5-bfloat16"),
                 ("prompt lookup's match, then the int4 draft, γ 5", "qwen-lookup-model-kall-int4-g5-bfloat16"),
                 ("prompt lookup, γ 4", "qwen-lookup-g4-bfloat16"))
TUNED_SIGMOID = "qwen-sigmoid-tuned-g4-t1-bfloat16"
PAIR_SIGMOID_RUNS = (("target alone", "qwen-ar-t1-bfloat16"), ("exact", "qwen-exact-g4-t1-bfloat16"),
                     ("sigmoid, the registry's α and β", "qwen-sigmoid-g4-t1-bfloat16"),
                     ("sigmoid, α and β from the distortion map", TUNED_SIGMOID),
                     ("typical", "qwen-typical-g4-t1-bfloat16"))
NO_TUNED_SIGMOID = "none: no α and β of the distortion map are within its bound"
SPEED_COLUMNS = ("paired speedup", "decoding alone", "acceptance", "tokens/step", "c")
LLAMA_CPP_RUNS = (  # (label, run) of the llama-cpp profile (params.llama-cpp.yaml)
    ("llama.cpp alone", "qwen-llama-cpp-ar-auto"),
    *((f"0.5B draft, draft max {g}", f"qwen-llama-cpp-draft-auto/qwen-llama-cpp-exact-torch-g{g}-auto")
      for g in (2, 4, 6)),
    ("0.5B draft, draft max 8", "qwen-llama-cpp-draft-8-auto/qwen-llama-cpp-exact-torch-g8-auto"),
    ("0.5B draft, draft max 8, probability floor 0.8",
     "qwen-llama-cpp-draft-floor-auto/qwen-llama-cpp-exact-torch-g8-auto"),
    *((f"prompt lookup (3-grams), draft max {g}", f"qwen-llama-cpp-lookup-auto/qwen-llama-cpp-exact-torch-g{g}-auto")
      for g in (4, 8)),
    ("both files Q8_0: llama.cpp alone", "qwen-llama-cpp-q8_0/qwen-llama-cpp-q8_0-exact-torch-g0"),
    ("both files Q8_0: 0.5B draft, draft max 2", "qwen-llama-cpp-q8_0/qwen-llama-cpp-q8_0-exact-torch-g2"),
    ("T = 1: 0.5B draft, draft max 4 (llama.cpp's rule)", "qwen-llama-cpp-t1/qwen-llama-cpp-t1-exact-torch-g4"),
    *((f"the study's trial {i}: 0.5B draft, its draft max, floor and minimum from Optuna",
       f"tune/qwen-llama-cpp/trials/0000{i}") for i in (0, 1)))
LLAMA_ALONE = ("qwen-llama-cpp-ar-auto", "qwen-llama-cpp-q8_0/qwen-llama-cpp-q8_0-exact-torch-g0")
"""The rows of llama.cpp alone (γ = 0): their speed columns are empty."""
LLAMA_CPP_ABSENT = "not measured yet: the profile's run stopped before this setting"


def model_gigabytes(record: dict) -> str:
    """The bytes of a run's models as run, target and draft together, in GB ("" for a run that did not record
    them)."""
    models = record.get("model_bytes")
    return num(sum(models.values()) / 1e9, 2) if models else ""


def peak_gigabytes(record: dict) -> str:
    """A run's process's peak resident memory (its models' loading included) in GB ("" where not recorded)."""
    peak = record["metrics"].get("peak_memory_mb")
    return "" if peak is None else num(peak * 2**20 / 1e9, 1)
LLAMA_CPP_SPEED = ("paired speedup", "decoding alone", "acceptance", "tokens/step", "identical to llama.cpp alone")

TABLES = (
    # docs/results.md, "Speedups of the default profile": paired speedups of the main grid with the unpaired figure
    RunTable("results-toy-speedups", "default", "pair", TOY_PAIRS, _main_grid(speedup_unpaired)),
    # docs/results.md: the other rules and prompt lookup at γ 4, with quality
    RunTable("results-toy-rules", "default", "pair", TOY_PAIRS,
             (*TOY_RULES, Column("prompt lookup", "{pair}-lookup-float32/{pair}-exact-torch-g4-float32",
                                 speedup_quality))),
    # docs/results.md, "The toy text pair's BPE draft": the matched draft against the one with another tokenizer
    RunTable("results-toy-bpe", "default", "draft, mode",
             (Row("word-level, shared", {rule: f"text-main-float32/text-{rule}-torch-g4-float32"
                                         for rule in ("exact", "greedy")}),
              Row("BPE: intersection (exact) / string (greedy)",
                  {rule: f"text-bpe-float32/text-bpe-float32-{rule}-torch-g4" for rule in ("exact", "greedy")})),
             (Column("exact γ 4 (lossless)", "{exact}", speedup), Column("greedy γ 4", "{greedy}", speedup),
              Column("acceptance in characters, exact γ 4", "{exact}", metric("acceptance_rate_chars")),
              Column("acceptance in characters, greedy γ 4", "{greedy}", metric("acceptance_rate_chars")))),
    # docs/results.md, "Against theory"
    RunTable("results-toy-theory", "default", "text run",
             tuple(Row(f"{rule} γ {g}", {"run": f"text-main-float32/text-{rule}-torch-g{g}-float32"})
                   for rule in ("exact", "greedy") for g in (2, 4)), THEORY),
    # docs/results.md, "The real profile": its runs (make profile PROFILE=real), each row one run
    RunTable("results-real", "real", "target, drafter",
             tuple(Row(label, {"run": run, "pair": pair}, empty=() if pair else ("target alone (bfloat16)",))
                   for label, run, pair in REAL_RUNS),
             (Column("dtype", "{run}", dtype_weights), Column("γ", "{run}", setting("gamma")),
              Column("samples", "{run}", setting("limit")), Column("new tokens", "{run}", setting("max_new_tokens")),
              Column("paired speedup", "{run}", speedup), Column("decoding alone", "{run}", decode_speedup),
              Column("acceptance", "{run}", metric("acceptance_rate")),
              Column("tokens/step", "{run}", metric("mean_accepted_tokens")),
              Column("c", "{run}", lambda r: _cost(r) and num(r["metrics"]["cost_ratio"])),
              Column("r", "{run}", metric("verify_cost_ratio")),
              Column("quality", "{run}", named_quality),
              Column("target alone (bfloat16)", "{pair}-ar-bfloat16", named_quality),
              Column("identical to the target alone", "{run}", agreement))),
    # docs/results.md: the Qwen2.5-Coder pair on CNN/DailyMail
    RunTable("results-pair", "pair", "Qwen2.5-Coder-1.5B-Instruct with",
             tuple(Row(label, {"run": run}) for label, run in PAIR_RUNS),
             (Column("CPU", "{run}", cpu_name),
              Column("dtype", "{run}", dtype_weights), Column("articles", "{run}", setting("limit")),
              Column("new tokens", "{run}", setting("max_new_tokens")),
              Column("paired speedup", "{run}", speedup), Column("decoding alone", "{run}", decode_speedup),
              Column("Leviathan's theory", "{run}", _draft_model_theory),
              Column("acceptance", "{run}", metric("acceptance_rate")),
              Column("tokens/step", "{run}", metric("mean_accepted_tokens")),
              Column("c", "{run}", lambda r: _cost(r) and num(r["metrics"]["cost_ratio"])),
              Column("r", "{run}", metric("verify_cost_ratio")),
              Column("ROUGE-L", "{run}", lambda r: quality_text(r, 1)),
              Column("identical to the target alone", "{run}", agreement),
              Column("tokens (sha256)", "{run}", tokens_digest))),
    # docs/results.md: the pair on Spec-Bench's coding questions
    RunTable("pair-spec-bench", "pair-spec-bench", "Qwen2.5-Coder-1.5B-Instruct with",
             tuple(Row(label, {"run": run}) for label, run in PAIR_SPEC_BENCH_RUNS),
             (Column("γ", "{run}", setting("gamma")), Column("paired speedup", "{run}", speedup),
              Column("acceptance", "{run}", metric("acceptance_rate")),
              Column("tokens/step", "{run}", metric("mean_accepted_tokens")),
              Column("c", "{run}", lambda r: _cost(r) and num(r["metrics"]["cost_ratio"])),
              Column("r", "{run}", metric("verify_cost_ratio")),
              Column("turns identical to the target alone", "{run}", agreement),
              Column("tokens before the first difference", "{run}", prefix_share))),
    # docs/results.md: the draft's head cut to K tokens (the pair profile)
    RunTable("pair-vocab", "pair", "draft head",
             tuple(Row(label, {"k": k}) for label, k in (("whole (151936 tokens)", "None"), ("32768 tokens", "32768"),
                                                        ("8192 tokens", "8192"))),
             tuple(Column(h, "qwen-model-k{k}-g4-bfloat16-48", cell) for h, cell in (
                 ("acceptance", metric("acceptance_rate")), ("tokens/step", metric("mean_accepted_tokens")),
                 ("c", metric("cost_ratio")), ("r", metric("verify_cost_ratio")), ("paired speedup", speedup),
                 ("identical to the target alone", agreement)))),
    # README.md and docs/results.md: the pair on every Spec-Bench category (the spec-bench profile), the
    # leaderboard's groups, then MT-Bench's categories
    RunTable("pair-spec-bench-groups", "pair-spec-bench-categories", "drafter",
             tuple(Row(label, {"run": run}) for label, run in PAIR_SBC_RUNS),
             (*(Column(GROUP_NAMES[g], "{run}", by("by_group", g)) for g in (*GROUPS, "overall")),
              Column("turns identical to the target alone", "{run}", agreement))),
    RunTable("pair-spec-bench-mt-bench", "pair-spec-bench-categories", "drafter",
             tuple(Row(label, {"run": run}) for label, run in PAIR_SBC_RUNS),
             tuple(Column(c, "{run}", by("by_category", c)) for c in MT_BENCH)),
    # README.md and docs/results.md, "The paper's table on the pair": the rules at T = 1, sigmoid's α and β from the
    # registry and from a study (the sigmoid profile)
    RunTable("pair-sigmoid", "pair-sigmoid", "rule, T = 1, γ 4",
             tuple(Row(label, {"run": run}, empty=SPEED_COLUMNS if run.startswith("qwen-ar") else (),
                       absent=NO_TUNED_SIGMOID if run == TUNED_SIGMOID else None)
                   for label, run in PAIR_SIGMOID_RUNS),
             (Column("parameters", "{run}", rule_params), Column("ROUGE-L", "{run}", lambda r: quality_text(r, 3)),
              Column("paired speedup", "{run}", speedup), Column("decoding alone", "{run}", decode_speedup),
              Column("acceptance", "{run}", metric("acceptance_rate")),
              Column("tokens/step", "{run}", metric("mean_accepted_tokens")),
              Column("c", "{run}", metric("cost_ratio")))),
    # docs/results.md, "llama.cpp on the pair": llama.cpp's own speculative decoding against llama.cpp alone
    RunTable("results-llama-cpp", "llama-cpp", "Qwen2.5-Coder-1.5B Q4_K_M in llama.cpp with",
             tuple(Row(label, {"run": run}, empty=LLAMA_CPP_SPEED if run in LLAMA_ALONE else (),
                       absent=None if run == LLAMA_ALONE[0] else LLAMA_CPP_ABSENT)
                   for label, run in LLAMA_CPP_RUNS),
             (Column("tokens/s", "{run}", metric("tokens_per_second", 1)),
              Column("paired speedup", "{run}", speedup), Column("decoding alone", "{run}", decode_speedup),
              Column("acceptance", "{run}", metric("acceptance_rate")),
              Column("tokens/step", "{run}", metric("mean_accepted_tokens")),
              Column("ROUGE-L", "{run}", lambda r: quality_text(r, 3)),
              Column("identical to llama.cpp alone", "{run}", agreement))),
    # docs/results.md, "A quantised target in torch": specsweep's engine in the llama-cpp profile
    RunTable("results-llama-cpp-torch", "llama-cpp", "Qwen2.5-Coder pair in specsweep's engine, bfloat16, with",
             (Row("int8 target, int8 draft at γ 2", {"run": "qwen-torch-int8/qwen-torch-int8-exact-torch-g2"},
                  absent=LLAMA_CPP_ABSENT),),
             (Column("tokens/s", "{run}", metric("tokens_per_second", 1)),
              Column("paired speedup over the int8 target alone", "{run}", speedup),
              Column("decoding alone", "{run}", decode_speedup),
              Column("acceptance", "{run}", metric("acceptance_rate")),
              Column("tokens/step", "{run}", metric("mean_accepted_tokens")),
              Column("c", "{run}", metric("cost_ratio")), Column("r", "{run}", metric("verify_cost_ratio")),
              Column("ROUGE-L", "{run}", lambda r: quality_text(r, 3)),
              Column("identical to its target alone", "{run}", agreement),
              Column("weights, GB", "{run}", model_gigabytes),
              Column("peak resident, GB", "{run}", peak_gigabytes))),
    # docs/results.md, "The paper's table on a real pair": the rules at T = 1 (the real profile)
    RunTable("results-real-sampling", "real", "rule, T = 1, γ 4",
             tuple(Row(rule, {"run": f"qwen-sampling-bfloat16/qwen-sampling-bfloat16-{rule}-torch-g4"})
                   for rule in ("exact", "sigmoid", "typical")),
             (Column("ROUGE-L", "{run}", lambda r: quality_text(r, 1)),
              Column("paired speedup", "{run}", speedup), Column("decoding alone", "{run}", decode_speedup),
              Column("acceptance", "{run}", metric("acceptance_rate")),
              Column("tokens/step", "{run}", metric("mean_accepted_tokens")),
              Column("c", "{run}", metric("cost_ratio")), Column("r", "{run}", metric("verify_cost_ratio")))),
)
