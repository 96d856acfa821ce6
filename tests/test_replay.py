"""python -m pipeline.benchmarks.replay: drafters replayed on a greedy run's texts take the engine's own steps (a
run's recorded tokens per step, sample by sample; a draft model's from its teacher-forced trace, its forwards too),
and the predicted speed is the cost curves' arithmetic."""

from __future__ import annotations

import json

import pytest
from tiny_models import load_saved_pair

from pipeline.benchmarks import replay
from pipeline.cli import main
from pipeline.errors import SpecsweepError

# repeated phrases, so that both proposers find matches; the last prompt repeats nothing
PROMPTS = ["the storm hit the city and the storm hit the", "police said the plane was late police said the plane",
           "a new report a new report a new", "water"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Greedy runs of the tiny GPT-2 target (float32): alone, with prompt lookup at γ 3 (n 1-2) and with suffix
    decoding at γ 4, and each in a token tree (2,2 and 2,1,1), with the tiny draft model at γ 3 and with prompt
    lookup then the draft at γ 4, and with the draft stopping below confidence 0.3 (up to 5 a step), one row a
    batch (the replay's model)."""
    root = tmp_path_factory.mktemp("replay")
    load_saved_pair(root / "pair", kind="gpt2")
    data = root / "p.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    common = ["run", "--target", str(root / "pair" / "target"), "--data", str(data), "--device", "cpu",
              "--temperature", "0", "--max-new-tokens", "20", "--repeats", "3", "--samples-per-repeat", "1",
              "--no-progress"]
    out = {}
    for name, extra in (("ar", ["--gamma", "0"]),
                        ("lookup", ["--drafter", "prompt-lookup", "--gamma", "3", "--lookup-max", "2"]),
                        ("suffix", ["--drafter", "suffix", "--gamma", "4"]),
                        ("lookup-tree", ["--drafter", "prompt-lookup", "--lookup-max", "2", "--draft-tree", "2,2"]),
                        ("suffix-tree", ["--drafter", "suffix", "--suffix-factor", "2", "--draft-tree", "2,1,1"]),
                        ("model", ["--draft", str(root / "pair" / "draft"), "--gamma", "3"]),
                        ("lookup-model", ["--draft", str(root / "pair" / "draft"), "--drafter", "lookup-model",
                                          "--gamma", "4", "--lookup-max", "2"]),
                        ("model-confidence", ["--draft", str(root / "pair" / "draft"), "--gamma", "2",
                                              "--gamma-max", "5", "--draft-confidence", "0.3"])):
        out[name] = root / f"{name}.json"
        assert main([*common, *extra, "--out", str(out[name])]) == 0
    return out


def _per_sample(path, setting, traces=None):
    result, texts, stops = replay.load_texts(path)
    steps = replay.replay(texts, replay.proposer_of(setting, stops, traces), setting["gamma"],
                          result["config"]["max_new_tokens"], replay.tree_widths(setting))
    return result, steps


@pytest.fixture(scope="module")
def traces(runs):
    """The tiny draft's teacher-forced traces over the model run's texts (every lossless run's: the same tokens)."""
    result, texts, _ = replay.load_texts(runs["model"])
    return replay.draft_traces(result["config"]["draft"], "float32", "none", texts)


@pytest.mark.parametrize("name,setting", [
    ("lookup", {"drafter": "prompt-lookup", "gamma": 3, "lookup_min": 1, "lookup_max": 2}),
    ("suffix", {"drafter": "suffix", "gamma": 4, "suffix_depth": 24, "suffix_factor": 1.0, "suffix_min_prob": 0.1}),
    # a tree's γ is its node count: 2 + 4 and 2 + 2 + 2
    ("lookup-tree", {"drafter": "prompt-lookup", "gamma": 6, "lookup_min": 1, "lookup_max": 2, "draft_tree": "2,2"}),
    ("suffix-tree", {"drafter": "suffix", "gamma": 6, "suffix_depth": 24, "suffix_factor": 2.0,
                     "suffix_min_prob": 0.1, "draft_tree": "2,1,1"})])
def test_replaying_a_runs_own_setting_gives_its_recorded_steps(runs, name, setting):
    result, steps = _per_sample(runs[name], setting)
    assert replay.own_setting(result["config"]) == setting
    for sample, replayed in zip(result["samples"], steps):
        assert sum(e for _, e, _ in replayed) == sample["new_tokens"] == len(sample["token_ids"])
        assert len(replayed) == sample["verify_steps"]
        assert sum(e - 1 for _, e, _ in replayed) == sample["accepted"]
        assert sum(k for k, _, _ in replayed) == sample["drafted"]       # the widths the target verified
        assert all(f == () for _, _, f in replayed)                        # no draft forwards
    summary = replay.summarize(steps, None)
    assert summary["tokens_per_step"] == pytest.approx(result["metrics"]["mean_accepted_tokens"])
    assert sum(s["accepted"] for s in result["samples"]) > 0          # the check has something to match


def test_a_tree_run_accepts_off_its_first_branch_and_a_one_wide_tree_replays_as_a_chain(runs):
    """The tree runs' steps (matched above) take a second child somewhere, so the replay's tree match is tested
    beyond the chain it starts with; a tree of width 1 at every depth is the chain of its depth, step for step."""
    setting = {"drafter": "prompt-lookup", "gamma": 6, "lookup_min": 1, "lookup_max": 2, "draft_tree": "2,2"}
    result, texts, stops = replay.load_texts(runs["lookup-tree"])
    first_only = 0
    for prompt, output in texts:           # the steps a tree that followed only first children would take
        proposer = replay.proposer_of(setting, stops)(0)
        proposer.start(prompt)
        i = 0
        while i < len(output):
            paths = proposer.propose_many(min(2, 20 - i - 1), (2, 2))
            a = replay._chain_match(paths[0] if paths else [], output, i)
            proposer.extend(output[i:i + a + 1])
            i += a + 1
            first_only += 1
    assert first_only > sum(s["verify_steps"] for s in result["samples"])
    chain = {"drafter": "suffix", "gamma": 4, "suffix_depth": 24, "suffix_factor": 1.0, "suffix_min_prob": 0.1}
    _, texts, stops = replay.load_texts(runs["suffix"])
    assert replay.replay(texts, replay.proposer_of(chain, stops), 4, 20) == replay.replay(
        texts, replay.proposer_of({**chain, "draft_tree": "1,1,1,1"}, stops), 4, 20, (1, 1, 1, 1))


def test_the_target_alones_texts_replay_to_the_lookup_runs_steps(runs):
    """At T = 0 (float32) the target alone and the lookup run emit the same tokens, so a replay of the lookup setting
    on the γ = 0 run's texts takes the lookup run's steps: what makes a replay of settings never run meaningful."""
    setting = {"drafter": "prompt-lookup", "gamma": 3, "lookup_min": 1, "lookup_max": 2}
    lookup, _ = _per_sample(runs["lookup"], setting)
    ar, steps = _per_sample(runs["ar"], setting)
    assert [s["token_ids"] for s in ar["samples"]] == [s["token_ids"] for s in lookup["samples"]]
    assert [len(s) for s in steps] == [s["verify_steps"] for s in lookup["samples"]]
    assert replay.own_setting(ar["config"]) is None


def test_the_predicted_speedup_is_the_cost_curves_arithmetic(tmp_path):
    forward = tmp_path / "forward.json"
    forward.write_text(json.dumps({"results": [
        {"dtype": "float32", "new_tokens": q, "static_ms": ms} for q, ms in ((1, 10.0), (2, 11.0), (4, 13.0))]
        + [{"dtype": "bfloat16", "new_tokens": 1, "static_ms": 99.0}]}))
    curve = replay.cost_curve(forward, "float32")
    assert curve == {1: 1.0, 2: 1.1, 4: 1.3}
    assert replay.verify_cost(curve, 3) == pytest.approx(1.2)                  # linear between 2 and 4
    # two samples: the first steps (prefill) are left out; later steps cost r(k + 1), and their draft forwards c(n)
    steps = [[(0, 1, ()), (3, 4, (2, 1, 1)), (2, 1, (1, 1))], [(1, 2, ()), (0, 1, ())]]
    row = replay.summarize(steps, curve)
    assert row["predicted_decode_speedup"] == pytest.approx((4 + 1 + 1) / (1.3 + 1.2 + 1.0))
    assert row["tokens_per_step"] == pytest.approx(9 / 5) and row["acceptance_rate"] == pytest.approx(4 / 6)
    assert row["proposing_share"] == pytest.approx(3 / 5) and row["draft_forwards_per_step"] == pytest.approx(5 / 5)
    draft = {1: 0.1, 2: 0.15, 4: 0.25}
    assert replay.verify_cost(draft, 3) == pytest.approx(0.2) and replay.verify_cost(draft, 6) == pytest.approx(0.35)
    priced = replay.summarize(steps, curve, draft)
    assert priced["predicted_draft_cost"] == pytest.approx(0.15 + 0.1 * 4)
    assert priced["predicted_decode_speedup"] == pytest.approx(6 / (1.3 + 1.2 + 1.0 + 0.55))
    with pytest.raises(SpecsweepError, match="no float16 forward over 1 new token"):
        replay.cost_curve(forward, "float16")


def test_the_benchmark_writes_a_table_and_json_and_refuses_bad_input_in_one_line(runs, tmp_path, capsys):
    forward = tmp_path / "forward.json"
    forward.write_text(json.dumps({"results": [{"dtype": "float32", "new_tokens": q, "static_ms": 10.0 + q}
                                               for q in (1, 3, 5)]}))
    out = tmp_path / "replay.json"
    args = [str(runs["lookup"]), "--forward", str(forward), "--gamma", "2,4", "--lookup-min", "1",
            "--lookup-max", "1,2", "--suffix-factor", "2", "--draft-tree", "2,1", "--out", str(out)]
    assert replay.main(args) == 0
    printed = capsys.readouterr().out
    assert "the run's own setting" in printed and f"wrote {out}" in printed
    doc = json.loads(out.read_text())
    settings = [(r["drafter"], r["gamma"], r.get("lookup_max")) for r in doc["results"]]
    # the run's own setting first (γ 3 is not in the grid), then prompt lookup's 4 and suffix decoding's 2 chains,
    # then each as the tree 2,1 once (its γ: its 4 nodes; prompt lookup's two n ranges, suffix decoding's one)
    assert settings[0] == ("prompt-lookup", 3, 2) and doc["results"][0]["own"]
    assert len(settings) == 1 + 4 + 2 + 3 and all(r["predicted_decode_speedup"] > 0 for r in doc["results"])
    trees = [r for r in doc["results"] if r.get("draft_tree")]
    assert [(r["drafter"], r["gamma"], r["draft_tree"]) for r in trees] == [
        ("prompt-lookup", 4, "2,1"), ("prompt-lookup", 4, "2,1"), ("suffix", 4, "2,1")]
    for bad, message in (([*args[:3], "--gamma", "5"], "measured up to 5"),
                         ([*args[:3], "--gamma", "2", "--draft-tree", "3,3"], "γ [12] (a tree's: its node count)"),
                         ([str(runs["lookup"]), "--drafters", "medusa"], "--drafters must be of"),
                         ([str(runs["lookup"]), "--drafters", "model"], "give --draft MODEL"),
                         ([str(runs["lookup"]), "--confidence", "1.5"], "--confidence values must be in [0, 1)"),
                         ([str(runs["lookup"]), "--draft-forward", str(forward)], "give --forward too"),
                         ([str(tmp_path / "missing.json")], "missing.json")):
        with pytest.raises(SystemExit) as e:
            replay.main([*bad, "--out", str(tmp_path / "x.json")])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "x.json").exists()


def test_a_sampled_run_or_one_without_prompt_ids_is_refused(runs, tmp_path):
    result = json.loads(runs["lookup"].read_text())
    sampled = tmp_path / "sampled.json"
    sampled.write_text(json.dumps({**result, "config": {**result["config"], "temperature": 1.0}}))
    with pytest.raises(SpecsweepError, match="needs a greedy run"):
        replay.load_texts(sampled)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**result, "samples": [{k: v for k, v in s.items() if k != "prompt_ids"}
                                                     for s in result["samples"]]}))
    with pytest.raises(SpecsweepError, match="run it again with this version"):
        replay.load_texts(old)


@pytest.mark.parametrize("name,setting", [
    ("model", {"drafter": "model", "gamma": 3, "draft_confidence": 0.0}),
    ("lookup-model", {"drafter": "lookup-model", "gamma": 4, "lookup_min": 1, "lookup_max": 2,
                      "draft_confidence": 0.0})])
def test_a_draft_models_run_replays_to_its_recorded_steps_and_draft_forwards(runs, traces, name, setting):
    """A draft model's steps from its teacher-forced trace (float32: the one-token forwards' argmax) are the run's,
    sample by sample, and so are its draft forwards: the replay runs the drafters' cache bookkeeping."""
    result, steps = _per_sample(runs[name], setting, traces)
    assert replay.own_setting(result["config"]) == setting
    for sample, replayed in zip(result["samples"], steps):
        assert len(replayed) == sample["verify_steps"]
        assert sum(e - 1 for _, e, _ in replayed) == sample["accepted"]
        assert sum(k for k, _, _ in replayed) == sample["drafted"]
    assert sum(len(f) for sample in steps for _, _, f in sample) == result["metrics"]["draft_forwards"]
    assert sum(s["accepted"] for s in result["samples"]) > 0
    if name == "lookup-model":   # both sources were used, and a catch-up forward read more than one token
        counts = result["metrics"]["drafter_counts"]
        assert counts["accepted_lookup"] > 0 and counts["accepted_draft"] > 0
        assert any(n > 1 for sample in steps for _, _, f in sample for n in f)


def test_a_confidence_threshold_stops_the_replayed_draft_within_its_bounds(runs, traces):
    """A threshold stops a step's drafting after the first position below it: fewer draft forwards than none, the
    unknown confidences past a miss counted both ways ("stop" at most "draft"), accepted tokens never more."""
    _, texts, stops = replay.load_texts(runs["model"])
    base = {"drafter": "model", "gamma": 6, "draft_confidence": 0.0}

    def totals(setting, after_miss="draft"):
        steps = replay.replay(texts, replay.proposer_of(setting, stops, traces, after_miss), 6, 20)
        flat = [s for sample in steps for s in sample]
        return sum(len(f) for _, _, f in flat), sum(e - 1 for _, e, _ in flat), len(flat)

    forwards, accepted, _ = totals(base)
    high = {**base, "draft_confidence": 1.0}
    most, accepted_high, _ = totals(high)
    least, _, _ = totals(high, "stop")
    assert least <= most < forwards and accepted_high <= accepted
    # the greedy confidences: a threshold above every one of them drafts one token a step
    assert max(c for t in traces for c in t.confidence) < 1.0 and least == most
    assert totals(base, "stop")[0] == forwards      # no threshold: a step drafts to its length either way


def test_the_trace_is_the_drafts_own_greedy_tokens(runs, traces):
    """Teacher-forced: after prompt + output[:i] the trace holds the draft's argmax, which equals output[i] where the
    model run accepted a draft token there; one more entry than the output (after its last token)."""
    result, texts, _ = replay.load_texts(runs["model"])
    for (prompt, output), t in zip(texts, traces):
        assert len(t.greedy) == len(t.confidence) == len(output) + 1 and t.prompt == tuple(prompt)
        assert all(0 < c <= 1 for c in t.confidence)
    # every accepted draft token is a position where the draft's greedy token is the output's
    matches = sum(g == o for t in traces for g, o in zip(t.greedy, t.output))
    assert matches >= sum(s["accepted"] for s in result["samples"]) > 0
    bad = replay.DraftReplay(traces[0])
    with pytest.raises(ValueError, match="another prompt"):
        bad.start([1, 2, 3])


def test_a_confidence_run_replays_to_its_steps_and_its_forwards_lie_within_the_bounds(runs, traces):
    """With a threshold the engine stops drafting in the step (on a CPU): the replay takes the run's steps and
    accepted tokens exactly, and its unknown confidences past a miss bound what the run drafted and its forwards."""
    result, texts, stops = replay.load_texts(runs["model-confidence"])
    own = replay.own_setting(result["config"])
    assert own == {"drafter": "model", "gamma": 5, "draft_confidence": 0.3}
    bounds = {}
    for after_miss in ("stop", "draft"):
        steps = replay.replay(texts, replay.proposer_of(own, stops, traces, after_miss), 5, 20)
        for sample, replayed in zip(result["samples"], steps):
            assert len(replayed) == sample["verify_steps"]
            assert sum(e - 1 for _, e, _ in replayed) == sample["accepted"]
        bounds[after_miss] = (sum(k for s in steps for k, _, _ in s), sum(len(f) for s in steps for _, _, f in s))
    drafted = sum(s["drafted"] for s in result["samples"])
    assert bounds["stop"][0] <= drafted <= bounds["draft"][0]
    assert bounds["stop"][1] <= result["metrics"]["draft_forwards"] <= bounds["draft"][1]
    assert bounds["stop"] != bounds["draft"]           # a confident miss happened, so the bounds part
    # fewer forwards than a fixed γ 5 would run
    fixed = replay.replay(texts, replay.proposer_of({**own, "draft_confidence": 0.0}, stops, traces), 5, 20)
    assert result["metrics"]["draft_forwards"] < sum(len(f) for s in fixed for _, _, f in s)
