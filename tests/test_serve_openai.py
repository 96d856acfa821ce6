"""`specsweep serve` through OpenAI's own Python client (the `openai` package), against a real server on 127.0.0.1
with the tiny pair: models, chat completions (plain and streamed; a tokenizer with a chat template, and the 400 for
one without), completions with a list of prompts and n, stop strings (cut, and never leaked by a stream), echo,
per-request speculative settings, and vLLM's speculative-decoding metrics.

Skips without openai (the dev extra installs it)."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from tiny_models import PROMPTS, save_pair

openai = pytest.importorskip("openai")

from pipeline.cli import build_parser  # noqa: E402
from pipeline.commands.serve import served_settings  # noqa: E402
from pipeline.config import RunConfig  # noqa: E402
from pipeline.models import load_causal_lm, load_tokenizer  # noqa: E402
from pipeline.serving.app import create_app  # noqa: E402
from pipeline.serving.decoder import Decoder  # noqa: E402
from pipeline.serving.server import BackgroundServer  # noqa: E402
from pipeline.serving.stops import cut  # noqa: E402

GAMMA = 3
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"   # the contents, in the toy vocabulary


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tp, dp = save_pair(tmp_path_factory.mktemp("openai"))
    return tp, dp, (load_causal_lm(str(tp), torch.float32, "cpu"), load_causal_lm(str(dp), torch.float32, "cpu"),
                    load_tokenizer(str(tp)))


def decoder(pair, template: str | None = TEMPLATE, **settings) -> Decoder:
    tp, dp, (target, draft, tokenizer) = pair
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = template
    settings = {"draft": str(dp), "gamma": GAMMA, "max_new_tokens": 8, **settings}
    config = RunConfig(target=str(tp), data="", task="prompts", device="cpu", **settings)
    return Decoder(config, (target, draft if config.drafter == "model" else None, tokenizer))


@contextmanager
def client(dec: Decoder, **limits):
    """An OpenAI client of the app on a free loopback port (and the server, for its URL)."""
    server = BackgroundServer(create_app(dec, **limits)).start()
    try:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30), server
    finally:
        server.stop()


def spec(choice) -> dict:
    """The "specsweep" record of a choice (an extra field, kept by the client)."""
    return choice.model_extra["specsweep"]


def test_models_and_chat_through_the_template(pair):
    dec = decoder(pair)
    with client(dec) as (c, _):
        ids = [m.id for m in c.models.list()]
        assert ids == [dec.config.target] and c.models.retrieve(ids[0]).id == ids[0]
        with pytest.raises(openai.NotFoundError, match="this server serves"):
            c.models.retrieve("gpt-4o")

        messages = [{"role": "system", "content": PROMPTS[1]}, {"role": "user", "content": PROMPTS[0]}]
        chat = c.chat.completions.create(model="any", messages=messages, max_tokens=8, seed=3)
        # the conversation through the template is the prompt of a completion with the same seed: the same tokens
        plain = c.completions.create(model="any", prompt=f"{PROMPTS[1]} {PROMPTS[0]} ", max_tokens=8, seed=3)
        assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
        assert spec(chat.choices[0])["token_ids"] == spec(plain.choices[0])["token_ids"]
        assert chat.choices[0].message.content == plain.choices[0].text
        assert chat.usage.prompt_tokens == plain.usage.prompt_tokens == len(dec.chat_ids(messages))
        assert chat.usage.completion_tokens == len(spec(chat.choices[0])["token_ids"])
        assert chat.choices[0].finish_reason in ("stop", "length")

        stream = c.chat.completions.create(model="any", messages=messages, max_tokens=8, seed=3, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    content = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
    assert "".join(content) == chat.choices[0].message.content and sum(map(bool, content)) >= 2
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finish[-1] == chat.choices[0].finish_reason and not any(finish[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == chat.usage   # the usage chunk comes last
    assert all(ch.usage is None for ch in chunks[:-1])


def test_chat_without_a_chat_template_is_a_400_that_says_so(pair):
    with client(decoder(pair, template=None)) as (c, _):
        with pytest.raises(openai.BadRequestError, match="no chat template") as e:
            c.chat.completions.create(model="any", messages=[{"role": "user", "content": "water"}])
        assert e.value.status_code == 400 and e.value.body["param"] == "messages"
        assert c.completions.create(model="any", prompt="water", max_tokens=2).choices[0].text is not None


def test_a_list_of_prompts_and_n_are_batched_and_each_choice_keeps_its_seed(pair):
    """prompts × n choices, prompt by prompt then sample by sample; choice i is decoded with seed + i and gets the
    tokens a lone request with that seed gets (its own random stream, whatever its batch)."""
    dec = decoder(pair, ignore_eos=True)
    prompts = PROMPTS[:3]
    with client(dec, max_batch=8, max_wait_ms=200) as (c, _):
        many = c.completions.create(model="any", prompt=prompts, n=2, max_tokens=6, seed=10)
        alone = [c.completions.create(model="any", prompt=prompts[i // 2], max_tokens=6, seed=10 + i)
                 for i in (0, 3, 5)]
    assert [ch.index for ch in many.choices] == list(range(6))
    assert [spec(ch)["seed"] for ch in many.choices] == list(range(10, 16))
    assert {spec(ch)["batch"]["size"] for ch in many.choices} == {6}      # one batch through the batcher
    for i, lone in zip((0, 3, 5), alone):
        assert spec(lone.choices[0])["token_ids"] == spec(many.choices[i])["token_ids"]
        assert lone.choices[0].text == many.choices[i].text
    assert spec(many.choices[0])["token_ids"] != spec(many.choices[1])["token_ids"]   # n samples differ
    assert many.usage.prompt_tokens == sum(len(dec.prompt_ids(p)) for p in prompts)  # each prompt once
    assert many.usage.completion_tokens == 6 * 6 == many.usage.total_tokens - many.usage.prompt_tokens


def test_stop_strings_cut_the_text_and_never_leak_from_a_stream(pair):
    """A stop string whose first word comes in one verify step and whose second comes in the next: the stream holds
    the first word back, every text it has shown is a prefix of the final text, and the final text ends before the
    stop string, as the plain answer's does."""
    dec = decoder(pair, ignore_eos=True, gamma=1)
    body = {"model": "any", "prompt": PROMPTS[3], "max_tokens": 16, "seed": 5}
    with client(dec) as (c, _):
        chunks = [ch for ch in c.completions.create(**body, stream=True) if ch.choices and ch.choices[0].text]
        full = "".join(ch.choices[0].text for ch in chunks)
        # the last word of one chunk and the first of the next: a stop string split across two verify steps
        j = next(j for j in range(1, len(chunks) - 1) if chunks[j].choices[0].text.strip()
                 and chunks[j + 1].choices[0].text.strip())
        stop = chunks[j].choices[0].text.split()[-1] + " " + chunks[j + 1].choices[0].text.split()[0]
        expected = cut(full, [stop])
        plain = c.completions.create(**body, stop=[stop, "zzz"])
        streamed = [ch.choices[0] for ch in c.completions.create(**body, stop=stop, stream=True) if ch.choices]
    assert plain.choices[0].text == expected and plain.choices[0].finish_reason == "stop"
    assert len(spec(plain.choices[0])["token_ids"]) < 16   # the row ended at the stop string
    shown = ""
    for choice in streamed:
        shown += choice.text
        assert expected.startswith(shown), (shown, stop)   # nothing past the cut, not even the stop's first word
    assert shown == expected and streamed[-1].finish_reason == "stop"


def test_echo_puts_the_prompt_first(pair):
    with client(decoder(pair)) as (c, _):
        echoed = c.completions.create(model="any", prompt=PROMPTS[2], max_tokens=4, seed=1, echo=True)
        plain = c.completions.create(model="any", prompt=PROMPTS[2], max_tokens=4, seed=1)
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            model="any", prompt=PROMPTS[2], max_tokens=4, seed=1, echo=True, stream=True) if ch.choices)
    assert echoed.choices[0].text == PROMPTS[2] + plain.choices[0].text == streamed


def test_a_request_picks_its_drafter_and_gamma_within_the_servers_limits(pair):
    dec = decoder(pair)
    with client(dec) as (c, server):
        lookup = c.completions.create(model="any", prompt=PROMPTS[3], max_tokens=6, seed=2,
                                      extra_body={"speculative": {"drafter": "prompt-lookup", "gamma": 2}})
        assert spec(lookup.choices[0])["settings"]["drafter"] == "prompt-lookup"
        assert spec(lookup.choices[0])["settings"]["gamma"] == 2
        served = c.completions.create(model="any", prompt=PROMPTS[3], max_tokens=6, seed=2)
        assert spec(served.choices[0])["settings"] == {**spec(lookup.choices[0])["settings"], "drafter": "model",
                                                       "gamma": GAMMA}
        both = c.completions.create(model="any", prompt=PROMPTS[3], max_tokens=6, seed=2,
                                    extra_body={"speculative": {"drafter": "lookup-model", "gamma": 2}})
        assert spec(both.choices[0])["settings"]["drafter"] == "lookup-model"
        with pytest.raises(openai.BadRequestError, match=r"'speculative\.gamma' must be at most the server's γ \(3\)"):
            c.completions.create(model="any", prompt="water", extra_body={"speculative": {"gamma": 4}})
        with pytest.raises(openai.BadRequestError, match=r"'speculative\.gama' is not a setting"):
            c.completions.create(model="any", prompt="water", extra_body={"speculative": {"gama": 2}})
        schema = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]["Speculative"]
        assert schema["properties"]["gamma"]["anyOf"][0]["maximum"] == GAMMA
    with client(decoder(pair, drafter="prompt-lookup", draft=None)) as (c, _):
        for drafter in ("model", "lookup-model"):
            with pytest.raises(openai.BadRequestError, match="needs a draft model and this server loaded none"):
                c.completions.create(model="any", prompt="water", extra_body={"speculative": {"drafter": drafter}})
        assert c.completions.create(model="any", prompt="water", max_tokens=2, extra_body={
            "speculative": {"drafter": "suffix"}}).choices[0].finish_reason in ("stop", "length")
    with client(decoder(pair, gamma=0, draft=None)) as (c, _):   # an autoregressive server: γ 0 only
        plain = c.completions.create(model="any", prompt="water", max_tokens=2)
        assert spec(plain.choices[0])["settings"]["gamma"] == 0
        with pytest.raises(openai.BadRequestError, match=r"at most the server's γ \(0\)"):
            c.completions.create(model="any", prompt="water", extra_body={"speculative": {"gamma": 2}})


def test_vllm_speculative_decoding_metrics_agree_with_ours(pair):
    dec = decoder(pair, ignore_eos=True)
    with client(dec, max_batch=4) as (c, server):
        c.completions.create(model="any", prompt=PROMPTS[:4], max_tokens=12, seed=0)
        c.completions.create(model="any", prompt=PROMPTS[4], max_tokens=12, seed=0,
                             extra_body={"speculative": {"gamma": 1}})
        samples = {}
        for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
            for s in family.samples:
                samples[s.name, s.labels.get("position")] = (s.value, s.labels)
    drafts, labels = samples["vllm:spec_decode_num_drafts_total", None]
    assert labels == {"model_name": dec.config.target, "engine": "0"}
    draft_tokens = samples["vllm:spec_decode_num_draft_tokens_total", None][0]
    accepted = samples["vllm:spec_decode_num_accepted_tokens_total", None][0]
    per_position = [samples["vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i)][0] for i in range(GAMMA)]
    assert draft_tokens == samples["specsweep_draft_tokens_total", None][0] > drafts > 0
    assert accepted == samples["specsweep_accepted_draft_tokens_total", None][0] == sum(per_position) > 0
    assert drafts >= per_position[0] >= per_position[1] >= per_position[2]   # a position needs those before it


def test_serve_takes_a_model_name_and_a_drafter_from_the_command_line():
    args = build_parser().parse_args(["serve", "--model", "smollm2-135m-instruct", "--drafter", "prompt-lookup",
                                      "--lookup-max", "5", "--gamma", "6"])
    served = served_settings(args)
    c = served.config
    assert (c.target, c.drafter, c.lookup_max, c.gamma, c.draft) == ("smollm2-135m-instruct", "prompt-lookup", 5, 6,
                                                                      None)
    assert "drafter prompt-lookup (n-grams 1..5)" in served.describe()
