"""Schema-driven fuzzing of `specsweep serve`: schemathesis reads the served /openapi.json and sends every endpoint
requests generated from it, valid ones and ones that break it, to a real server on 127.0.0.1 (the tiny pair, a chat
template on its tokenizer). Every answer must come in time (no hung request) and none may be a 5xx; an answer must
match the schema's response model; a request that breaks the schema must be refused with a 4xx (the schema says
no more than the server accepts). Afterwards the server is still healthy and still decodes. And schemathesis' own
run (`schemathesis run URL/openapi.json --checks not_a_server_error`), in process against the ASGI app: no failure,
no error, and the valid requests it generates are accepted (the schema says no less than the server accepts).

Skips without schemathesis (the dev extra installs it)."""

from __future__ import annotations

import httpx
import pytest
import torch
from tiny_models import save_pair

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402  (after the skip: hypothesis comes with schemathesis)

from pipeline.config import RunConfig  # noqa: E402
from pipeline.models import load_causal_lm, load_tokenizer  # noqa: E402
from pipeline.serving.app import create_app  # noqa: E402
from pipeline.serving.decoder import Decoder  # noqa: E402
from pipeline.serving.server import BackgroundServer  # noqa: E402

EXAMPLES = 25           # per endpoint and generation mode (valid, invalid)
TIMEOUT_S = 15          # an answer later than this is a hung request


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("fuzz"))


def small_app(pair, chat_template: str | None = None):
    """The app with small limits (a few tokens per request, a short queue) so that valid requests stay cheap; its
    model id is the target's path, as `specsweep serve --target DIR` names it (slashes and all)."""
    tp, dp = pair
    tokenizer = load_tokenizer(str(tp))
    tokenizer.chat_template = chat_template
    models = (load_causal_lm(str(tp), torch.float32, "cpu"), load_causal_lm(str(dp), torch.float32, "cpu"), tokenizer)
    config = RunConfig(target=str(tp), draft=str(dp), data="", task="prompts", gamma=3, device="cpu",
                       max_new_tokens=4)
    return create_app(Decoder(config, models), max_batch=4, max_wait_ms=0, max_queue=16, request_timeout=10,
                      max_tokens_limit=6)


@pytest.fixture(scope="module")
def fuzzed(pair):
    """A server on a chat template that adds a word of its own, so that every conversation has tokens (an empty one
    is a 400 of its own)."""
    server = BackgroundServer(small_app(pair, "{% for m in messages %}{{ m['content'] }} {% endfor %}the")).start()
    yield server
    server.stop()


CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.response_schema_conformance,
          schemathesis.checks.negative_data_rejection]
OPERATIONS = {"POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models", "GET /v1/models/{model}",
              "POST /predict", "GET /health", "GET /metrics"}


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_every_endpoint_survives_generated_requests(fuzzed, mode):
    """Hypothesis drives each operation of the served schema (schemathesis' strategies; its pytest plugin is not
    used: it does not run under pytest 9)."""
    from hypothesis import given

    schema = schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} == OPERATIONS   # a new endpoint is fuzzed too: add it here
    for op in operations:
        if mode == "negative" and not len(op.body):
            continue   # nothing to break: the GETs take no body (GET /v1/models/{model} takes any string)

        @given(case=op.as_strategy(generation_mode=schemathesis.GenerationMode(mode)))
        @settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None)
        def call(case):
            case.call_and_validate(base_url=fuzzed.url, timeout=TIMEOUT_S, checks=CHECKS)

        call()


def test_the_server_is_healthy_after_the_fuzzing(fuzzed):
    """Runs after the fuzzing (pytest keeps the file's order): the server still answers and decodes, it answered no
    request with a 5xx, and the fuzzing reached the decoder (valid requests were answered with 200)."""
    from prometheus_client.parser import text_string_to_metric_families

    health = httpx.get(fuzzed.url + "/health", timeout=TIMEOUT_S).json()
    assert health["status"] == "ok" and health["queue_depth"] == 0 and health["in_flight"] == 0
    r = httpx.post(fuzzed.url + "/v1/completions", json={"prompt": "the storm", "max_tokens": 3, "seed": 0},
                   timeout=TIMEOUT_S)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    answered: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(fuzzed.url + "/metrics", timeout=TIMEOUT_S).text):
        for sample in family.samples:
            if sample.name == "specsweep_requests_total":
                answered[sample.labels["endpoint"], sample.labels["status"]] = sample.value
    assert not [k for k in answered if k[1].startswith("5")], answered
    for endpoint in ("/v1/completions", "/v1/chat/completions", "/predict"):
        assert answered.get((endpoint, "200"), 0) >= 2 and answered.get((endpoint, "400"), 0) >= 2, answered


RUN_EXAMPLES = 20       # per operation in the fuzzing phase of the run below (the CLI's default is 100)
MUST_ACCEPT = {"GET /v1/models/{model}", "POST /predict"}


def test_schemathesis_run_finds_no_issues_and_valid_requests_are_accepted(pair):
    """What `schemathesis run URL/openapi.json --checks not_a_server_error` does (its engine: examples, coverage,
    fuzzing and stateful phases, one worker), in process against the ASGI app with fewer examples and a fixed seed,
    on the tiny pair as `specsweep serve` serves it: the target's path as the model id, no chat template.

    No failure and no error: a failed health check is one. GET /v1/models/{model} took any string, and schemathesis
    drew the id GET /v1/models answers (a path, with slashes, which a path parameter can carry only where the schema
    lists it) and filtered nearly every example out; the schema now names the served id (any other is a 404).
    Every valid request generated for GET /v1/models/{model} and POST /predict answered 200: POST /predict took any
    string as its prompt, and an empty one or one of white space (the word-level tokenizer gives it no token) is a
    400. No operation had every valid request of a scenario refused (the CLI warns then, as it did for POST
    /v1/chat/completions, which is out of the schema without a chat template)."""
    from schemathesis.engine import events, from_schema
    from schemathesis.python.asgi import shutdown_lifespans

    app = small_app(pair)
    config = schemathesis.Config.from_dict({
        "seed": 1, "workers": 1, "generation": {"max-examples": RUN_EXAMPLES, "database": "none"},
        "checks": {"enabled": False, "not_a_server_error": {"enabled": True}}})
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    assert {op.ok().label for op in schema.get_all_operations()} == OPERATIONS - {"POST /v1/chat/completions"}
    errors, failures, answered = [], None, {}
    try:
        for event in from_schema(schema).execute():
            if isinstance(event, (events.NonFatalError, events.FatalError)):
                errors.append(event)
            elif isinstance(event, events.EngineFinished):
                failures = event.failures
            elif isinstance(event, events.ScenarioFinished):
                recorder = event.recorder
                statuses = [recorder.interactions[key].response.status_code for key, node in recorder.cases.items()
                            if node.value.meta is not None and node.value.meta.generation.mode.is_positive
                            and key in recorder.interactions and recorder.interactions[key].response is not None]
                if statuses:
                    answered.setdefault(recorder.label, []).append(statuses)
    finally:
        shutdown_lifespans()   # the ASGI client started the app's lifespan (its batcher) and keeps it until then
    assert not errors, [getattr(e, "value", getattr(e, "exception", e)) for e in errors]
    assert failures == []
    for label in MUST_ACCEPT:
        statuses = [s for scenario in answered[label] for s in scenario]
        assert len(statuses) >= 10 and set(statuses) == {200}, (label, statuses)
    refused = {label: scenario for label, scenarios in answered.items() for scenario in scenarios
               if all(400 <= s < 500 for s in scenario)}
    assert not refused, refused
