"""The search space of a study: γ, the acceptance rule and its parameters, dtype, the draft length, a draft with
another tokenizer's mode, and how the draft's weights are stored (int8, int4); read from sweeps/optuna_space.yaml
(or another YAML file) and the rule registry.

Each trial samples one point (:meth:`SearchSpace.suggest`); a rule's parameters are sampled only in that rule's
trials, over the registry's ranges (integer ones with suggest_int). The two objectives are :data:`OBJECTIVES`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import optuna
import yaml

from pipeline.config import DRAFT_QUANTS, DRAFTERS, LLAMA_CPP, LOOKUP_DRAFTERS, MODEL_DRAFTERS, RunConfig
from pipeline.decoding.drafters.cross_tokenizer import same_vocabulary
from pipeline.decoding.llama_cpp.quantize import GGUF_DTYPES
from pipeline.decoding.static import QUANTIZED_FAMILIES
from pipeline.dtypes import DTYPE_CHOICES
from pipeline.errors import SpecsweepError
from pipeline.models import architecture, load_tokenizer
from pipeline.rules import get_rule, param_names, tunable
from pipeline.tree_plan import is_widths
from pipeline.tree_shape import CHAIN, TREE_RULES, parse_widths

OBJECTIVES = ("speedup", "quality")


# ---------------------------------------------------------------------------------------------- search space

Range = tuple[float, float, bool]  # (low, high, log scale)


def _rule_ranges(rule_name: str) -> dict[str, Range]:
    """A rule's parameter ranges as the registry gives them (pipeline/rules.py)."""
    return {p.name: (p.low, p.high, p.log) for p in get_rule(rule_name).params}


def _integer_params(rule_name: str) -> set[str]:
    """The rule's integer-valued parameters (sampled with suggest_int over the integers in their range)."""
    return {p.name for p in get_rule(rule_name).params if p.integer}


DRAFT_MODES = ("fixed", "heuristic", "confidence")
"""How a trial drafts (pipeline/decoding/draft_policy.py): fixed γ; the heuristic schedule from γ up to γ_max; or the
confidence threshold with γ as the most a step drafts."""
_DRAFT_DEFAULTS = {"drafts": ("fixed",), "draft_confidence": (0.1, 0.9, False), "gamma_max": (2, 8)}


@dataclasses.dataclass
class SearchSpace:
    """Ranges a trial samples from (see sweeps/optuna_space.yaml). ``params``: per acceptance rule, the range of
    each of its parameters; a rule's parameters are sampled only in trials that chose it. Unset ranges are the
    registry's. ``drafts``: the draft-length modes (:data:`DRAFT_MODES`) a trial chooses from, with the confidence
    threshold's range (confidence trials) and γ_max's (heuristic trials, at least the trial's γ). ``tokenizer_modes``:
    for a draft with another tokenizer, the draft-tokenizer modes a trial chooses from
    (pipeline/decoding/drafters/cross_tokenizer.py;
    empty: not searched, the run's own setting). ``quants``: how a draft model's weights are stored
    (``--draft-quant``; empty: not searched, the run's own setting; an int4 trial in float32 is pruned).
    ``draft_p_min``, ``draft_min``: llama.cpp's draft probability floor and minimum draft length (``--engine
    llama.cpp``, a draft model's trials; None: not searched, the run's own setting; the minimum at most the trial's γ).
    ``gamma_by_drafter``: γ's range for the drafters named there, ``gamma`` for the rest (prompt lookup pays at a γ
    where a draft model's proposals are long rejected: README's pair table peaks at γ 12 for lookup, 5 for the draft
    model)."""

    gamma: tuple[int, int] = (1, 8)
    gamma_by_drafter: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    samplers: tuple[str, ...] = dataclasses.field(default_factory=tunable)
    params: dict[str, dict[str, Range]] = dataclasses.field(default_factory=dict)
    dtypes: tuple[str, ...] = ("float32",)
    known_good: dict = dataclasses.field(default_factory=lambda: {"sampler": "exact", "gamma": 4})
    drafts: tuple[str, ...] = ("fixed",)
    draft_confidence: Range = (0.1, 0.9, False)
    gamma_max: tuple[int, int] = (2, 8)
    tokenizer_modes: tuple[str, ...] = ()
    drafters: tuple[str, ...] = ("model",)
    lookup_max: tuple[int, int] = (1, 4)
    suffix_factor: Range = (0.5, 4.0, True)
    trees: tuple[str, ...] = ()
    quants: tuple[str, ...] = ()
    draft_p_min: Range | None = None
    draft_min: tuple[int, int] | None = None

    @classmethod
    def load(cls, path: str | os.PathLike) -> SearchSpace:
        """Read and check a search-space YAML; a problem is a one-line SpecsweepError."""
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SpecsweepError(f"search space {path}: cannot read it ({' '.join(str(e).split())[:160]})") from None
        if not isinstance(raw, dict):
            raise SpecsweepError(f"search space {path}: expected a mapping of settings")
        known = {"gamma", "gamma_by_drafter", "sampler", "params", "dtype", "known_good", "draft", "draft_confidence",
                 "gamma_max", "drafter", "lookup_max", "suffix_factor", "draft_tree", "draft_quant", "draft_p_min",
                 "draft_min"}
        if set(raw) - known:
            moved = sorted(set(raw) & set(param_names()))
            hint = (f" (rule parameters go under params: <rule>:, e.g. params: {{sigmoid: {{{moved[0]}: ...}}}})"
                    if moved else "")
            raise SpecsweepError(f"search space {path}: unknown keys {sorted(set(raw) - known)}; known: "
                                 f"{sorted(known)}{hint}")
        try:
            space = cls(
                gamma=tuple(int(v) for v in _range(raw.get("gamma", {"low": 1, "high": 8}))[:2]),
                gamma_by_drafter={str(d): tuple(int(v) for v in _range(spec)[:2])
                                  for d, spec in (raw.get("gamma_by_drafter") or {}).items()},
                samplers=tuple(raw.get("sampler", tunable())),
                params={rule: {name: _range(spec) for name, spec in (ranges or {}).items()}
                        for rule, ranges in (raw.get("params") or {}).items()},
                dtypes=tuple(raw.get("dtype", ("float32",))),
                known_good=dict(raw.get("known_good", {"sampler": "exact", "gamma": 4})),
                drafts=tuple(raw.get("draft", ("fixed",))),
                draft_confidence=_range(raw.get("draft_confidence", {"low": 0.1, "high": 0.9})),
                gamma_max=tuple(int(v) for v in _range(raw.get("gamma_max", {"low": 2, "high": 8}))[:2]),
                drafters=tuple(raw.get("drafter", ("model",))),
                lookup_max=tuple(int(v) for v in _range(raw.get("lookup_max", {"low": 1, "high": 4}))[:2]),
                suffix_factor=_range(raw.get("suffix_factor", {"low": 0.5, "high": 4.0, "log": True})),
                trees=tuple(str(t) for t in raw.get("draft_tree", ())),
                quants=tuple(str(q) for q in raw.get("draft_quant", ())),
                draft_p_min=_range(raw["draft_p_min"]) if "draft_p_min" in raw else None,
                draft_min=tuple(int(v) for v in _range(raw["draft_min"])[:2]) if "draft_min" in raw else None,
            )
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise SpecsweepError(f"search space {path}: {e}") from None
        return space.check(path)

    def check(self, where: object = "search space") -> SearchSpace:
        if not self.samplers or set(self.samplers) - set(tunable()):
            raise SpecsweepError(f"{where}: sampler must be a non-empty list from {list(tunable())}")
        if not self.dtypes or set(self.dtypes) - {*DTYPE_CHOICES, *GGUF_DTYPES}:   # GGUF types: --engine llama.cpp
            raise SpecsweepError(f"{where}: dtype must be a non-empty list from {[*DTYPE_CHOICES, *GGUF_DTYPES]}")
        if self.draft_p_min is not None and not 0 <= self.draft_p_min[0] <= self.draft_p_min[1] <= 1:
            raise SpecsweepError(f"{where}: draft_p_min needs 0 <= low <= high <= 1 (a probability); got "
                                 f"{list(self.draft_p_min[:2])}")
        if self.draft_min is not None and not 0 <= self.draft_min[0] <= self.draft_min[1]:
            raise SpecsweepError(f"{where}: draft_min needs 0 <= low <= high; got {list(self.draft_min)}")
        if self.gamma[0] < 1 or self.gamma[0] > self.gamma[1]:
            raise SpecsweepError(f"{where}: gamma needs 1 <= low <= high; got {list(self.gamma)}")
        for drafter, (lo, hi) in self.gamma_by_drafter.items():
            if drafter not in self.drafters:
                raise SpecsweepError(f"{where}: gamma_by_drafter names {drafter!r}, which is not in drafter "
                                     f"{list(self.drafters)}")
            if not 1 <= lo <= hi:
                raise SpecsweepError(f"{where}: gamma_by_drafter {drafter} needs 1 <= low <= high; got {[lo, hi]}")
        if not self.drafts or set(self.drafts) - set(DRAFT_MODES):
            raise SpecsweepError(f"{where}: draft must be a non-empty list from {list(DRAFT_MODES)}")
        lo, hi, _ = self.draft_confidence
        if not 0 < lo <= hi < 1:
            raise SpecsweepError(f"{where}: draft_confidence needs 0 < low <= high < 1 (a probability); got {[lo, hi]}")
        if self.gamma_max[0] > self.gamma_max[1] or self.gamma_max[1] < self.gamma[0]:
            raise SpecsweepError(f"{where}: gamma_max needs low <= high and high >= gamma's low; got "
                                 f"{list(self.gamma_max)}")
        if not self.drafters or set(self.drafters) - set(DRAFTERS):
            raise SpecsweepError(f"{where}: drafter must be a non-empty list from {list(DRAFTERS)}")
        if not 1 <= self.lookup_max[0] <= self.lookup_max[1] or not 0 < self.suffix_factor[0] <= self.suffix_factor[1]:
            raise SpecsweepError(f"{where}: lookup_max needs 1 <= low <= high and suffix_factor 0 < low <= high; got "
                                 f"{list(self.lookup_max)}, {list(self.suffix_factor[:2])}")
        for tree in self.trees:
            if not is_widths(tree):      # best:N needs a profile run of the pair: plan it, then run it as parents:
                raise SpecsweepError(f"{where}: draft_tree takes widths (or chain), not {tree!r}: run best:N with "
                                     "specsweep run --tree-profile")
            if tree != CHAIN:
                parse_widths(tree)
        if self.trees and not set(self.samplers) & set(TREE_RULES):
            raise SpecsweepError(f"{where}: draft_tree needs a rule that verifies trees in sampler "
                                 f"({list(TREE_RULES)})")
        if set(self.quants) - set(DRAFT_QUANTS):
            raise SpecsweepError(f"{where}: draft_quant must be a list from {list(DRAFT_QUANTS)}")
        for rule, ranges in self.params.items():
            if rule not in self.samplers:
                raise SpecsweepError(f"{where}: params for {rule!r}, which is not in sampler {list(self.samplers)}")
            unknown = sorted(set(ranges) - set(_rule_ranges(rule)))
            if unknown:
                raise SpecsweepError(f"{where}: {rule} has no parameter(s) {unknown}; it has "
                                     f"{list(_rule_ranges(rule))}")
        for rule in self.samplers:
            for name, (lo, hi, log) in self.ranges(rule).items():
                if lo > hi or (log and lo <= 0) or (name in _integer_params(rule) and math.ceil(lo) > math.floor(hi)):
                    raise SpecsweepError(f"{where}: bad {rule} {name} range {[lo, hi]}{' (log scale)' if log else ''}")
        return self

    def ranges(self, rule: str) -> dict[str, Range]:
        """The search range of each of ``rule``'s parameters: the space's where it sets one, else the registry's."""
        return {**_rule_ranges(rule), **self.params.get(rule, {})}

    def gamma_range(self, drafter: str) -> tuple[int, int]:
        """γ's (low, high) in trials of ``drafter``."""
        return self.gamma_by_drafter.get(drafter, self.gamma)

    def first_point(self, gamma: int | None = None) -> dict:
        """The known-good point enqueued before any sampled trial: the exact sampler (lossless)."""
        point = {"sampler": "exact", "gamma": self.known_good.get("gamma", 4), "dtype": self.dtypes[0],
                 **{k: v for k, v in self.known_good.items() if k in ("sampler", "gamma", "dtype")}}
        if gamma is not None:
            point["gamma"] = gamma
        if point["sampler"] not in self.samplers:
            point["sampler"] = self.samplers[0]
        drafter = "model" if "model" in self.drafters else self.drafters[0]
        if self.drafters != ("model",):
            point["drafter"] = drafter
        lo, hi = self.gamma_range(drafter)
        point["gamma"] = min(max(int(point["gamma"]), lo), hi)
        if self.searches_drafts:
            point["draft"] = "fixed" if "fixed" in self.drafts else self.drafts[0]
        if self.tokenizer_modes:
            point["draft_tokenizer_mode"] = self.tokenizer_modes[0]
        if self.trees:
            point["draft_tree"] = CHAIN if CHAIN in self.trees else self.trees[0]
        if self.quants:
            point["draft_quant"] = "none" if "none" in self.quants else self.quants[0]
        return point

    @property
    def searches_drafts(self) -> bool:
        """Whether trials choose a draft-length mode (else every trial drafts a fixed γ, as before)."""
        return self.drafts != ("fixed",)

    def recorded(self) -> dict:
        """The space as a study records it (JSON types); the draft-length settings only when they are searched, so a
        study created before they existed continues with the same space."""
        space = json.loads(json.dumps(dataclasses.asdict(self)))
        if not self.searches_drafts:
            for key in _DRAFT_DEFAULTS:
                space.pop(key)
        if not self.tokenizer_modes:
            space.pop("tokenizer_modes")
        if self.drafters == ("model",):
            for key in ("drafters", "lookup_max", "suffix_factor"):
                space.pop(key)
        if not self.trees:
            space.pop("trees")
        if not self.quants:
            space.pop("quants")
        for key in ("draft_p_min", "draft_min"):
            if space[key] is None:
                space.pop(key)
        if not self.gamma_by_drafter:
            space.pop("gamma_by_drafter")
        return space

    def suggest(self, trial, temperature: float = 1.0) -> dict:
        """Sample one trial's settings (a rule's parameters exist only in trials of that rule; a drafter's only in
        trials of that drafter). A trial pairing a drafter without a model with a rule that cannot verify its
        deterministic drafts at ``temperature`` is pruned before it runs (optuna.TrialPruned)."""
        drafter = "model"
        if self.drafters != ("model",):
            drafter = trial.suggest_categorical("drafter", list(self.drafters))
        # one parameter "gamma" whose range depends on the drafter (Optuna takes a range that varies between trials)
        params = {"gamma": trial.suggest_int("gamma", *self.gamma_range(drafter)),
                  "sampler": trial.suggest_categorical("sampler", list(self.samplers)),
                  "dtype": trial.suggest_categorical("dtype", list(self.dtypes))}
        if self.drafters != ("model",):
            params.update(self._suggest_drafter(trial, drafter))
            if drafter != "model" and get_rule(params["sampler"]).deterministic_draft_error(temperature):
                raise optuna.TrialPruned(f"{params['sampler']} cannot verify {drafter}'s deterministic drafts")
        integers = _integer_params(params["sampler"])
        for name, (lo, hi, log) in self.ranges(params["sampler"]).items():
            if name in integers:
                params[name] = trial.suggest_int(name, math.ceil(lo), math.floor(hi), log=log)
            else:
                params[name] = trial.suggest_float(name, lo, hi, log=log)
        if self.trees and drafter != "lookup-model":  # a draft model's tree, or several matches of a lookup drafter
            params.update(self._suggest_tree(trial, params["sampler"]))
        if self.searches_drafts and drafter in MODEL_DRAFTERS and "draft_tree" not in params:
            params.update(self._suggest_draft(trial, params["gamma"]))
        if self.tokenizer_modes and drafter == "model":
            params["draft_tokenizer_mode"] = trial.suggest_categorical("draft_tokenizer_mode",
                                                                       list(self.tokenizer_modes))
        if drafter == "model" and self.draft_p_min is not None:
            lo, hi, log = self.draft_p_min
            params["draft_p_min"] = trial.suggest_float("draft_p_min", lo, hi, log=log)
        if drafter == "model" and self.draft_min is not None:
            lo, hi = self.draft_min
            params["draft_min"] = trial.suggest_int("draft_min", min(lo, params["gamma"]), min(hi, params["gamma"]))
        if self.quants and drafter in MODEL_DRAFTERS:
            params["draft_quant"] = trial.suggest_categorical("draft_quant", list(self.quants))
            if params["draft_quant"].startswith("int4") and params["dtype"] != "bfloat16":
                raise optuna.TrialPruned(f"--draft-quant {params['draft_quant']} runs in bfloat16, not "
                                         f"{params['dtype']}")
        return params

    def _suggest_drafter(self, trial, drafter: str) -> dict:
        """The trial's drafter and its parameters as run settings."""
        if drafter in LOOKUP_DRAFTERS:
            return {"drafter": drafter, "lookup_min": 1,
                    "lookup_max": trial.suggest_int("lookup_max", *self.lookup_max)}
        if drafter == "suffix":
            lo, hi, log = self.suffix_factor
            return {"drafter": drafter, "suffix_factor": trial.suggest_float("suffix_factor", lo, hi, log=log)}
        return {"drafter": drafter}

    def _suggest_tree(self, trial, sampler: str) -> dict:
        """The trial's token tree (pipeline/tree_shape.py) as run settings: {} for a chain, else draft_tree (its
        node count replaces γ). A tree with a rule that cannot verify one is pruned before it runs."""
        tree = trial.suggest_categorical("draft_tree", list(self.trees))
        if tree == CHAIN:
            return {}
        if sampler not in TREE_RULES:
            raise optuna.TrialPruned(f"{sampler} cannot verify a token tree (draft_tree {tree})")
        return {"draft_tree": tree}

    def _suggest_draft(self, trial, gamma: int) -> dict:
        """The trial's draft length as run settings (draft_schedule, draft_confidence, gamma_max)."""
        mode = trial.suggest_categorical("draft", list(self.drafts))
        if mode == "heuristic":
            top = max(gamma, self.gamma_max[1])
            return {"draft_schedule": "heuristic", "draft_confidence": 0.0,
                    "gamma_max": trial.suggest_int("gamma_max", min(max(gamma, self.gamma_max[0]), top), top)}
        if mode == "confidence":
            lo, hi, log = self.draft_confidence
            return {"draft_schedule": "constant", "gamma_max": None,
                    "draft_confidence": trial.suggest_float("draft_confidence", lo, hi, log=log)}
        return {"draft_schedule": "constant", "draft_confidence": 0.0, "gamma_max": None}


def _range(spec) -> Range:
    """{low, high[, log]} or [low, high] -> (low, high, log)."""
    if isinstance(spec, dict):
        return float(spec["low"]), float(spec["high"]), bool(spec.get("log", False))
    lo, hi = spec
    return float(lo), float(hi), False


def space_for_pair(space: SearchSpace, base: RunConfig) -> SearchSpace:
    """``space`` for the run's pair. A pair without a draft model searches the drafters that need none (a space of
    the model drafter alone is refused in one line). A draft with another tokenizer than the target's
    (pipeline/decoding/drafters/cross_tokenizer.py) drafts a fixed γ (an adaptive trial could only fail), its trials
    choose how to bridge the tokenizers (intersection or string; which is faster depends on the pair) unless
    ``--draft-tokenizer-mode`` fixes it, and they all use that draft. A draft of a family whose forward takes no
    quantised weights (pipeline/decoding/static/; Whisper's, GPT-2's) does not search ``draft_quant``."""
    if not base.draft:
        without = tuple(d for d in space.drafters if d not in MODEL_DRAFTERS)
        if not without:
            raise SpecsweepError("the search space's drafters are ['model'] and this pair has no --draft: give a "
                                 "draft or add prompt-lookup or suffix to the space's drafter list")
        return space if without == space.drafters else dataclasses.replace(space, drafters=without)
    if space.quants and architecture(base.draft) not in QUANTIZED_FAMILIES:
        print(f"the draft {base.draft} is a {architecture(base.draft)}, whose forward takes no quantised weights: "
              "trials keep its weights (draft_quant not searched)", file=sys.stderr)
        space = dataclasses.replace(space, quants=())
    if base.engine == LLAMA_CPP:     # its draft shares the target's vocabulary (llama-server checks); GGUF files only
        return space
    if base.drafter not in MODEL_DRAFTERS or same_vocabulary(load_tokenizer(base.target), load_tokenizer(base.draft)):
        return space
    modes = ("intersection", "string") if base.draft_tokenizer_mode == "auto" else ()
    print(f"the draft {base.draft} has another tokenizer than the target's: trials draft a fixed γ"
          + (f" and choose the draft-tokenizer mode from {list(modes)}" if modes else ""), file=sys.stderr)
    # its study is about that draft: the drafters without a model are searched in the matched pair's study
    return dataclasses.replace(space, drafts=("fixed",), tokenizer_modes=modes, drafters=("model",), trees=())
