"""The ``spec_bench`` task: Spec-Bench (Xia et al., ACL Findings 2024), the speed benchmark of speculative decoding.

Data: Spec-Bench's question file (:data:`QUESTIONS_URL`, pinned at a commit; `specsweep fetch --task spec_bench`
downloads it), or a ``--source`` JSONL file in its schema: ``{"question_id": int or str, "category": str, "turns":
[str, ...]}`` per line (other keys, such as ``reference``, are ignored). 480 questions: MT-Bench's 80 (writing,
roleplay, reasoning, math, coding, extraction, stem, humanities; 10 each, two turns) and 80 each of translation,
summarization, qa, math_reasoning and rag (one turn). Records (one per question, in the file's order): ``{"id":
str (the question id), "category": str, "turns": str (a JSON list of the user turns)}``. ``--categories a,b`` keeps
those categories and ``--per-category N`` the first N questions of each (:meth:`SpecBenchTask.select`).

Decoding: each question is a conversation in the target's chat template (required: ``--chat-template``, and a
tokenizer with a template; both refused in one line before the models load). Turn k's prompt is the template over
user turn 1, the model's own answer to it, ..., user turn k, ending with the assistant's generation prompt; an
answer is its output text with special tokens removed and surrounding whitespace stripped, as Spec-Bench keeps it.
A run decodes units, one per (question, turn) (:meth:`SpecBenchTask.decode_units`, ids ``<question id>-t<k>``):
every first turn, then every second turn, and a batch never mixes turns, so each answer is known before the turn
that reads it. The quality pass builds turn 2 from its own (the method's) answers, as Spec-Bench does; the paired
timing decodes the same prompts with both loops. A prompt too long for the target (prompt + max_new_tokens +
max(γ, 8) + 2 positions) has its last user turn cut from the middle, keeping its start (the instruction) and its end
(a question after a retrieved passage), under ``--long-inputs truncate``; ``error`` stops the run.

Metrics (per category, per leaderboard group of :data:`GROUPS` and overall; pipeline/categories.py): new tokens,
verify steps, mean accepted tokens per step (the bonus token counted, so plain decoding scores 1.00), and the paired
speedup with its interval. Spec-Bench's speedup is the ratio of mean tokens/s over questions (a question's tokens
over its turns' seconds); here both loops decode the first ``--samples-per-repeat`` questions of each category in
every repeat, back to back per category, and the speedup is the median over repeats of that ratio.

Temperature: Spec-Bench measures greedy decoding, so a run decodes at T = 0 unless --temperature says otherwise.

Quality: how far the outputs are the target's own. At T = 0 every output is compared token by token with the γ = 0
loop's output for the same unit (its own conversation): the share of identical outputs (lossless rules: 1.0), the
token agreement (positions where both emitted the same token over the longer output's length, summed over units;
the quality objective) and the share of the AR tokens before the first divergence. At T > 0 two sampled outputs
agree by chance only, so a run records no quality and `specsweep tune` refuses the study
(:meth:`SpecBenchTask.quality_error`).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.tasks.base import Cuts, Encoder, QualityMetric, Task
from pipeline.tasks.text import DRAFT_RESERVE, PromptEncoder, left_padded

QUESTIONS_URL = ("https://raw.githubusercontent.com/hemingkx/Spec-Bench/fd2c1cd7d2201ef71db4c5f4e455008f017967bf/"
                 "data/spec_bench/question.jsonl")
"""Spec-Bench's questions, data/spec_bench/question.jsonl of hemingkx/Spec-Bench at commit fd2c1cd (Apache-2.0)."""

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = (*MT_BENCH, "translation", "summarization", "qa", "math_reasoning", "rag")
"""Spec-Bench's 13 categories, in its file's order."""

GROUPS: dict[str, tuple[str, ...]] = {
    "mt_bench": MT_BENCH, "translation": ("translation",), "summarization": ("summarization",), "qa": ("qa",),
    "math_reasoning": ("math_reasoning",), "rag": ("rag",)}
"""The leaderboard's six groups (Spec-Bench's evaluation/speed.py names) -> their categories; ``overall`` is every
question."""

GROUP_NAMES = {"mt_bench": "Multi-turn Conversation", "translation": "Translation", "summarization": "Summarization",
               "qa": "Question Answering", "math_reasoning": "Mathematical Reasoning",
               "rag": "Retrieval-aug. Generation", "overall": "Overall"}
"""Each group's column name on Spec-Bench's leaderboard."""


class SpecBenchTask(Task):
    name = "spec_bench"
    display = "Spec-Bench"
    metric = QualityMetric("token_agreement", 1.0, "token agreement with AR")
    url = QUESTIONS_URL
    columns = ("id", "category", "turns")
    source_fields = ("category",)
    source_hint = 'a JSONL file of {"question_id", "category", "turns": [str, ...]} lines (Spec-Bench\'s questions)'
    wants_ar_outputs = True
    default_temperature = 0.0   # Spec-Bench measures greedy decoding

    def quality_error(self, temperature: float) -> str | None:
        if temperature > 0:
            return ("--task spec_bench's quality is agreement with the γ = 0 loop's tokens, which sampled outputs "
                    f"(--temperature {temperature:g}) share only by chance: decode at --temperature 0 (the default)")
        return None

    # ------------------------------------------------------------------------------------------------- data

    def source_row(self, obj: dict, line: int, path: Path) -> dict:
        """-> ``{"id", "category", "turns"}`` (turns JSON-encoded), the line checked."""
        if "question_id" not in obj:
            raise SpecsweepError(f"{path} line {line}: missing field 'question_id'; each line needs 'question_id', "
                                 "'category' and 'turns'")
        qid, turns = obj["question_id"], obj.get("turns")
        if isinstance(qid, bool) or not isinstance(qid, (int, str)) or str(qid).strip() == "":
            raise SpecsweepError(f"{path} line {line}: field 'question_id' must be an integer or a non-empty string, "
                                 f"got {qid!r}")
        if not obj["category"].strip():
            raise SpecsweepError(f"{path} line {line}: field 'category' is empty")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise SpecsweepError(f"{path} line {line}: field 'turns' must be a non-empty list of non-empty strings "
                                 "(the user's turns)")
        return {"id": str(qid), "category": obj["category"], "turns": json.dumps(turns, ensure_ascii=False)}

    def finish(self, rows: list[dict], progress: bool) -> list[dict]:
        """Refuses a question id that appears twice (a conversation is keyed by it)."""
        seen: set[str] = set()
        for row in rows:
            if row["id"] in seen:
                raise SpecsweepError(f"question_id {row['id']!r} appears twice: each question needs its own id")
            seen.add(row["id"])
        return rows

    def fetch_summary(self, manifest: dict) -> str:
        counts = manifest.get("categories") or {}
        return f", {len(counts)} categories" if counts else ""

    def manifest_extra(self, records: list[dict]) -> dict:
        counts: dict[str, int] = {}
        for r in records:
            counts[r["category"]] = counts.get(r["category"], 0) + 1
        return {"categories": counts}

    def select(self, records: list[dict], categories: list[str] | None, per_category: int | None) -> list[dict]:
        """The questions of ``categories`` (None: all; each must be in the data), the first ``per_category`` of each
        category (None: all), in the data's order."""
        present = list(dict.fromkeys(r["category"] for r in records))
        if categories is not None and records:
            unknown = [c for c in categories if c not in present]
            if unknown:
                raise SpecsweepError(f"--categories: {', '.join(map(repr, unknown))} not in the data; it has "
                                     f"{', '.join(present)}")
        kept, counts = [], {}
        for r in records:
            c = r["category"]
            if categories is not None and c not in categories:
                continue
            if per_category is not None and counts.get(c, 0) >= per_category:
                continue
            counts[c] = counts.get(c, 0) + 1
            kept.append(r)
        return kept

    # ------------------------------------------------------------------------------------------------- runs

    def check_config(self, config) -> None:
        if not config.chat_template:
            raise SpecsweepError("--task spec_bench decodes conversations in the target's chat template, as Spec-Bench "
                                 "does: add --chat-template")
        if config.processes != 1:
            raise SpecsweepError("--task spec_bench builds each second turn from the answer to the first in one "
                                 "process: use --processes 1")
        if config.per_category is not None and config.per_category < 1:
            raise SpecsweepError(f"--per-category must be >= 1; got {config.per_category}")
        categories = config.categories_list()
        if categories is not None and not categories:
            raise SpecsweepError("--categories is empty: name categories, comma-separated (e.g. writing,qa)")

    def check_target(self, config) -> None:
        """Refuses a target whose tokenizer has no chat template (its tokenizer alone is loaded)."""
        from pipeline.models import load_tokenizer  # imports torch: the task registry stays light

        require_template(load_tokenizer(config.target), config.target)

    def decode_units(self, records: list[dict]) -> list[dict]:
        """Questions -> one unit per (question, turn): ``{"id": "<question id>-t<k>", "question_id", "category",
        "turn": k (1-based), "turns": [str, ...] (every user turn)}``; every first turn, then every second turn, ...
        (each turn's units in the questions' order)."""
        questions = [(r, json.loads(r["turns"])) for r in records]
        most = max((len(turns) for _, turns in questions), default=0)
        return [{"id": f"{r['id']}-t{k}", "question_id": r["id"], "category": r["category"], "turn": k,
                 "turns": turns}
                for k in range(1, most + 1) for r, turns in questions if len(turns) >= k]

    def batches(self, units: list[dict], size: int) -> list[list[dict]]:
        """Consecutive units of one turn at most ``size`` at a time: a batch never holds a turn and the turn after
        it (whose prompt reads its answer)."""
        out: list[list[dict]] = []
        for unit in units:
            if out and len(out[-1]) < size and out[-1][-1]["turn"] == unit["turn"]:
                out[-1].append(unit)
            else:
                out.append([unit])
        return out

    def timing_groups(self, units: list[dict], per_group: int) -> dict[str, list[dict]]:
        """Per category (in the units' order of first appearance): every turn of its first ``per_group``
        questions, turn 1s first."""
        chosen: dict[str, list[str]] = {}
        for u in units:
            ids = chosen.setdefault(u["category"], [])
            if u["question_id"] not in ids and len(ids) < per_group:
                ids.append(u["question_id"])
        return {c: [u for u in units if u["category"] == c and u["question_id"] in ids] for c, ids in chosen.items()}

    def encoder(self, target, tokenizer, processor, config) -> Encoder:
        from pipeline.models import max_positions  # imports torch: the task registry stays light

        return Conversations(tokenizer, config, max_positions(target.config))

    def score_run(self, samples, records, tokenizer, seed, ar_samples):
        from pipeline.categories import agreement  # imports torch: the task registry stays light

        if ar_samples is None:
            return {}, [{} for _ in samples]
        ar = {s["id"]: s["token_ids"] for s in ar_samples}
        missing = [s["id"] for s in samples if s["id"] not in ar]
        if missing:
            raise SpecsweepError(f"the AR outputs have no unit {missing[0]!r}: the baseline must decode the same "
                                 "questions (--categories, --per-category, --limit)")
        return agreement([s["token_ids"] for s in samples], [ar[s["id"]] for s in samples])

    def run_metrics(self, records, samples, measurement):
        from pipeline.categories import by_category  # imports torch: the task registry stays light

        return by_category(records, samples, measurement.get("groups"), GROUPS)


def require_template(tokenizer, target: str) -> None:
    """A one-line :class:`SpecsweepError` when ``tokenizer`` has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecsweepError(f"--task spec_bench needs a target with a chat template, and the tokenizer of {target} "
                             "has none: use a chat model, or save its tokenizer with a chat_template "
                             "(docs/gpu.md shows Vicuna's)")


class Conversations(PromptEncoder):
    """Spec-Bench's prompts for one run: each unit's conversation so far in the chat template. ``answered`` records
    each decoded turn's answer for the turns after it; ``limit`` is the target's positions."""

    def __init__(self, tokenizer, config, positions: int | None) -> None:
        super().__init__(config, positions)
        require_template(tokenizer, config.target)
        self.tokenizer = tokenizer
        self.answers: dict[tuple[str, int], str] = {}

    def answered(self, records: list[dict], texts: list[str]) -> None:
        for unit, text in zip(records, texts):
            self.answers[(unit["question_id"], unit["turn"])] = text.strip()

    def messages(self, unit: dict, last: str | None = None) -> list[dict]:
        """The unit's conversation: user turn 1, answer 1, ..., user turn k (``last`` in place of turn k's text)."""
        out = []
        for k in range(1, unit["turn"]):
            answer = self.answers.get((unit["question_id"], k))
            if answer is None:
                raise SpecsweepError(f"turn {unit['turn']} of question {unit['question_id']!r} was asked for before "
                                     f"turn {k} was answered: decode the turns in order")
            out += [{"role": "user", "content": unit["turns"][k - 1]}, {"role": "assistant", "content": answer}]
        return [*out, {"role": "user", "content": unit["turns"][unit["turn"] - 1] if last is None else last}]

    def prompt(self, unit: dict, last: str | None = None) -> str:
        return self.tokenizer.apply_chat_template(self.messages(unit, last), tokenize=False,
                                                  add_generation_prompt=True)

    def __call__(self, records: list[dict]) -> tuple[dict, Cuts]:
        texts, cuts = [], Cuts()
        for unit in records:
            text, dropped = self.fit(unit)
            cuts += Cuts(int(dropped > 0), int(dropped > 0), dropped, dropped)
            texts.append(text)
        return left_padded(texts, self.tokenizer, True), cuts

    def fit(self, unit: dict) -> tuple[str, int]:
        """The unit's prompt, its last user turn cut from the middle until the prompt fits the target -> (prompt,
        tokens cut from that turn)."""
        text = self.prompt(unit)
        excess = self.excess(text, self.tokenizer, True)
        if excess <= 0:
            return text, 0
        if self.rule == "error":
            raise self.too_long(f"unit {unit['id']!r}", excess,
                                "cut long turns with --long-inputs truncate, or lower --max-new-tokens")
        ids = self.tokenizer(unit["turns"][unit["turn"] - 1], add_special_tokens=False).input_ids
        keep = len(ids)
        while excess > 0:
            keep -= excess
            if keep < 2:
                raise SpecsweepError(
                    f"the target's {self.limit} positions leave no room for unit {unit['id']!r}: the conversation "
                    f"before its last turn, max_new_tokens ({self.max_new_tokens}) and the draft block "
                    f"({self.reserve}) take them all; lower --max-new-tokens")
            head = keep // 2
            last = self.tokenizer.decode(ids[:head]) + " ... " + self.tokenizer.decode(ids[len(ids) - (keep - head):])
            text = self.prompt(unit, last)
            excess = self.excess(text, self.tokenizer, True)
        return text, len(ids) - keep

    def warning(self, cuts: Cuts) -> str:
        return (f"{cuts.too_long} prompt(s) too long for the target's {self.limit} positions (prompt + max_new_tokens "
                f"+ max(γ, {DRAFT_RESERVE}) + 2) had their last user turn cut from the middle to fit ({cuts.most:g} "
                f"tokens at most, {cuts.total:g} in all); --long-inputs error stops the run instead")
