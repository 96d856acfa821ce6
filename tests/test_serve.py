"""`specsweep serve` on the tiny pairs: a server on 127.0.0.1 (a free port, a background thread) and real HTTP
clients (httpx, raw sockets). Every endpoint, SSE streaming, bad input, overload, timeout, disconnect and graceful
shutdown; dynamic batching; the same seed gives the same tokens through the server as through `specsweep run`; the
engine's per-step callback; where the served settings come from (a study, a report); the report's serving section."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from test_report import result as results_dict
from test_report import write
from tiny_models import PROMPTS, save_pair

from pipeline.cli import main
from pipeline.config import RunConfig
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.models import load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler
from pipeline.serving.app import create_app
from pipeline.serving.decoder import Decoder
from pipeline.serving.server import BackgroundServer
from pipeline.serving.settings import from_recommendation, study_table

GAMMA = 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target path, draft path, (target, draft, tokenizer) loaded once)."""
    root = tmp_path_factory.mktemp("serve")
    tp, dp = save_pair(root)
    models = (load_causal_lm(str(tp), torch.float32, "cpu"), load_causal_lm(str(dp), torch.float32, "cpu"),
              load_tokenizer(str(tp)))
    return tp, dp, models


def decoder(pair, **settings) -> Decoder:
    tp, dp, models = pair
    config = RunConfig(target=str(tp), draft=str(dp), data="", task="prompts", gamma=GAMMA, device="cpu",
                       max_new_tokens=8, **settings)
    return Decoder(config, models)


@contextmanager
def serving(dec: Decoder, slow_s: float = 0.0, **limits):
    """The app on a free loopback port; ``slow_s``: seconds added to every verify step (to hold requests in flight
    long enough to act on them)."""
    if slow_s:
        engine = dec.engine()
        engine.sampler = _Slow(engine.sampler, slow_s)
    server = BackgroundServer(create_app(dec, **limits)).start()
    try:
        yield server
    finally:
        server.stop()


class _Slow:
    """A sampler that sleeps before each verify step."""

    def __init__(self, inner, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        time.sleep(self.seconds)
        return self.inner(*args, **kwargs)


def metrics(url: str) -> dict[str, float]:
    """Every sample of GET /metrics: name{label="value",...} -> value."""
    text = httpx.get(url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def in_background(fn, *args, **kwargs) -> dict:
    """Run fn in a thread; the returned dict gets "value" (or "error") and "done_at" (perf_counter) when it ends,
    and "thread"."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except Exception as e:  # handed to the test, which asserts on it
            box["error"] = e
        box["done_at"] = time.perf_counter()

    box["thread"] = threading.Thread(target=target, daemon=True)
    box["thread"].start()
    return box


def complete(url: str, timeout: float = 30.0, **body) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=body, timeout=timeout)


def stats(answer: dict, choice: int = 0) -> dict:
    """The "specsweep" record of a choice of an answer (or of a stream's chunk)."""
    return answer["choices"][choice]["specsweep"]


def sse_events(response: httpx.Response) -> list:
    """The data payloads of an SSE answer, parsed ("[DONE]" kept as is)."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# ---------------------------------------------------------------------------------------------- the engine's hook

def test_on_step_gets_each_rows_tokens_in_the_steps_one_transfer_and_cancels_rows(pair):
    """The callback sees exactly the tokens generate returns (its origins too, where the engine records them),
    changes no token, and adds no host transfer and no op-level sync; a row it cancels ends with what it had."""
    from sync_detector import NoHostSync

    _, _, (target, draft, tok) = pair
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=GAMMA, device="cpu", eos_token_ids=[1],
                               pad_token_id=0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)

    def generate(on_step=None, new_tokens=16):
        return engine.generate(enc.input_ids, enc.attention_mask, new_tokens, torch.Generator().manual_seed(3),
                               on_step=on_step)

    seen: dict[int, list[int]] = {}

    def collect(rows, tokens, accepted, finished, lengths):
        assert len(rows) == len(tokens) == len(accepted) == len(finished) == len(lengths)
        for r, new in zip(rows, tokens):
            seen.setdefault(r, []).extend(new)

    plain = generate()
    transfers = _count_tolist(lambda: generate(collect))
    assert seen == dict(enumerate(plain.tokens))
    assert transfers == _count_tolist(generate)           # the tokens ride in the step's existing transfer
    seen.clear()
    with NoHostSync() as mode:                            # slow: a short decode
        streamed = generate(collect, new_tokens=6)
    assert len(mode.syncs) <= 2, sorted(set(mode.syncs))  # the final finite check, as without a callback
    assert streamed.tokens == generate(new_tokens=6).tokens and seen == dict(enumerate(streamed.tokens))

    cut: dict[int, list[int]] = {}

    def cancel_row_2(rows, tokens, accepted, finished, lengths):
        for r, new in zip(rows, tokens):
            cut.setdefault(r, []).extend(new)
        return [2]

    res = generate(cancel_row_2)
    assert res.tokens[2] == cut[2] and res.row_stats[2]["verify_steps"] == 1
    assert all(len(t) >= 1 for t in res.tokens)


def _count_tolist(fn) -> int:
    """Calls of Tensor.tolist (the engine's host transfers) while fn runs."""
    original, calls = torch.Tensor.tolist, [0]

    def counting(self):
        calls[0] += 1
        return original(self)

    torch.Tensor.tolist = counting
    try:
        fn()
    finally:
        torch.Tensor.tolist = original
    return calls[0]


@pytest.mark.parametrize("adaptive", [False, True])
def test_streamed_origins_follow_the_engines_provenance(pair, adaptive):
    """The origins the server derives per step (accepted draft, corrected, bonus) are the engine's own, also where
    the rows of a batch draft their own lengths (an adaptive draft length: a row that accepts its whole, shorter
    draft ends its step with a bonus token)."""
    from pipeline.decoding.draft_policy import DraftPolicy
    from pipeline.serving.decoder import step_origins

    _, _, (target, draft, tok) = pair
    policy = DraftPolicy("heuristic", 0.5, 6) if adaptive else None
    engine = SpeculativeEngine(target, draft, get_sampler("exact"), gamma=GAMMA, device="cpu", eos_token_ids=[1],
                               pad_token_id=0, draft_policy=policy)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    derived: dict[int, list[int]] = {}
    short_bonus = []

    def collect(rows, tokens, accepted, finished, lengths):
        for r, new, acc, own in zip(rows, tokens, accepted, lengths):
            derived.setdefault(r, []).extend(step_origins(len(new), acc, own))
            short_bonus.append(0 < acc == own < max(lengths))

    res = engine.generate(enc.input_ids, enc.attention_mask, 16, torch.Generator().manual_seed(5), on_step=collect)
    if getattr(res, "origins", None) is None:
        pytest.skip("this engine records no token origins")
    assert [derived[r] for r in range(len(PROMPTS))] == res.origins
    assert {o for row in res.origins for o in row} >= {0, 1}  # accepted drafts and corrections both occurred
    assert any(short_bonus) == adaptive     # a whole, shorter draft accepted: only where rows draft their own


def test_stop_strings_cut_and_hold_back_what_may_become_one():
    from pipeline.serving.stops import cut, held_back, shown, tokens_to_stop

    stops = ["the end", "fox."]
    assert cut("a fox. the end", stops) == "a " and cut("nothing here", stops) == "nothing here"
    assert held_back("it was the e", stops) == len("the e") and held_back("it was fo", stops) == 2
    assert held_back("it was", stops) == 0 and held_back("", stops) == 0
    assert shown("it was the e", stops, final=False) == "it was " and shown("it was the e", stops, final=True) == \
        "it was the e"
    assert shown("so the end came", stops, final=False) == "so "
    words = ["so", " the", " end", " came"]
    decode = lambda ids: "".join(words[i] for i in ids)  # noqa: E731
    assert tokens_to_stop([0, 1, 2, 3], 1, stops, decode) == 3     # the fewest tokens whose text holds "the end"
    assert tokens_to_stop([0, 1], 0, stops, decode) is None


# ---------------------------------------------------------------------------------------------- endpoints

def test_every_endpoint_answers(pair):
    dec = decoder(pair)
    with serving(dec, max_batch=4) as server:
        health = httpx.get(server.url + "/health").json()
        assert health["status"] == "ok" and health["max_batch"] == 4 and health["positions"] == 256

        r = complete(server.url, prompt=PROMPTS[0], max_tokens=6, seed=1)
        assert r.status_code == 200
        body = r.json()
        s = stats(body)
        assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] in ("stop", "length")
        assert 1 <= len(s["token_ids"]) <= 6 and body["usage"]["completion_tokens"] == len(s["token_ids"])
        assert (body["choices"][0]["finish_reason"] == "stop") == (s["token_ids"][-1] == 1)  # EOS, else length
        assert body["choices"][0]["text"] == dec.text(s["token_ids"])
        assert len(s["origins"]) == len(s["token_ids"]) and set(s["origins"]) <= set("ACBT")
        acc = s["acceptance"]
        assert s["origins"].count("A") <= acc["accepted"] <= acc["drafted"]
        assert acc["rate"] == pytest.approx(acc["accepted"] / acc["drafted"])
        assert s["batch"] == {"size": 1} and s["seed"] == 1

        predict = httpx.post(server.url + "/predict", json={"prompt": PROMPTS[1], "seed": 1})
        assert predict.status_code == 200 and isinstance(predict.json(), str)
        assert predict.json().startswith("police said the plane was")  # the seed's answer: prompt + continuation

        m = metrics(server.url)
        assert m['specsweep_requests_total{endpoint="/v1/completions",status="200"}'] == 1
        assert m['specsweep_requests_total{endpoint="/predict",status="200"}'] == 1
        assert m["specsweep_batch_size_count"] == 2 and m["specsweep_batch_size_sum"] == 2
        assert m["specsweep_generated_tokens_total"] >= 2 and m["specsweep_queue_depth"] == 0
        assert m['specsweep_accepted_per_step_bucket{le="+Inf"}'] >= 1
        assert 0 <= m["specsweep_acceptance_rate"] <= 1
        assert m["specsweep_draft_tokens_total"] >= m["specsweep_accepted_draft_tokens_total"]
        for name in ("specsweep_request_latency_seconds_count{endpoint=\"/v1/completions\"}",
                     "specsweep_queue_wait_seconds_count", "specsweep_time_to_first_token_seconds_count",
                     "specsweep_tokens_per_second", "specsweep_requests_in_flight",
                     'specsweep_position_acceptance_rate{position="0"}'):
            assert name in m, name


def test_sse_stream_gives_the_same_completion_as_the_plain_answer(pair):
    dec = decoder(pair)
    with serving(dec) as server:
        plain = complete(server.url, prompt=PROMPTS[3], max_tokens=12, seed=4).json()
        with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                          json={"prompt": PROMPTS[3], "max_tokens": 12, "seed": 4, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r)
    assert events[-1] == "[DONE]" and len(events) >= 3
    chunks, last = events[:-1], events[-2]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert last["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    assert stats(last)["token_ids"] == stats(plain)["token_ids"]
    assert last["usage"] == plain["usage"]
    streamed_ids = [t for c in chunks[:-1] for t in stats(c)["token_ids"]]
    assert streamed_ids == stats(plain)["token_ids"][: len(streamed_ids)] and len(streamed_ids) >= 1


BAD = [
    ({}, 400, "'prompt' is required"),
    ({"prompt": 5}, 400, "'prompt' must be a string"),
    ({"prompt": "water", "max_tokens": "5"}, 400, "'max_tokens' must be an integer"),
    ({"prompt": "water", "max_tokens": 0}, 400, "'max_tokens' must be at least 1; got 0"),
    ({"prompt": "water", "max_tokens": 65}, 400, "'max_tokens' must be between 1 and 64"),
    ({"prompt": "water", "temperature": -1}, 400, "'temperature' must be at least 0; got -1"),
    ({"prompt": "water", "stream": "yes"}, 400, "'stream' must be true or false"),
    ({"prompt": "water", "logprobs": 2}, 400, "'logprobs' must be null (false) or left out"),
    ({"prompt": ""}, 400, "'prompt' is empty"),
    ({"prompt": "water " * 250, "max_tokens": 8}, 400, "shorten the prompt"),
    ({"prompt": "water " * 200, "max_tokens": 60}, 400, "ask for at most"),
    ([1, 2], 400, "must be a JSON object"),
]


def test_bad_input_gets_a_4xx_json_error_with_a_one_line_message(pair):
    with serving(decoder(pair), max_tokens_limit=64) as server:
        for body, status, message in BAD:
            r = httpx.post(server.url + "/v1/completions", json=body)
            error = r.json()["error"]
            assert r.status_code == status and message in error["message"], (body, r.text)
            assert "\n" not in error["message"] and error["code"] == status
        r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type":
                                                                                      "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = httpx.post(server.url + "/predict", json={"text": "water"})
        assert r.status_code == 400 and r.json()["error"]["message"] == "'prompt' is required"
        r = httpx.get(server.url + "/v2/nothing")
        assert r.status_code == 404 and "/v1/completions" in r.json()["error"]["message"]
        assert metrics(server.url)['specsweep_requests_total{endpoint="/v1/completions",status="400"}'] == len(BAD) + 1


# ---------------------------------------------------------------------------------------------- batching

def test_concurrent_requests_share_a_batch_and_keep_their_own_max_tokens(pair):
    """Four requests at one temperature that arrive within the wait are one batch of four, each cut to its own
    max_tokens; requests at another temperature get a batch of their own."""
    dec = decoder(pair, ignore_eos=True)
    with serving(dec, max_batch=8, max_wait_ms=800) as server:
        bodies = [{"prompt": PROMPTS[i], "max_tokens": 3 + 2 * i, "seed": i} for i in range(4)]
        bodies += [{"prompt": PROMPTS[i], "max_tokens": 5, "temperature": 0.5} for i in range(2)]
        boxes = [in_background(complete, server.url, **b) for b in bodies]
        for box in boxes:
            box["thread"].join(30)
        answers = [box["value"].json() for box in boxes]
        m = metrics(server.url)
    for body, answer in zip(bodies, answers):
        assert len(stats(answer)["token_ids"]) == body["max_tokens"]
        assert answer["choices"][0]["finish_reason"] == "length"
    assert [stats(a)["batch"]["size"] for a in answers] == [4, 4, 4, 4, 2, 2]
    assert [stats(a)["seed"] for a in answers[:4]] == [0, 1, 2, 3]
    assert m["specsweep_batch_size_count"] == 2 and m["specsweep_batch_size_sum"] == 6
    # each request drew from its own seed's stream: alone it gets the tokens it got in the batch of four
    with serving(dec) as server:
        alone = [complete(server.url, **bodies[i]).json() for i in (1, 3)]
    assert [stats(a)["batch"]["size"] for a in alone] == [1, 1]
    assert [stats(a)["token_ids"] for a in alone] == [stats(answers[i])["token_ids"] for i in (1, 3)]


@pytest.mark.slow
def test_same_seed_gives_the_tokens_of_specsweep_run(pair, tmp_path):
    """A request decoded alone with seed S gets the tokens `specsweep run --batch-size 1 --seed S` gives for its
    prompt."""
    tp, dp, _ = pair
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"id": "p0", "prompt": PROMPTS[3]}) + "\n")
    out = tmp_path / "run.json"
    assert main(["run", "--target", str(tp), "--draft", str(dp), "--data", str(data), "--device", "cpu",
                 "--gamma", str(GAMMA), "--batch-size", "1", "--seed", "7", "--max-new-tokens", "12",
                 "--repeats", "3", "--samples-per-repeat", "1", "--no-progress", "--out", str(out)]) == 0
    expected = json.loads(out.read_text())["samples"][0]["token_ids"]
    with serving(decoder(pair)) as server:
        answer = complete(server.url, prompt=PROMPTS[3], max_tokens=12, seed=7).json()
        other = complete(server.url, prompt=PROMPTS[3], max_tokens=12, seed=8).json()
    assert stats(answer)["batch"]["size"] == 1
    assert stats(answer)["token_ids"] == expected
    assert stats(other)["token_ids"] != expected   # the seed matters (the pair samples at T = 1)


# ---------------------------------------------------------------------------------------------- load and failure

def test_full_queue_gets_503_with_retry_after(pair):
    with serving(decoder(pair, ignore_eos=True), slow_s=0.02, max_batch=1, max_queue=1) as server:
        first = in_background(complete, server.url, prompt=PROMPTS[0], max_tokens=200)
        wait_for(lambda: httpx.get(server.url + "/health").json()["in_flight"] == 1)
        second = in_background(complete, server.url, prompt=PROMPTS[1], max_tokens=5)
        wait_for(lambda: httpx.get(server.url + "/health").json()["queue_depth"] == 1)
        third = complete(server.url, prompt=PROMPTS[2], max_tokens=5)
        assert third.status_code == 503 and int(third.headers["Retry-After"]) >= 1
        assert "queue is full" in third.json()["error"]["message"]
        for box in (first, second):
            box["thread"].join(30)
            assert box["value"].status_code == 200
        assert metrics(server.url)['specsweep_requests_total{endpoint="/v1/completions",status="503"}'] == 1


def test_request_timeout_gets_504_and_frees_the_row(pair):
    with serving(decoder(pair, ignore_eos=True), slow_s=0.05, request_timeout=0.4) as server:
        r = complete(server.url, prompt=PROMPTS[0], max_tokens=120)
        assert r.status_code == 504 and "request timeout (0.4 s)" in r.json()["error"]["message"]
        wait_for(lambda: metrics(server.url).get('specsweep_cancelled_requests_total{reason="timeout"}') == 1)
        m = metrics(server.url)
        assert m["specsweep_generated_tokens_total"] < 120 and m["specsweep_requests_in_flight"] == 0
        assert complete(server.url, prompt=PROMPTS[1], max_tokens=2).status_code == 200


def _raw_request(port: int, body: dict) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_client_disconnect_cancels_its_row(pair, stream):
    with serving(decoder(pair, ignore_eos=True), slow_s=0.03) as server:
        sock = _raw_request(server.port, {"prompt": PROMPTS[0], "max_tokens": 200, "stream": stream})
        if stream:
            received = b""
            while b"data: " not in received:
                received += sock.recv(4096)
        else:
            wait_for(lambda: httpx.get(server.url + "/health").json()["in_flight"] == 1)
        sock.close()
        wait_for(lambda: metrics(server.url).get('specsweep_cancelled_requests_total{reason="disconnect"}') == 1)
        m = metrics(server.url)
        assert m["specsweep_generated_tokens_total"] < 200 and m["specsweep_requests_in_flight"] == 0
        assert complete(server.url, prompt=PROMPTS[1], max_tokens=2).status_code == 200


def test_graceful_shutdown_finishes_requests_in_flight(pair):
    dec = decoder(pair, ignore_eos=True)
    server = BackgroundServer(create_app(dec)).start()
    dec.engine().sampler = _Slow(dec.engine().sampler, 0.03)
    try:
        busy = in_background(complete, server.url, prompt=PROMPTS[0], max_tokens=60)
        wait_for(lambda: httpx.get(server.url + "/health").json()["in_flight"] == 1)
    finally:
        stopping = time.perf_counter()
        assert server.stop(30)
    busy["thread"].join(30)
    answer = busy["value"]
    assert busy["done_at"] > stopping   # it was still decoding when the shutdown began
    assert answer.status_code == 200 and len(stats(answer.json())["token_ids"]) == 60
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


# ---------------------------------------------------------------------------------------------- settings

def _study(folder, target="models/t", draft="models/d"):
    """A study folder: trials of exact, sigmoid and accept_all, and the AR baseline they name."""
    base = folder / "baseline-float32.json"
    write(base, results_dict(gamma=0, score=0.50, target=target, draft=draft))
    trials = [results_dict(sampler="exact", gamma=4, speedup=1.3, score=0.50, target=target, draft=draft),
              results_dict(sampler="sigmoid", gamma=6, speedup=1.8, score=0.497, alpha=2.0, beta=-10.0,
                           target=target, draft=draft),
              results_dict(sampler="accept_all", gamma=8, speedup=2.5, score=0.30, target=target, draft=draft)]
    for i, trial in enumerate(trials):
        trial["resolved"]["baseline"] = str(base)
        write(folder / "trials" / f"{i:05d}.json", trial)
    return folder


def test_a_study_or_a_report_gives_its_recommended_point(tmp_path):
    study = _study(tmp_path / "tune" / "text")
    base = {"target": None, "draft": None, "device": "cpu"}
    fastest = from_recommendation(str(study), "study", base, 0.01, False)
    c = fastest.config
    assert (c.sampler, c.gamma, c.rule_params, c.target, c.draft) == ("sigmoid", 6, {"alpha": 2.0, "beta": -10.0},
                                                                      "models/t", "models/d")
    assert "fastest within 1.0% quality loss" in fastest.source and "speedup 1.80x" in fastest.source
    lossless = from_recommendation(str(study), "study", base, 0.01, True)
    assert (lossless.config.sampler, lossless.config.gamma) == ("exact", 4) and "best lossless" in lossless.source
    reports = tmp_path / "reports"
    reports.mkdir()
    study_table(str(study)).to_csv(reports / "results.csv", index=False)
    from_report = from_recommendation(str(reports), "report", base, 0.01, False)
    assert (from_report.config.sampler, from_report.config.rule_params) == ("sigmoid", {"alpha": 2.0, "beta": -10.0})
    with pytest.raises(SpecsweepError, match="no recommendation for a text pair with target other"):
        from_recommendation(str(study), "study", {**base, "target": "other"}, 0.01, False)


@pytest.mark.parametrize("argv, message", [
    (["--from-study", "{study}", "--gamma", "4"], "--gamma conflicts with --from-study"),
    (["--from-study", "{tmp}/none"], "holds no trials"),
    (["--from-report", "{tmp}"], "has no results.csv"),
    (["--draft", "d"], "--model (or --target) is required"),
    (["--target", "t", "--lossless"], "add --from-study DIR or --from-report DIR"),
    (["--target", "t", "--draft", "d", "--sampler", "hf", "--max-batch", "4"], "use --max-batch 1"),
    (["--target", "t", "--draft", "d", "--draft-confidence", "1.5"], "--draft-confidence must be in [0, 1)"),
    (["--target", "t", "--gamma", "2"], "--gamma > 0 needs --draft MODEL"),
])
def test_serve_refuses_bad_settings_with_one_line(tmp_path, capsys, argv, message):
    study = _study(tmp_path / "study")
    argv = [a.format(study=study, tmp=tmp_path) for a in argv]
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------------- the report

def test_the_report_has_a_serving_section(tmp_path):
    import pandas as pd

    from pipeline.analysis.build import build_report
    from pipeline.analysis.tables import load_all

    rows = [{"server": s, "max_batch": b, "concurrency": c, "repeats": 3, "sent": 30, "answered": 30, "ok": 30,
             "failed": 0, "lost": 0, "latency_p50_s": 0.1, "latency_p99_s": 0.2, "requests_per_second": rps,
             "tokens_per_second": 30 * rps, "mean_batch_size": 1.0 if b == 1 else 3.5}
            for s, b, c, rps in (("dynamic", 16, 1, 9.0), ("dynamic", 16, 16, 40.0), ("one_at_a_time", 1, 1, 10.0),
                                 ("one_at_a_time", 1, 16, 16.0))]
    write(tmp_path / "bench" / "serve-cpu.json", {
        "benchmark": "serve", "provenance": {"date": "2026-11-25T10:00:00+00:00", "device": {"device": "cpu"}},
        "settings": {"target": "models/toy/text/target", "sampler": "exact", "gamma": 4, "temperature": 1.0},
        "results": rows, "dynamic_over_one_at_a_time": [{"concurrency": 1, "median": 0.9},
                                                        {"concurrency": 16, "median": 2.5}],
        "goals": {"concurrency": 16, "goal": 2.0, "met": True}})
    table = load_all(pd.DataFrame(columns=["run", "kind"]), bench=tmp_path / "bench")
    assert sorted(table[table["kind"] == "serving"]["concurrency"]) == [1, 1, 16, 16]
    build_report(table, tmp_path / "reports")
    report = (tmp_path / "reports" / "report.md").read_text()
    assert "Serving under load" in report and "2.50x the tokens/s of one request at a time at 16 clients" in report
    assert "met); 120 requests sent, 0 lost, 0 failed" in report


def test_a_stream_sends_one_chunk_per_step_however_far_the_worker_has_got():
    """The worker has decoded all three steps before the stream reads the first event: each chunk still holds its
    own step's tokens (the stream reads a job's tokens as of each event, not as far as the worker is)."""
    import asyncio
    from types import SimpleNamespace

    from pipeline.serving.answers import _choice_texts

    steps = [[5, 6], [7], [8, 9, 10]]
    job = SimpleNamespace(index=0, tokens=[t for s in steps for t in s], origins=[0] * 6, stop=[])
    events = [(0, "tokens", s) for s in steps] + [(0, "done", None)]

    async def next_event(pending):
        return events.pop(0)

    state = SimpleNamespace(decoder=SimpleNamespace(text=lambda ids: "".join(f"<{i}>" for i in ids)),
                            next_event=next_event)
    pending = SimpleNamespace(jobs=[job], cancel=lambda reason: None)

    async def collect():
        return [item async for item in _choice_texts(state, pending)]

    out = asyncio.run(collect())
    texts = [(what, text, since["token_ids"] if what == "text" else None) for what, _, text, since in out]
    assert texts == [("text", "<5><6>", [5, 6]), ("text", "<7>", [7]), ("text", "<8><9><10>", [8, 9, 10]),
                     ("finish", "", None)]


def test_serving_a_recommendation_picks_its_temperature_and_refuses_to_guess_one():
    """A pair measured greedy and sampled has a recommendation at each temperature: --temperature picks one, none
    given is a one-line error naming both, and one it was not measured at is too."""
    import pandas as pd

    from pipeline.serving.settings import pick

    def row(run, sampler, temperature):
        return {"run": run, "kind": "run", "task": "cnn_dailymail", "target": "t", "draft": "d", "dtype": "float32",
                "sampler": sampler, "temperature": temperature, "gamma": 4, "speedup": 1.5, "speedup_ci_low": 1.4,
                "speedup_ci_high": 1.6, "rougeL": 0.3, "flagged": False, "source": f"{run}.json"}

    table = pd.DataFrame([row("greedy-g4", "greedy", 0.0), row("exact-g4", "exact", 1.0)])
    assert pick(table, None, None, 0.01, True, "report r", 0.0)["run"] == "greedy-g4"
    assert pick(table, None, None, 0.01, True, "report r", 1.0)["run"] == "exact-g4"
    with pytest.raises(SpecsweepError, match="recommends settings at temperatures 0, 1 for t: pick one with "
                                             "--temperature"):
        pick(table, None, None, 0.01, True, "report r")
    with pytest.raises(SpecsweepError, match=r"has no recommendation at --temperature 0\.7 for t"):
        pick(table, None, None, 0.01, True, "report r", 0.7)


def test_serve_from_a_report_takes_temperature_to_pick_its_recommendation(tmp_path):
    """`serve --from-report DIR --temperature T` serves the recommendation at T (the flag picks; it does not conflict
    with the recommended point), and without it a report measured at two temperatures is a one-line error."""
    import argparse

    import pandas as pd

    from pipeline.commands import serve as serve_command

    study = _study(tmp_path / "tune" / "text")
    table = study_table(str(study))
    greedy = table[table["sampler"] == "exact"].copy()
    greedy[["run", "sampler", "temperature", "gamma"]] = ["greedy-g5", "greedy", 0.0, 5]
    reports = tmp_path / "reports"
    reports.mkdir()
    pd.concat([table, greedy]).to_csv(reports / "results.csv", index=False)
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    served = serve_command.served_settings(parser.parse_args(["--from-report", str(reports), "--lossless",
                                                              "--temperature", "0"]))
    assert (served.config.sampler, served.config.gamma, served.config.temperature) == ("greedy", 5, 0.0)
    sampled = serve_command.served_settings(parser.parse_args(["--from-report", str(reports), "--lossless",
                                                               "--temperature", "1"]))
    assert (sampled.config.sampler, sampled.config.gamma) == ("exact", 4)
    with pytest.raises(SpecsweepError, match="recommends settings at temperatures 0, 1 for models/t: pick one with "
                                             "--temperature"):
        serve_command.served_settings(parser.parse_args(["--from-report", str(reports), "--lossless"]))
