"""W&B sweeps: every sweeps/*.yaml sweep validates against W&B's sweep config schema, and a point of each, turned
into a command line the way `wandb agent` does it, runs `specsweep run` to a result offline."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_models import save_pair, write_articles

from pipeline.cli import main

REPO = Path(__file__).resolve().parents[1]
SWEEPS = sorted(p for p in (REPO / "sweeps").glob("*.yaml") if not p.name.startswith("optuna_"))

# W&B's sweep config JSON schema: config/schema.json of the `sweeps` package (0.2.0), which wandb's controller
# validates with (`sweeps.schema_violations_from_proposed_config`). Copied with descriptions and defaults removed:
# installing wandb[sweeps] would pin numpy < 2.
SCHEMA = {'additionalProperties': False,
 'definitions': {'hyperband_stopping': {'additionalProperties': False,
                                        'anyOf': [{'required': ['max_iter', 's']}, {'required': ['min_iter']}],
                                        'properties': {'eta': {'exclusiveMinimum': 1, 'type': 'number'},
                                                       'max_iter': {'type': 'integer'},
                                                       'min_iter': {'minimum': 1, 'type': 'integer'},
                                                       's': {'type': 'number'},
                                                       'type': {'enum': ['hyperband'], 'type': 'string'}},
                                        'required': ['type'],
                                        'type': 'object'},
                 'param_beta': {'additionalProperties': False,
                                'properties': {'a': {'minimum': 0, 'type': 'number'},
                                               'b': {'minimum': 0, 'type': 'number'},
                                               'distribution': {'enum': ['beta']}},
                                'required': ['distribution'],
                                'type': 'object'},
                 'param_categorical': {'additionalProperties': False,
                                       'properties': {'distribution': {'enum': ['categorical']},
                                                      'values': {'minItems': 1, 'type': 'array'}},
                                       'required': ['values'],
                                       'type': 'object'},
                 'param_categorical_w_probabilities': {'additionalProperties': False,
                                                       'properties': {'distribution': {
                                                           'enum': ['categorical_w_probabilities']},
                                                                      'probabilities': {'items': {'minimum': 0,
                                                                                                  'type': 'number'},
                                                                                        'minItems': 1,
                                                                                        'type': 'array'},
                                                                      'values': {'minItems': 1, 'type': 'array'}},
                                                       'required': ['values', 'probabilities'],
                                                       'type': 'object'},
                 'param_dict': {'additionalProperties': False,
                                'properties': {'parameters': {'$ref': '#/definitions/parameters'}},
                                'required': ['parameters'],
                                'type': 'object'},
                 'param_int_uniform': {'additionalProperties': False,
                                       'properties': {'distribution': {'enum': ['int_uniform']},
                                                      'max': {'format': 'integer', 'type': 'integer'},
                                                      'min': {'format': 'integer', 'type': 'integer'}},
                                       'required': ['min', 'max'],
                                       'type': 'object'},
                 'param_inv_loguniform': {'additionalProperties': False,
                                          'properties': {'distribution': {'enum': ['inv_log_uniform']},
                                                         'max': {'type': 'number'},
                                                         'min': {'type': 'number'}},
                                          'required': ['distribution', 'max', 'min'],
                                          'type': 'object'},
                 'param_inv_loguniform_v2': {'additionalProperties': False,
                                             'properties': {'distribution': {'enum': ['inv_log_uniform_values']},
                                                            'max': {'type': 'number'},
                                                            'min': {'exclusiveMinimum': 0.0, 'type': 'number'}},
                                             'required': ['distribution', 'max', 'min'],
                                             'type': 'object'},
                 'param_lognormal': {'additionalProperties': False,
                                     'properties': {'distribution': {'enum': ['log_normal']},
                                                    'mu': {'type': 'number'},
                                                    'sigma': {'minimum': 0, 'type': 'number'}},
                                     'required': ['distribution'],
                                     'type': 'object'},
                 'param_loguniform': {'additionalProperties': False,
                                      'properties': {'distribution': {'enum': ['log_uniform']},
                                                     'max': {'type': 'number'},
                                                     'min': {'type': 'number'}},
                                      'required': ['distribution', 'max', 'min'],
                                      'type': 'object'},
                 'param_loguniform_v2': {'additionalProperties': False,
                                         'properties': {'distribution': {'enum': ['log_uniform_values']},
                                                        'max': {'type': 'number'},
                                                        'min': {'exclusiveMinimum': 0.0, 'type': 'number'}},
                                         'required': ['distribution', 'max', 'min'],
                                         'type': 'object'},
                 'param_normal': {'additionalProperties': False,
                                  'properties': {'distribution': {'enum': ['normal']},
                                                 'mu': {'type': 'number'},
                                                 'sigma': {'minimum': 0.0, 'type': 'number'}},
                                  'required': ['distribution'],
                                  'type': 'object'},
                 'param_qbeta': {'additionalProperties': False,
                                 'properties': {'a': {'minimum': 0, 'type': 'number'},
                                                'b': {'minimum': 0, 'type': 'number'},
                                                'distribution': {'enum': ['q_beta']},
                                                'q': {'exclusiveMinimum': 0, 'type': 'number'}},
                                 'required': ['distribution'],
                                 'type': 'object'},
                 'param_qlognormal': {'additionalProperties': False,
                                      'properties': {'distribution': {'enum': ['q_log_normal']},
                                                     'mu': {'type': 'number'},
                                                     'q': {'exclusiveMinimum': 0, 'type': 'number'},
                                                     'sigma': {'minimum': 0, 'type': 'number'}},
                                      'required': ['distribution'],
                                      'type': 'object'},
                 'param_qloguniform': {'additionalProperties': False,
                                       'properties': {'distribution': {'enum': ['q_log_uniform']},
                                                      'max': {'type': 'number'},
                                                      'min': {'type': 'number'},
                                                      'q': {'exclusiveMinimum': 0, 'type': 'number'}},
                                       'required': ['distribution', 'max', 'min'],
                                       'type': 'object'},
                 'param_qloguniform_v2': {'additionalProperties': False,
                                          'properties': {'distribution': {'enum': ['q_log_uniform_values']},
                                                         'max': {'type': 'number'},
                                                         'min': {'exclusiveMinimum': 0.0, 'type': 'number'},
                                                         'q': {'exclusiveMinimum': 0, 'type': 'number'}},
                                          'required': ['distribution', 'max', 'min'],
                                          'type': 'object'},
                 'param_qnormal': {'additionalProperties': False,
                                   'properties': {'distribution': {'enum': ['q_normal']},
                                                  'mu': {'type': 'number'},
                                                  'q': {'exclusiveMinimum': 0, 'type': 'number'},
                                                  'sigma': {'minimum': 0, 'type': 'number'}},
                                   'required': ['distribution'],
                                   'type': 'object'},
                 'param_quniform': {'additionalProperties': False,
                                    'properties': {'distribution': {'enum': ['q_uniform']},
                                                   'max': {'type': 'number'},
                                                   'min': {'type': 'number'},
                                                   'q': {'exclusiveMinimum': 0, 'type': 'number'}},
                                    'required': ['distribution', 'max', 'min'],
                                    'type': 'object'},
                 'param_single_value': {'additionalProperties': False,
                                        'properties': {'distribution': {'enum': ['constant']}, 'value': {}},
                                        'required': ['value'],
                                        'type': 'object'},
                 'param_uniform': {'anyOf': [{'additionalProperties': False,
                                              'properties': {'distribution': {'enum': ['uniform']},
                                                             'max': {'type': 'number'},
                                                             'min': {'type': 'number'}},
                                              'required': ['min', 'max', 'distribution'],
                                              'type': 'object'},
                                             {'additionalProperties': False,
                                              'properties': {'distribution': {'enum': ['uniform']},
                                                             'max': {'format': 'float', 'type': 'number'},
                                                             'min': {'format': 'float', 'type': 'number'}},
                                              'required': ['min', 'max'],
                                              'type': 'object'},
                                             {'additionalProperties': False,
                                              'properties': {'distribution': {'enum': ['uniform']},
                                                             'max': {'format': 'float', 'type': 'number'},
                                                             'min': {'type': 'number'}},
                                              'required': ['min', 'max'],
                                              'type': 'object'},
                                             {'additionalProperties': False,
                                              'properties': {'distribution': {'enum': ['uniform']},
                                                             'max': {'type': 'number'},
                                                             'min': {'format': 'float', 'type': 'number'}},
                                              'required': ['min', 'max'],
                                              'type': 'object'}]},
                 'parameter': {'anyOf': [{'$ref': '#/definitions/param_qbeta'},
                                         {'$ref': '#/definitions/param_beta'},
                                         {'$ref': '#/definitions/param_categorical'},
                                         {'$ref': '#/definitions/param_categorical_w_probabilities'},
                                         {'$ref': '#/definitions/param_int_uniform'},
                                         {'$ref': '#/definitions/param_uniform'},
                                         {'$ref': '#/definitions/param_lognormal'},
                                         {'$ref': '#/definitions/param_loguniform'},
                                         {'$ref': '#/definitions/param_inv_loguniform'},
                                         {'$ref': '#/definitions/param_normal'},
                                         {'$ref': '#/definitions/param_qlognormal'},
                                         {'$ref': '#/definitions/param_qloguniform'},
                                         {'$ref': '#/definitions/param_qnormal'},
                                         {'$ref': '#/definitions/param_quniform'},
                                         {'$ref': '#/definitions/param_single_value'},
                                         {'$ref': '#/definitions/param_inv_loguniform_v2'},
                                         {'$ref': '#/definitions/param_loguniform_v2'},
                                         {'$ref': '#/definitions/param_qloguniform_v2'},
                                         {'$ref': '#/definitions/param_dict'}]},
                 'parameters': {'additionalProperties': {'$ref': '#/definitions/parameter'},
                                'minProperties': 1,
                                'propertyNames': {'pattern': '^^[A-Za-z_][A-Za-z0-9_.-]*$'},
                                'type': 'object'}},
 'properties': {'apiVersion': {'type': 'string'},
                'command': {'type': 'array'},
                'controller': {'properties': {'type': {'enum': ['local', 'cloud'], 'type': 'string'}},
                               'required': ['type'],
                               'type': 'object'},
                'early_terminate': {'oneOf': [{'$ref': '#/definitions/hyperband_stopping'}]},
                'entity': {'type': 'string'},
                'kind': {'enum': ['sweep'], 'type': 'string'},
                'method': {'enum': ['bayes', 'random', 'grid', 'custom']},
                'metric': {'additionalProperties': False,
                           'properties': {'goal': {'enum': ['minimize', 'maximize'], 'type': 'string'},
                                          'impute': {'enum': ['latest', 'best', 'worst'], 'type': 'string'},
                                          'name': {'type': 'string'},
                                          'target': {'type': 'number'}},
                           'required': ['name'],
                           'type': 'object'},
                'name': {'type': 'string'},
                'parameters': {'$ref': '#/definitions/parameters'},
                'program': {'type': 'string'},
                'project': {'type': 'string'}},
 'required': ['method', 'parameters'],
 'type': 'object'}


def _violations(value, schema, path="$", root=SCHEMA) -> list[str]:
    """Draft-7 validation for the keywords the schema above uses; returns the violations (empty = valid)."""
    if "$ref" in schema:
        node = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return _violations(value, node, path, root)
    out: list[str] = []
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    t = schema.get("type")
    if t in types and not isinstance(value, types[t]):
        return [f"{path}: expected {t}"]
    if t == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return [f"{path}: expected integer"]
    if t == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return [f"{path}: expected number"]
    if schema.get("format") == "float" and not isinstance(value, float):
        out.append(f"{path}: format float")
    if schema.get("format") == "integer" and not isinstance(value, int):
        out.append(f"{path}: format integer")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        out.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        out.append(f"{path}: below minimum")
    if "exclusiveMinimum" in schema and isinstance(value, (int, float)) and value <= schema["exclusiveMinimum"]:
        out.append(f"{path}: not above exclusiveMinimum")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(f"{path}: too few items")
        if isinstance(schema.get("items"), dict):
            for i, v in enumerate(value):
                out += _violations(v, schema["items"], f"{path}[{i}]", root)
    if isinstance(value, dict):
        out += [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        if len(value) < schema.get("minProperties", 0):
            out.append(f"{path}: too few properties")
        props = schema.get("properties", {})
        for k, v in value.items():
            if "propertyNames" in schema:
                out += _violations(k, schema["propertyNames"], f"{path}.{k}(name)", root)
            if k in props:
                out += _violations(v, props[k], f"{path}.{k}", root)
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}: unexpected key {k!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += _violations(v, schema["additionalProperties"], f"{path}.{k}", root)
    if "anyOf" in schema and all(_violations(value, s, path, root) for s in schema["anyOf"]):
        out.append(f"{path}: matches none of anyOf")
    if "oneOf" in schema and sum(not _violations(value, s, path, root) for s in schema["oneOf"]) != 1:
        out.append(f"{path}: does not match exactly one of oneOf")
    return out


def test_there_are_a_grid_and_a_bayes_sweep():
    methods = {yaml.safe_load(p.read_text())["method"] for p in SWEEPS}
    assert {"grid", "bayes"} <= methods
    assert not (REPO / "sweeps" / "__init__.py").exists()  # never a Python package


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_sweep_yaml_validates_against_wandbs_schema(path):
    config = yaml.safe_load(path.read_text())
    assert _violations(config, SCHEMA) == []
    assert config["metric"] == {"name": "tradeoff", "goal": "maximize"}
    assert "${args_no_boolean_flags}" in config["command"] and "specsweep" in config["command"]


@pytest.mark.parametrize("bad", [
    {"method": "nope"},
    {"parameters": {"gamma": {"values": []}}},
    {"parameters": {"gamma": {"min": 1, "max": 8, "step": 2}}},
    {"metric": {"goal": "maximize"}},
    {"unknown_key": 1},
])
def test_the_validator_rejects_broken_sweeps(bad):
    config = {**yaml.safe_load(SWEEPS[0].read_text()), **bad}
    assert _violations(config, SCHEMA)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    tp, dp = save_pair(root / "models")
    data = root / "articles.jsonl"
    write_articles(data, 3, 6)
    args = ["run", "--target", str(tp), "--data", str(data), "--task", "cnn_dailymail", "--device", "cpu",
            "--max-new-tokens", "8", "--limit", "3", "--max-prompt-tokens", "256", "--gamma", "0", "--no-progress",
            "--wandb-mode", "disabled"]
    assert main([*args, "--out", str(root / "runs" / "text-ar-float32.json")]) == 0
    return root, tp, dp, data


def _point(config: dict, rng: random.Random) -> dict:
    """One parameter set as W&B's controller would propose it (a grid point or a draw from each range)."""
    point = {}
    for name, spec in config["parameters"].items():
        if "value" in spec:
            point[name] = spec["value"]
        elif "values" in spec:
            point[name] = rng.choice(spec["values"])
        elif spec.get("distribution") == "int_uniform":
            point[name] = rng.randint(spec["min"], spec["max"])
        else:
            point[name] = rng.uniform(spec["min"], spec["max"])
    return point


def _agent_command(config: dict, point: dict, tiny, out_dir: Path) -> tuple[list[str], dict]:
    """The command `wandb agent` would run for ``point`` of sweep ``config`` (wandb's own create_sweep_command_args
    and macro expansion), pointed at the tiny pair, offline W&B and ``out_dir``; and the completed point."""
    from wandb.sdk.launch.sweeps import utils as sweep_utils

    root, tp, dp, data = tiny
    point = dict(point)
    if point.get("sampler") == "greedy":
        point["sampler"] = "sigmoid"
    point.update(target=str(tp), draft=str(dp), data=str(data), wandb_mode="offline", limit=3, max_new_tokens=8,
                 max_prompt_tokens=256, seed=0, device="cpu",
                 baseline=str(root / "runs" / "text-ar-{dtype}.json"), dtype="float32",
                 out=str(out_dir / Path(point["out"]).name))
    args = sweep_utils.create_sweep_command_args({"args": {k: {"value": v} for k, v in point.items()}})
    macros = {**args, "env": ["/usr/bin/env"], "interpreter": ["python"], "program": [config["program"]]}
    command = []
    for chunk in sweep_utils.create_sweep_command(config["command"]):
        command += macros.get(chunk[2:-1], []) if chunk.startswith("${") else [chunk]
    return command, point


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
@pytest.mark.slow
def test_an_agent_style_invocation_runs_to_a_result_offline(path, tiny, tmp_path, monkeypatch):
    """Build the command as `wandb agent` does from a proposed point, with the tiny pair and offline W&B, and run
    it in a fresh process."""
    root = tiny[0]
    config = yaml.safe_load(path.read_text())
    command, point = _agent_command(config, _point(config, random.Random(path.name)), tiny, tmp_path)
    assert command[:3] == ["/usr/bin/env", "specsweep", "run"] and "--no_progress" in command
    assert any(c.startswith("--gamma=") for c in command) and any(c.startswith("--max_new_tokens=") for c in command)
    env = {**os.environ, "WANDB_DIR": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / Path(point["out"]).name.format(**point)
    result = json.loads(out.read_text())
    assert result["config"]["gamma"] == point["gamma"] and result["config"]["sampler"] == point["sampler"]
    assert result["config"]["baseline"] == str(root / "runs" / "text-ar-float32.json")
    assert result["metrics"]["speedup"] > 0
    # W&B started and logged, and the flags agreed with wandb.config: no warning but a busy machine's speed flag
    warnings = [line for line in proc.stderr.splitlines()
                if "warning" in line and "speed measurement flagged" not in line]
    assert not warnings, warnings
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


@pytest.mark.slow
def test_two_agents_side_by_side_each_on_its_own_devices(tiny, tmp_path):
    """Two agent-style invocations at once, as two `wandb agent` processes would run them on one machine, each
    given its own devices through CUDA_VISIBLE_DEVICES (docs/pipeline.md; here both are CPU runs, so each sees no
    GPU): both finish, each with its own results file and its own offline W&B run. Their speed measurements may be
    flagged as contended (two runs share two cores): that is the point of the flags, not a failure."""
    config = yaml.safe_load((REPO / "sweeps" / "grid.yaml").read_text())
    procs = []
    for k, gamma in enumerate((2, 3)):
        out = tmp_path / f"agent{k}"
        out.mkdir()
        point = {**_point(config, random.Random(k)), "gamma": gamma, "sampler": "exact", "backend": "torch"}
        command, point = _agent_command(config, point, tiny, out)
        env = {**os.environ, "WANDB_DIR": str(out), "CUDA_VISIBLE_DEVICES": "",
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        procs.append((subprocess.Popen(command, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True), out, point))
    for proc, out, point in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        result = json.loads((out / Path(point["out"]).name.format(**point)).read_text())
        assert result["config"]["gamma"] == point["gamma"] and result["resolved"]["device"] == "cpu"
        assert len(list((out / "wandb").glob("offline-run-*"))) == 1


def test_config_names_work_with_underscores_and_from_wandb_config(tiny, tmp_path):
    from pipeline.config import RunConfig
    from pipeline.tracking import config_from_wandb

    _, tp, dp, data = tiny
    out = tmp_path / "u.json"
    assert main(["run", f"--target={tp}", f"--draft={dp}", f"--data={data}", "--task=cnn_dailymail",
                 "--max_new_tokens=6", "--gamma=2", "--sampler=sigmoid", "--alpha=2.0", "--device=cpu",
                 "--no_progress", "--wandb_mode=disabled", f"--out={out}"]) == 0
    saved = json.loads(out.read_text())["config"]
    assert saved["max_new_tokens"] == 6 and saved["alpha"] == 2.0
    assert RunConfig.from_dict(saved).to_dict() == saved
    wandb_config = {**saved, "_wandb": {"cli_version": "x"}, "gamma": 5}
    assert config_from_wandb(wandb_config).gamma == 5
    with pytest.raises(Exception, match="unknown run settings"):
        config_from_wandb({**saved, "nope": 1})
