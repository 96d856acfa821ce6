"""Speculation under load: rows of a batch are decoded as they are alone, and a server's counters are the sum of its
requests' own numbers.

  rows      for every drafter a run can have (`--drafter` model, prompt-lookup, suffix, lookup-model, and what
            pipeline/stack.py ``build_drafter`` makes of the settings: a token tree, a reduced draft vocabulary, suffix
            decoding over earlier outputs, a draft with another tokenizer in string and intersection mode), built
            from a RunConfig through ``stack.load_pair`` / ``build_sampler`` / ``build_engine`` and encoded by the
            prompts task (left padding), a batch of prompts of different lengths decoded greedily (T = 0, the greedy
            rule or exact) on the static-cache forward gives each row the tokens that row gets alone (batch 1), which
            are the target's own greedy tokens; the drafter did propose and have tokens accepted
  counters  after concurrent requests of different prompt lengths that share batches (several drafters and γ), the
            per-request ``specsweep.acceptance`` (accepted, drafted) and the per-position counts read from each
            choice's origins sum exactly to the server's Prometheus counters (ours and vLLM's), its token counters to
            the requests' usage; each request's numbers are those it gets alone
"""

from __future__ import annotations

import re

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from tiny_models import cross_tokenizer_pair, save_pair

from pipeline import paired, stack
from pipeline.config import MODEL_DRAFTERS, RunConfig
from pipeline.decoding.drafters.cross_tokenizer import TextDrafter
from pipeline.decoding.drafters.lookup import LookupDrafter
from pipeline.decoding.drafters.lookup_model import LookupModelDrafter
from pipeline.decoding.drafters.model import ModelDrafter
from pipeline.decoding.drafters.tree import TreeDrafter
from pipeline.decoding.drafters.vocab_map import VocabMapDrafter
from pipeline.tasks import get_task

NEW_TOKENS = 24
# different lengths (19, 13, 8, 1 and 12 tokens: left padding leaves holes in every row but the longest), repeated
# n-grams in the first three so that prompt lookup and suffix decoding match from the first step
PROMPTS = ["the storm was on the road and the storm was on the road and the storm was on the",
           "police said the plane was in the city police said the plane was",
           "a new report a new report a new",
           "water",
           "the president of the world team said that the game was not"]

# case -> (the RunConfig's settings, the drafter class stack.build_drafter must build); the sampler is T = 0 greedy or
# exact, alternating so that both verify rules run
CASES = {
    "model": ({"drafter": "model"}, ModelDrafter),
    "model-exact": ({"drafter": "model", "sampler": "exact"}, ModelDrafter),
    "prompt-lookup": ({"drafter": "prompt-lookup"}, LookupDrafter),
    "prompt-lookup-exact": ({"drafter": "prompt-lookup", "sampler": "exact"}, LookupDrafter),
    "suffix": ({"drafter": "suffix"}, LookupDrafter),
    "suffix-exact": ({"drafter": "suffix", "sampler": "exact"}, LookupDrafter),
    "lookup-model": ({"drafter": "lookup-model"}, LookupModelDrafter),
    "lookup-model-exact": ({"drafter": "lookup-model", "sampler": "exact"}, LookupModelDrafter),
    "suffix-outputs": ({"drafter": "suffix", "suffix_outputs": True}, LookupDrafter),
    "model-tree": ({"drafter": "model", "draft_tree": "2,2,1", "sampler": "exact"}, TreeDrafter),
    "prompt-lookup-tree": ({"drafter": "prompt-lookup", "draft_tree": "3,2,1"}, LookupDrafter),
    "suffix-tree": ({"drafter": "suffix", "draft_tree": "3,2,1", "sampler": "exact"}, LookupDrafter),
    "model-draft-vocab": ({"drafter": "model", "draft_vocab": 40}, VocabMapDrafter),
    "lookup-model-draft-vocab": ({"drafter": "lookup-model", "draft_vocab": 40, "sampler": "exact"},
                                 LookupModelDrafter),
    "cross-tokenizer-string": ({"drafter": "model", "pair": "cross"}, TextDrafter),
    "cross-tokenizer-intersection": ({"drafter": "model", "sampler": "exact", "pair": "cross"}, TextDrafter),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a CPU shared with other work, more threads make these small forwards far slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """pair name -> (target folder, draft folder): the tiny Llama pair (its draft has fewer embedding rows than the
    target) and a Llama pair whose draft has another tokenizer (a byte-level BPE)."""
    root = tmp_path_factory.mktemp("batch-rows")
    out = {"llama": save_pair(root / "llama", kind="llama", draft_vocab_pad=-2)}
    target, target_tok, draft, draft_tok = cross_tokenizer_pair("llama")
    for name, model, tok in (("target", target, target_tok), ("draft", draft, draft_tok)):
        model.save_pretrained(root / "cross" / name)
        tok.save_pretrained(root / "cross" / name)
    out["cross"] = (root / "cross" / "target", root / "cross" / "draft")
    return out


@pytest.fixture(scope="module")
def loaded(folders):
    """pair name -> (target, draft, tokenizer), loaded once by the run's own loading code (fp32, CPU)."""
    cache = {}

    def load(name: str):
        if name not in cache:
            tp, dp = folders[name]
            config = RunConfig(target=str(tp), draft=str(dp), data="", task="prompts", device="cpu",
                               temperature=0.0, draft_tokenizer_mode="auto")
            pair = stack.load_pair(config, get_task("prompts"), torch.float32, "cpu")
            cache[name] = (pair.target, pair.draft, pair.tokenizer)
        return cache[name]
    return load


def run_config(folders, settings: dict) -> RunConfig:
    settings = dict(settings)
    tp, dp = folders[settings.pop("pair", "llama")]
    config = RunConfig(target=str(tp), draft=str(dp), data="", task="prompts", device="cpu", temperature=0.0,
                       gamma=3, max_new_tokens=NEW_TOKENS, **{"sampler": "greedy", **settings})
    return config.validate_decoding()


def decode(engine, encode, prompts: list[str]):
    """``prompts`` encoded by the prompts task (left-padded) and decoded as `specsweep run` decodes a batch (greedy:
    no generator)."""
    inputs, _ = encode([{"id": f"p{i}", "prompt": p} for i, p in enumerate(prompts)])
    texts = paired.prompt_texts(engine, inputs)
    # a drafter with another tokenizer reads the prompts' text, as `specsweep run` hands it over
    assert ("prompt_texts" in texts) == isinstance(engine.drafter, TextDrafter)
    return engine.generate(inputs["input_ids"], inputs["attention_mask"], NEW_TOKENS, **texts)


@pytest.mark.parametrize("case", list(CASES))
def test_each_row_of_a_ragged_batch_gets_the_tokens_it_gets_alone(folders, loaded, case):
    settings, drafter_class = CASES[case]
    config = run_config(folders, settings)
    target, draft, tokenizer = loaded(settings.get("pair", "llama"))
    engine = stack.build_engine(config, stack.build_sampler(config), target,
                                draft if config.drafter in MODEL_DRAFTERS else None, tokenizer, "cpu")
    assert isinstance(engine.drafter, drafter_class), type(engine.drafter)
    assert engine.target.static is not None
    assert set(stack.forwards_used(engine).values()) == {"static"}      # the draft's forward too, where it has one
    encode = get_task("prompts").encoder(target, tokenizer, None, config)
    lengths = [len(ids) for ids in (encode([{"id": "p", "prompt": p}])[0]["input_ids"][0] for p in PROMPTS)]
    assert len(set(lengths)) == len(PROMPTS)                              # every row but the longest has holes

    batch = decode(engine, encode, PROMPTS)
    alone = [decode(engine, encode, [p]).tokens[0] for p in PROMPTS]
    assert batch.tokens == alone
    # and those are the target's own greedy tokens (the γ = 0 loop of the same run)
    ar = stack.autoregressive_engine(config, target, tokenizer, "cpu")
    assert [decode(ar, encode, [p]).tokens[0] for p in PROMPTS] == alone
    assert all(len(t) > 0 for t in alone)

    # the drafter proposed and the target accepted some of it (with rejections too: rolled-back positions)
    stats = batch.row_stats
    accepted, drafted = sum(s["accepted"] for s in stats), sum(s["drafted"] for s in stats)
    assert 0 < accepted < drafted, (accepted, drafted)
    if config.drafter in MODEL_DRAFTERS:
        assert batch.extra["draft_forwards"] > 0
    else:
        assert batch.extra["draft_forwards"] == 0 and "lookup" in batch.phase_time_s
    if config.drafter == "lookup-model":
        done = batch.extra["drafter_counts"]
        assert done["lookup_tokens"] > 0 and done["draft_tokens"] > 0


# ---------------------------------------------------------------------------------------------- the server's counters

GAMMA = 3


def _scrape(url: str):
    """GET /metrics as a function: (sample name, labels to match) -> the sum of the matching samples' values."""
    text = httpx.get(url + "/metrics").text
    samples = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]

    def value(name: str, **labels) -> float:
        found = [v for n, got, v in samples if n == name and all(got.get(k) == w for k, w in labels.items())]
        assert found, (name, labels)
        return sum(found)
    return value


def _steps(origins: str) -> list[int]:
    """Per verify step of a choice, its accepted draft tokens (-1: a step that proposed nothing), read from its
    origins: each step's accepted drafts (A) end with the target's token (C corrected, B bonus, T target alone)."""
    assert re.fullmatch(r"(A*[CB]|T)*", origins), origins       # not cut inside a step
    return [-1 if m.group() == "T" else len(m.group()) - 1 for m in re.finditer(r"A*[CBT]", origins)]


def test_the_requests_own_acceptance_adds_up_to_the_servers_counters(folders, loaded, monkeypatch):
    """Exact sums, read as soon as the last answer has come: a batch's engine call is held back after it returns, so
    counters the server took only once its batch was done (after the answers went out) would miss that batch."""
    import time

    from test_serve import complete, in_background

    from pipeline.decoding.engine import SpeculativeEngine
    from pipeline.serving.app import create_app
    from pipeline.serving.decoder import Decoder
    from pipeline.serving.server import BackgroundServer

    tp, dp = folders["llama"]
    config = RunConfig(target=str(tp), draft=str(dp), data="", task="prompts", gamma=GAMMA, device="cpu",
                       max_new_tokens=16, ignore_eos=True, threads=1)
    dec = Decoder(config, loaded("llama"))
    # concurrent requests of different prompt lengths, in three groups that batch apart (the served drafter; prompt
    # lookup; lookup-model at γ 2), one with two prompts (two choices); the same max_tokens within a group, so no
    # row is cut inside a step and its origins tell every step
    bodies = [{"prompt": p, "max_tokens": 14, "seed": i} for i, p in enumerate(PROMPTS)]
    bodies += [{"prompt": p, "max_tokens": 12, "seed": i, "speculative": {"drafter": "prompt-lookup"}}
               for i, p in enumerate(PROMPTS[:3])]
    bodies += [{"prompt": [PROMPTS[3], PROMPTS[1]], "max_tokens": 10, "temperature": 0.0,
                "speculative": {"drafter": "lookup-model", "gamma": 2}}]
    generate = SpeculativeEngine.generate

    def held_back(self, *args, **kwargs):
        result = generate(self, *args, **kwargs)
        time.sleep(0.5)
        return result

    server = BackgroundServer(create_app(dec, max_batch=8, max_wait_ms=800)).start()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(SpeculativeEngine, "generate", held_back)
            boxes = [in_background(complete, server.url, **b) for b in bodies]
            for box in boxes:
                box["thread"].join(60)
            answers = [box["value"].json() for box in boxes]
            m = _scrape(server.url)
    finally:
        server.stop()

    choices = [c["specsweep"] for a in answers for c in a["choices"]]
    assert [c["batch"]["size"] for c in choices] == [5] * 5 + [3] * 3 + [2] * 2      # they did share batches
    accepted = sum(c["acceptance"]["accepted"] for c in choices)
    drafted = sum(c["acceptance"]["drafted"] for c in choices)
    steps = [s for c in choices for s in _steps(c["origins"])]
    per_position = [sum(s > i for s in steps) for i in range(GAMMA)]
    assert 0 < accepted < drafted
    assert m("specsweep_accepted_draft_tokens_total") == m("vllm:spec_decode_num_accepted_tokens_total") \
        == accepted == sum(max(s, 0) for s in steps)
    assert m("specsweep_draft_tokens_total") == m("vllm:spec_decode_num_draft_tokens_total") == drafted
    assert m("vllm:spec_decode_num_drafts_total") == sum(s >= 0 for s in steps)
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert [m(per_pos, position=str(i)) for i in range(GAMMA)] == per_position
    assert sum(c["acceptance"]["verify_steps"] for c in choices) == len(steps)
    assert m("specsweep_generated_tokens_total") == sum(a["usage"]["completion_tokens"] for a in answers) \
        == sum(len(c["token_ids"]) for c in choices)
    assert m("specsweep_prompt_tokens_total") == sum(a["usage"]["prompt_tokens"] for a in answers)
    assert m("specsweep_requests_total", endpoint="/v1/completions", status="200") == len(bodies)

    # a request's numbers are its own: alone (a fresh server, batch 1) it gets the same tokens, origins and acceptance
    server = BackgroundServer(create_app(Decoder(config, loaded("llama")), max_batch=1)).start()
    try:
        for body, answer in zip(bodies[:8], answers[:8]):
            own = complete(server.url, **body).json()["choices"][0]["specsweep"]
            theirs = answer["choices"][0]["specsweep"]
            assert own["batch"]["size"] == 1
            assert (own["token_ids"], own["origins"], own["acceptance"]) == \
                (theirs["token_ids"], theirs["origins"], theirs["acceptance"])
    finally:
        server.stop()
