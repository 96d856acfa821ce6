"""Acceptance rules: the registry of verify steps a run can use, and everything the rest of the project knows
about each one.

One :class:`Rule` per name holds its parameters (names, defaults, the ranges a search samples them from),
its presets, whether it is lossless, which backends implement it (lazy ``"module:Class"`` references, so
listing the rules imports no torch), and what it demands of a run. ``RunConfig`` validation, the CLI's
``--sampler`` choices and per-parameter flags, :func:`pipeline.samplers.get_sampler`, the Optuna search
space, the report's lossless ring and the recommendation all read it. Adding a rule is adding an entry here
and its implementation under ``pipeline/samplers/`` (held to the torch reference by the sampler tests).

    exact    modified rejection sampling (Leviathan et al. 2023, Chen et al. 2023): lossless
    block    block verification (Sun et al., ICLR 2025; pipeline/samplers/block.py): the draft block verified
             jointly; lossless, never fewer accepted tokens in expectation than exact
    sigmoid  the paper's approximation, softmax replaced by sigmoid(alpha * z / T + beta): lossy
    greedy   accept while the draft token is the target's argmax: reproduces greedy decoding (lossless at T = 0)
    hf       transformers' own verify step (the baseline the paper measured against): lossless, T > 0, batch 1
    typical, fuzzy, relaxed, accept_all   lossy rules from other work (pipeline/samplers/lossy.py): Medusa's
             typical acceptance, fuzzy speculative decoding, TensorRT-LLM's relaxed acceptance, and the floor
    synthetic  not a verify rule (pipeline/samplers/synthetic.py): each draft position accepted at a set rate
             (--synthetic-acceptance, or per position --synthetic-rates), whatever the models say, so a pair with
             random weights decodes with a real pair's tokens per step; speed only (``Rule.speed_only``): never
             lossless, never tuned, and its quality is no claim

Deterministic drafts (a sampler called with ``draft_logits=None``: prompt lookup, suffix decoding, string-mode
drafts; pipeline/samplers/contract.py): ``Rule.deterministic_drafts`` says whether a rule takes one ("always",
"at T = 0" or "never") and ``deterministic_refusal`` why not, so a run can be refused before it starts
(:meth:`Rule.check_run` with ``deterministic_draft=True``). Every rule takes them except sigmoid at T > 0, whose
acceptance ratio sigmoid(z_t) / sigmoid(z_d) needs the draft's logits.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field

from pipeline.errors import SamplerInputError, SpecsweepError

# Sampler backends: the module that says whether it can run here (available(), unavailable_reason()).
BACKENDS = {"torch": None, "cupy": "pipeline.samplers.cupy_backend"}


@dataclass(frozen=True)
class Param:
    """A numeric parameter of a rule: its default, and the range a search samples it from."""

    name: str
    default: float
    low: float
    high: float
    log: bool = False   # sample on a log scale (the range must then be positive)
    help: str = ""
    integer: bool = False  # integer-valued: a search samples integers, the CLI flag takes an int


@dataclass(frozen=True)
class Rule:
    """One acceptance rule.

    lossless: "always" (the output follows the target's distribution at any temperature), "at T = 0" (it
    reproduces the target's greedy decoding, so it is lossless only for greedy decoding) or "never".
    backends: backend name -> "module:Class" of its implementation (imported on first use).
    """

    name: str
    summary: str
    lossless: str
    backends: dict[str, str]
    params: tuple[Param, ...] = ()
    presets: dict[str, dict[str, float]] = field(default_factory=dict)
    tunable: bool = False            # offered to the Optuna study
    uses_temperature: bool = True    # False: it verifies by argmax whatever the temperature (greedy)
    needs_sampling: bool = False     # temperature > 0 only
    batch_one: bool = False          # batch size 1 only in our engine
    # whether the rule verifies a deterministic draft (draft_logits=None): "always", "at T = 0" (it verifies greedily
    # there) or "never"; deterministic_refusal says why not and what to do (the one-line refusal's reason)
    deterministic_drafts: str = "always"
    deterministic_refusal: str = ""
    # acceptance decided by set rates, not by the models (synthetic): a run measures speed only; its output and quality
    # scores say nothing about any rule (the runs table leaves its quality out, the report says so)
    speed_only: bool = False

    def is_lossless(self, temperature) -> bool:
        """Whether a run of this rule at ``temperature`` follows the target exactly."""
        return _holds_at(self.lossless, temperature)

    def takes_deterministic_drafts(self, temperature) -> bool:
        """Whether this rule at ``temperature`` verifies a deterministic draft (``draft_logits=None``)."""
        return _holds_at(self.deterministic_drafts, temperature)

    def deterministic_draft_error(self, temperature) -> str | None:
        """None where this rule at ``temperature`` takes a deterministic draft, else the one-line reason it does not
        (what is wrong, what to do)."""
        if self.takes_deterministic_drafts(temperature):
            return None
        where = " at T > 0" if self.deterministic_drafts == "at T = 0" else ""
        return f"sampler {self.name}{where} cannot verify a deterministic draft (draft_logits=None): " \
               f"{self.deterministic_refusal}"

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def defaults(self) -> dict[str, float]:
        return {p.name: p.default for p in self.params}

    def effective(self, values: dict, preset: str | None = None) -> dict[str, float]:
        """The parameter values a run used: its own where given, else the preset's, else the defaults."""
        base = {**self.defaults(), **(self.presets.get(preset, {}) if preset else {})}
        return {k: float(values[k]) if _is_number(values.get(k)) else v for k, v in base.items()}

    def implementation(self, backend: str) -> type:
        """The class implementing this rule on ``backend`` (imports it)."""
        module, _, cls = self.backends[backend].partition(":")
        return getattr(importlib.import_module(module), cls)

    def with_preset(self, preset: str | None, params: dict) -> dict:
        """``params`` with the preset's values added (a copy; unchanged without a preset). One-line
        SamplerInputError for a preset this rule does not have, or one given with a parameter it fixes. The CLI's
        checks (:meth:`check_run`) and :func:`pipeline.samplers.get_sampler` both come here."""
        if preset is None:
            return dict(params)
        if preset not in self.presets:
            has = f"its presets: {', '.join(self.presets)}" if self.presets else "it has none"
            raise SamplerInputError(f"preset {preset!r} does not exist for rule {self.name} ({has})")
        fixed = self.presets[preset]
        if set(fixed) & set(params):
            raise SamplerInputError(f"preset {preset!r} fixes {', '.join(fixed)}: give either the preset or those "
                                    "parameters")
        return {**params, **fixed}

    def check_run(self, *, backend: str, temperature: float, batch_size: int, engine: str, params: dict,
                  preset: str | None, deterministic_draft: bool = False) -> None:
        """Raise SpecsweepError (one line: what is wrong, what to do) when a run cannot use this rule so.
        ``deterministic_draft``: the run's drafter proposes without a distribution (draft_logits=None)."""
        if deterministic_draft:
            error = self.deterministic_draft_error(temperature)
            if error is not None:
                raise SpecsweepError(error)
        if backend not in self.backends:
            raise SpecsweepError(f"--sampler {self.name} has no {backend!r} backend: use --backend "
                                 f"{' or '.join(self.backends)}")
        unknown = sorted(set(params) - set(self.param_names))
        if unknown:
            takes = ", ".join(f"--{n}" for n in self.param_names) or "no parameters"
            raise SpecsweepError(f"--{'/--'.join(unknown)} do(es) not apply to --sampler {self.name} (it takes "
                                 f"{takes})")
        self.with_preset(preset, params)
        if self.needs_sampling and temperature == 0:
            raise SpecsweepError(f"--sampler {self.name} needs --temperature > 0: at T = 0 use --sampler greedy")
        if self.batch_one and engine == "specsweep" and batch_size != 1:
            raise SpecsweepError(f"--sampler {self.name} runs batch 1: use --batch-size 1")
        for p in self.params:
            if p.name in params and not math.isfinite(float(params[p.name])):
                raise SpecsweepError(f"--{p.name} must be a finite number; got {params[p.name]}")
            if p.name in params and p.integer and float(params[p.name]) != int(float(params[p.name])):
                raise SpecsweepError(f"--{p.name} must be an integer; got {params[p.name]}")


def _holds_at(when: str, temperature) -> bool:
    """Whether a property stated as "always", "at T = 0" or "never" holds at ``temperature`` (False for a
    temperature that is not a number)."""
    if when == "always":
        return True
    try:
        return when == "at T = 0" and float(temperature) == 0.0
    except (TypeError, ValueError):
        return False


def _is_number(value) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


_SAMPLERS = "pipeline.samplers"
RULES: dict[str, Rule] = {rule.name: rule for rule in (
    Rule("exact", "modified rejection sampling: the output follows the target exactly", "always",
         {"torch": f"{_SAMPLERS}.torch_ref:ExactSampler", "cupy": f"{_SAMPLERS}.cupy_backend:ExactSampler"},
         tunable=True),
    Rule("block", "block verification (Sun et al. 2025): the draft block verified jointly, lossless, accepts "
         "at least as many tokens as exact", "always", {"torch": f"{_SAMPLERS}.block:BlockSampler"}, tunable=True),
    Rule("sigmoid", "the paper's approximation: softmax replaced by sigmoid(alpha * z / T + beta)", "never",
         {"torch": f"{_SAMPLERS}.torch_ref:SigmoidSampler", "cupy": f"{_SAMPLERS}.cupy_backend:SigmoidSampler"},
         params=(Param("alpha", 1.0, 0.25, 4.0, log=True, help="sigmoid: scale of the tempered logit (> 0)"),
                 Param("beta", -20.0, -30.0, 0.0, help="sigmoid: shift")),
         # the constants of the paper's released kernels: sigmoid((z + 1e4) / 2e4)
         presets={"paper": {"alpha": 1.0 / 2e4, "beta": 1e4 / 2e4}},
         tunable=True, deterministic_drafts="at T = 0",
         deterministic_refusal="its acceptance ratio sigmoid(z_t) / sigmoid(z_d) needs the draft's logits; use "
                               "--sampler exact (lossless; with a deterministic draft it reads only the target)"),
    Rule("greedy", "accept while the draft token is the target's argmax (greedy decoding)", "at T = 0",
         {"torch": f"{_SAMPLERS}.torch_ref:GreedySampler", "cupy": f"{_SAMPLERS}.cupy_backend:GreedySampler"},
         uses_temperature=False),
    Rule("hf", "transformers' own verify step, the baseline (batch 1, T > 0)", "always",
         {"torch": f"{_SAMPLERS}.hf:HFSampler"}, needs_sampling=True, batch_one=True),
    # Lossy rules (pipeline/samplers/lossy.py gives each one's definition and source).
    Rule("typical", "typical acceptance (Medusa; vLLM): accept while p(x) > min(epsilon, delta * exp(-H(p)))",
         "never", {"torch": f"{_SAMPLERS}.lossy:TypicalSampler"},
         params=(Param("epsilon", 0.09, 0.01, 0.3, log=True,
                       help="typical: posterior threshold, vLLM's posterior_threshold (in [0, 1))"),
                 Param("delta", 0.3, 0.05, 0.6, log=True,
                       help="typical: factor of the entropy threshold exp(-H(p)), vLLM's posterior_alpha (>= 0)")),
         tunable=True),
    Rule("fuzzy", "fuzzy speculative decoding (Holsman et al. 2025): accept outright where JS(p, q) < threshold, "
         "exact's test elsewhere", "never", {"torch": f"{_SAMPLERS}.lossy:FuzzySampler"},
         params=(Param("threshold", 0.4, 0.01, 0.69, log=True,
                       help="fuzzy: Jensen-Shannon divergence (nats, at most ln 2) below which a draft token is "
                            "accepted outright (<= 0: exact)"),),
         tunable=True),
    Rule("relaxed", "relaxed acceptance (TensorRT-LLM MTP): accept a target top-k token whose probability is within "
         "prob_delta of the top one, else the target's argmax", "never", {"torch": f"{_SAMPLERS}.lossy:RelaxedSampler"},
         params=(Param("top_k", 10, 1, 10, integer=True,
                       help="relaxed: how many of the target's top tokens a draft token may be (1: greedy)"),
                 Param("prob_delta", 0.6, 0.0, 1.0,
                       help="relaxed: largest gap to the target's top probability (a probability, not a log)")),
         tunable=True, uses_temperature=False),
    Rule("accept_all", "every draft token accepted, the bonus token from the target: what the draft alone is worth",
         "never", {"torch": f"{_SAMPLERS}.lossy:AcceptAllSampler"}),
    # Speed only: acceptance at set rates, for a pair with random weights at a real pair's shapes.
    Rule("synthetic", "synthetic acceptance (speed only, no quality): each draft position accepted at a set rate "
         "given the ones before it, then the target's argmax", "never",
         {"torch": f"{_SAMPLERS}.synthetic:SyntheticSampler"},
         params=(Param("synthetic_acceptance", 0.8, 0.0, 1.0,
                       help="synthetic: the rate at which each draft position is accepted once the ones before it "
                            "were, in [0, 1] (speed measurements only; per position: --synthetic-rates)"),),
         speed_only=True),
)}
RULE_NAMES = tuple(RULES)


def get_rule(name: str) -> Rule:
    """The rule called ``name``; a SpecsweepError naming the known ones otherwise."""
    try:
        return RULES[name]
    except KeyError:
        raise SpecsweepError(f"unknown sampler {name!r}: choose one of {list(RULES)}") from None


def param_names() -> tuple[str, ...]:
    """Every rule parameter's name, each once, in registry order (the CLI adds one flag per name)."""
    return tuple(dict.fromkeys(p.name for rule in RULES.values() for p in rule.params))


def param_is_integer(name: str) -> bool:
    """Whether the rule parameter ``name`` is integer-valued in every rule that has it (its CLI flag takes an int)."""
    found = [p.integer for rule in RULES.values() for p in rule.params if p.name == name]
    return bool(found) and all(found)


def param_help(name: str) -> str:
    """--help text of a rule parameter: each rule's description and default."""
    return "; ".join(f"{p.help} (default {p.default:g})" for rule in RULES.values() for p in rule.params
                     if p.name == name)


def preset_names() -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for rule in RULES.values() for name in rule.presets))


def is_lossless(sampler, temperature) -> bool:
    """Whether a run of ``sampler`` at ``temperature`` follows the target exactly (False for unknown names)."""
    rule = RULES.get(sampler)
    return rule is not None and rule.is_lossless(temperature)


def is_speed_only(sampler) -> bool:
    """Whether ``sampler``'s runs measure speed only (synthetic acceptance: no quality claim; False for unknown
    names)."""
    rule = RULES.get(sampler)
    return rule is not None and rule.speed_only


SPEED_ONLY_NOTE = ("synthetic acceptance: speed only, no quality (each draft position accepted at a set rate, not by "
                   "the models)")


def tunable() -> tuple[str, ...]:
    """Rules the Optuna study may choose."""
    return tuple(name for name, rule in RULES.items() if rule.tunable)
