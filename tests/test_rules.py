"""The acceptance-rule registry (pipeline/rules.py) is the one owner of what a rule is: its implementations, its
parameters and their defaults and search ranges, its presets, whether it is lossless, and what it demands of a run.
Everything that used to list these (the CLI, RunConfig, the Optuna space, the report) reads it."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.commands import run as run_command
from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.rules import RULES, get_rule, is_lossless, param_names, tunable
from pipeline.samplers import get_sampler
from pipeline.tuning.space import SearchSpace

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", list(RULES))
def test_each_rule_names_its_torch_implementation_and_the_defaults_it_uses(name):
    rule = RULES[name]
    cls = rule.implementation("torch")
    assert cls.name == name and cls.backend == "torch"
    init = inspect.signature(cls.__init__).parameters
    for p in rule.params:
        assert init[p.name].default == p.default, f"{name}.{p.name}: the class and the registry disagree"
        assert p.low <= p.default <= p.high and (not p.log or p.low > 0)
    sampler = get_sampler(name, temperature=1.0)
    assert {k: getattr(sampler, k) for k in rule.param_names} == rule.defaults()
    for preset, values in rule.presets.items():
        assert {k: getattr(get_sampler(name, preset=preset), k) for k in values} == values


def test_listing_the_rules_imports_no_torch():
    code = ("import sys, pipeline.rules as r; r.param_names(); r.tunable(); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("sampler,temperature,lossless", [
    ("exact", 1.0, True), ("exact", 0.0, True), ("hf", 0.7, True), ("greedy", 0.0, True), ("greedy", 1.0, False),
    ("greedy", "0", True), ("greedy", None, False), ("sigmoid", 0.0, False), ("nope", 0.0, False),
])
def test_lossless_comes_from_the_registry(sampler, temperature, lossless):
    assert is_lossless(sampler, temperature) is lossless


def _parse(argv: list[str], exclude: tuple[str, ...] = ()) -> dict:
    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser, exclude=exclude)
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if k not in run_command.DISPLAY_FLAGS}


def test_cli_flags_are_derived_from_the_run_config_so_defaults_exist_once():
    parsed = _parse(["--target", "t", "--data", "d"])
    assert RunConfig.from_dict(parsed) == RunConfig(target="t", data="d")
    settings = {f.name for f in dataclasses.fields(RunConfig) if f.metadata.get("help")}
    assert settings | set(param_names()) == set(parsed)
    # both spellings a W&B agent or DVC may pass, booleans included, and every rule parameter
    parsed = _parse(["--target", "t", "--data", "d", "--max_new_tokens=7", "--no-static-cache", "--sampler",
                     "sigmoid", "--alpha", "2", "--ignore_eos"])
    cfg = RunConfig.from_dict(parsed)
    assert (cfg.max_new_tokens, cfg.static_cache, cfg.ignore_eos, cfg.rule_params) == (7, False, True, {"alpha": 2.0})
    assert set(_parse(["--target", "t", "--data", "d"], exclude=("gamma", *param_names()))) \
        == set(parsed) - {"gamma", *param_names()}


def test_rule_parameters_are_flat_outside_the_config_and_round_trip():
    cfg = RunConfig.from_dict({"target": "t", "data": "d", "sampler": "sigmoid", "alpha": 0.5, "beta": None})
    assert cfg.rule_params == {"alpha": 0.5}
    flat = cfg.to_dict()
    assert flat["alpha"] == 0.5 and flat["beta"] is None and "rule_params" not in flat
    assert RunConfig.from_dict(flat) == cfg
    with pytest.raises(SpecsweepError, match="unknown run settings"):
        RunConfig.from_dict({"target": "t", "data": "d", "epsilon_typo": 1})


@pytest.mark.parametrize("settings,message", [
    ({"sampler": "exact", "alpha": 1.0}, "--alpha do(es) not apply to --sampler exact (it takes no parameters)"),
    ({"sampler": "greedy", "preset": "paper"}, "preset 'paper' does not exist for rule greedy (it has none)"),
    ({"sampler": "sigmoid", "preset": "paper", "beta": 1.0}, "preset 'paper' fixes alpha, beta"),
    ({"sampler": "sigmoid", "alpha": float("inf")}, "--alpha must be a finite number"),
    ({"sampler": "hf", "temperature": 0.0}, "--sampler hf needs --temperature > 0"),
    ({"sampler": "hf", "batch_size": 2}, "--sampler hf runs batch 1"),
    ({"sampler": "hf", "backend": "cupy"}, "--sampler hf has no 'cupy' backend"),
])
def test_run_config_checks_a_rule_through_the_registry(tmp_path, settings, message):
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    cfg = RunConfig.from_dict({"target": "t", "data": str(data), "draft": "d", **settings})
    with pytest.raises(SpecsweepError) as e:
        cfg.validate()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_search_space_takes_each_rules_ranges_from_the_registry(tmp_path):
    space = SearchSpace()
    assert space.samplers == tunable() and {"exact", "block", "sigmoid"} <= set(tunable())
    assert space.ranges("sigmoid") == {p.name: (p.low, p.high, p.log) for p in get_rule("sigmoid").params}
    assert space.ranges("exact") == {}
    narrowed = tmp_path / "space.yaml"
    narrowed.write_text("sampler: [exact, sigmoid]\nparams: {sigmoid: {alpha: {low: 0.5, high: 2.0, log: true}}}\n")
    assert SearchSpace.load(narrowed).ranges("sigmoid")["alpha"] == (0.5, 2.0, True)
    assert SearchSpace.load(narrowed).ranges("sigmoid")["beta"] == (-30.0, 0.0, False)
    for text, message in [("alpha: {low: 1, high: 2}\n", "rule parameters go under params"),
                          ("params: {sigmoid: {gamma: [1, 2]}}\n", "sigmoid has no parameter(s) ['gamma']"),
                          ("sampler: [exact]\nparams: {sigmoid: {alpha: [1, 2]}}\n", "which is not in sampler"),
                          ("params: {sigmoid: {alpha: {low: -1, high: 2, log: true}}}\n", "bad sigmoid alpha range"),
                          ("sampler: [greedy]\n", f"sampler must be a non-empty list from {list(tunable())}")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(SpecsweepError) as e:
            SearchSpace.load(bad)
        assert message in str(e.value)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in (REPO / "sweeps").glob("optuna_space*.yaml")))
def test_every_search_space_the_repository_ships_loads(path):
    space = SearchSpace.load(REPO / path)
    assert space.first_point()["sampler"] in space.samplers


def test_the_sigmoid_study_samples_alpha_and_beta_in_the_registrys_ranges_at_one_gamma():
    optuna = pytest.importorskip("optuna")
    space = SearchSpace.load(REPO / "sweeps" / "optuna_space.sigmoid.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    alpha, beta = get_rule("sigmoid").params
    for _ in range(10):
        params = space.suggest(study.ask(), temperature=1.0)
        assert params["sampler"] == "sigmoid" and params["gamma"] == 4 and params["dtype"] == "bfloat16"
        assert alpha.low <= params["alpha"] <= alpha.high and beta.low <= params["beta"] <= beta.high


def test_a_trial_samples_only_its_own_rules_parameters():
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = {}
    for _ in range(20 * len(tunable())):  # enough random trials to see every tunable rule
        params = SearchSpace().suggest(study.ask())
        rule = get_rule(params["sampler"])
        seen.setdefault(rule.name, set()).update(set(params) - {"gamma", "sampler", "dtype"})
        for p in rule.params:  # in the registry's range, and an int where the parameter is integer-valued
            assert p.low <= params[p.name] <= p.high and isinstance(params[p.name], int) is p.integer, (rule.name, p)
    assert seen == {name: set(get_rule(name).param_names) for name in tunable()}


def test_a_study_refuses_to_continue_with_another_search_space(tmp_path):
    pytest.importorskip("optuna")
    from pipeline.tuning.study import _open_worker_study

    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = SearchSpace(samplers=("exact", "sigmoid"))
    _open_worker_study(first, "s", url, 0, 30, None, 2)
    _open_worker_study(first, "s", url, 0, 30, None, 2)                     # the same space continues
    with pytest.raises(SpecsweepError) as e:
        _open_worker_study(SearchSpace(samplers=("exact", "block")), "s", url, 0, 30, None, 2)
    assert "created with another search space (it differs in ['samplers'])" in str(e.value)
