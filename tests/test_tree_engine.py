"""Token trees in the loop: the draft model's tree proposals, the target's tree forward and the cache compaction.

  lossless   at T = 0 a tree step decodes the target's own greedy tokens (GPT-2 and Llama static forwards, batched
             with padding and alone), through the engine and through `specsweep run --draft-tree` on the toy pair
  forward    the tree forward's logits at every node equal a fresh forward over the node's branch, and after the
             accepted path is compacted the next logits equal a fresh forward over the kept prefix
  exactness  at T = 1 the first two emitted tokens follow the target (chi-square), for children sampled with and
             without replacement and the draft's top-k
  syncs      a tree run adds no host sync to the forwards and the verify step
  config     --draft-tree's shape and companions are checked in one line
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from stat_utils import assert_fits, counts
from sync_detector import NoHostSync
from tiny_models import PROMPTS, save_pair, write_prompts

from pipeline.cli import main
from pipeline.config import RunConfig
from pipeline.decoding.cache import CachedModel
from pipeline.decoding.drafters.tree import TreeDrafter
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.models import load_causal_lm, load_tokenizer
from pipeline.samplers import get_sampler
from pipeline.samplers.tree import TreeSampler
from pipeline.tree_shape import TokenTree
from pipeline.tree_tensors import TreeSpan

torch.set_num_threads(1)
EOS = 1


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """kind -> (target, draft, tokenizer) on the CPU, loaded once; the llama draft has a smaller embedding matrix
    than its target."""
    loaded = {}

    def load(kind: str):
        if kind not in loaded:
            tp, dp = save_pair(tmp_path_factory.mktemp(kind), kind=kind, draft_vocab_pad=-2 if kind == "llama" else 0)
            models = [load_causal_lm(str(path), torch.float32, "cpu") for path in (tp, dp)]
            loaded[kind] = (*models, load_tokenizer(str(tp)))
        return loaded[kind]
    return load


@pytest.fixture(params=["gpt2", "llama"])
def pair(request, pairs):
    return pairs(request.param)


# a tree no widths describe (nodes of one depth with 2, 1 and 0 children), as --draft-tree best:N plans them
UNEVEN = TokenTree((-1, -1, 0, 0, 1, 2))


def tree_engine(target, draft, widths, temperature: float, children: str = "without-replacement", eos=(EOS,)):
    tree = widths if isinstance(widths, TokenTree) else TokenTree.from_widths(widths)
    sampler = TreeSampler(get_sampler("exact", temperature=temperature))
    return SpeculativeEngine(target, TreeDrafter(draft, tree, children), sampler, gamma=tree.n_nodes, device="cpu",
                             eos_token_ids=list(eos), pad_token_id=0)


def hf_greedy(model, tok, prompt, max_new):
    enc = tok(prompt, return_tensors="pt")
    out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, pad_token_id=0, eos_token_id=EOS)
    return out[0, enc.input_ids.shape[1]:].tolist()


@pytest.mark.parametrize("widths", [(2, 2, 1), (3,), (3, 2), (1, 1, 1), UNEVEN])
def test_greedy_tree_decoding_is_the_target_alone(pair, widths):
    target, draft, tok = pair
    reference = [hf_greedy(target, tok, p, 24) for p in PROMPTS]
    engine = tree_engine(target, draft, widths, 0.0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    batched = engine.generate(enc.input_ids, enc.attention_mask, 24)
    assert batched.tokens == reference
    one = tok(PROMPTS[3], return_tensors="pt")
    assert engine.generate(one.input_ids, one.attention_mask, 24).tokens == [reference[3]]
    stats = batched.row_stats
    depth = widths.depth if isinstance(widths, TokenTree) else len(widths)
    assert 0 < sum(s["accepted"] for s in stats) < sum(s["verify_steps"] for s in stats) * depth
    assert batched.extra["draft_forwards"] > 0
    # the per-node counts: every accepted token is an accepted node, every step that drafts (all but at most a
    # row's last, which has room for the emitted token alone) tries a first child at depth 1
    nodes = batched.extra["node_acceptance"]
    assert sum(map(sum, nodes["accepted"])) == sum(s["accepted"] for s in stats)
    steps = sum(s["verify_steps"] for s in stats)
    assert steps - len(PROMPTS) <= nodes["reached"][0][0] <= steps
    assert all(a <= r for ra, rr in zip(nodes["accepted"], nodes["reached"]) for a, r in zip(ra, rr))


def branch(tree: TokenTree, node: int) -> list[int]:
    """The nodes from the root's child down to ``node``."""
    out = [node]
    while tree.parents[out[-1]] >= 0:
        out.append(tree.parents[out[-1]])
    return out[::-1]


def test_the_tree_forward_scores_each_branch_and_compaction_keeps_the_accepted_path(pair):
    target, _, tok = pair
    tree = TokenTree.from_widths((2, 2, 1))
    enc = tok(PROMPTS[:4], return_tensors="pt", padding=True)
    ids, mask = enc.input_ids, enc.attention_mask.bool()
    g = torch.Generator().manual_seed(3)
    model = CachedModel(target, static=True)
    model.reset(4, torch.device("cpu"), capacity=64)
    model.forward(ids, mask, holes=True)
    scored = torch.randint(3, 90, (4, 1 + tree.n_nodes), generator=g)           # the root, then the nodes
    logits = model.forward(scored, span=TreeSpan.whole(tree, "cpu"))
    for b in range(4):
        context = ids[b][mask[b]]
        for node in (0, 3, 9, 8):
            prefix = torch.cat([context, scored[b, :1], scored[b, [1 + n for n in branch(tree, node)]]])[None]
            torch.testing.assert_close(logits[b, 1 + node], target(input_ids=prefix).logits[0, -1], rtol=1e-4,
                                       atol=1e-4)
    path = torch.tensor([[1, 5, 9], [0, -1, -1], [-1, -1, -1], [1, 4, 8]])
    accepted = (path >= 0).sum(1)
    model.retain(1 + tree.n_nodes, accepted + 1, int(accepted.max()) + 1, int(accepted.min()) + 1, path,
                 tree.n_nodes)
    nxt = torch.randint(3, 90, (4, 1), generator=g)
    cached = model.forward(nxt, torch.ones_like(nxt, dtype=torch.bool))[:, -1]
    for b in range(4):
        kept = scored[b, [1 + n for n in path[b, : accepted[b]].tolist()]]
        prefix = torch.cat([ids[b][mask[b]], scored[b, :1], kept, nxt[b]])[None]
        torch.testing.assert_close(cached[b], target(input_ids=prefix).logits[0, -1], rtol=1e-4, atol=1e-4)
    assert model.length == ids.shape[1] + 1 + 3 + 1


def first_two_laws(target, prompt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The target's laws (float64 [V] each) of its first and second sampled tokens at T = 1 after prompt [1, L]."""
    V = target.config.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(target(prompt).logits[0, -1].double(), -1)
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2_given = torch.softmax(target(seqs).logits[:, -1].double(), -1)
    return p1.numpy(), (p1[:, None] * p2_given).sum(0).numpy()


@pytest.mark.parametrize("kind,children,shape", [("gpt2", "without-replacement", (2, 2, 1)),
                                                 ("gpt2", "with-replacement", (2, 2, 1)), ("gpt2", "top-k", (2, 2, 1)),
                                                 ("llama", "without-replacement", (2, 2, 1)),
                                                 ("gpt2", "without-replacement", UNEVEN)])
def test_tree_sampling_follows_the_target_distribution(pairs, kind, children, shape):
    """First and second emitted tokens of a 2,2,1 tree at T = 1 against p(t1) and sum_t1 p(t1) p(t2|t1) (every
    child rule on GPT-2; on Llama one, as the forward is the model's and the rules the drafter's); and of the uneven
    tree, decoding 5 tokens so that its first step drafts the whole tree."""
    target, draft, tok = pairs(kind)
    n = 6000
    enc = tok([PROMPTS[0]] * n, return_tensors="pt", padding=True)
    res = tree_engine(target, draft, shape, 1.0, children, eos=()).generate(
        enc.input_ids, enc.attention_mask, 2 if shape == (2, 2, 1) else 5, torch.Generator().manual_seed(1))
    out = np.array(res.tokens)
    stats = res.row_stats
    assert 0 < sum(s["accepted"] for s in stats) < sum(s["verify_steps"] for s in stats) * 3
    V = target.config.vocab_size
    p1, p2 = first_two_laws(target, enc.input_ids[:1])
    assert_fits(counts(out[:, 0], V), p1, f"tree first token ({children})")
    assert_fits(counts(out[:, 1], V), p2, f"tree second token ({children})")


def test_a_tree_run_adds_no_host_sync(pair):
    target, draft, tok = pair
    enc = tok(PROMPTS[:3], return_tensors="pt", padding=True)
    engine = tree_engine(target, draft, (2, 2, 1), 1.0, eos=())
    with NoHostSync() as mode:
        res = engine.generate(enc.input_ids, enc.attention_mask, 16, torch.Generator().manual_seed(0))
    assert res.verify_steps >= 4
    assert len(mode.syncs) <= 2, sorted(set(mode.syncs))


def test_draft_tree_settings_are_checked_in_one_line(tmp_path):
    data = tmp_path / "p.jsonl"
    write_prompts(data)
    base = {"target": "t", "draft": "d", "data": str(data), "out": str(tmp_path / "o.json")}
    config = RunConfig.from_dict({**base, "draft_tree": "2,2,1"}).validate_decoding()
    assert config.gamma == 10
    # the CUDA kernel tree_verify verifies trees too (--backend cupy), but not from CUDA graphs
    assert RunConfig.from_dict({**base, "draft_tree": "2,2,1", "backend": "cupy"}).validate_decoding().gamma == 10
    for extra, words in [({"draft_tree": "2,0"}, "widths must be >= 1"),
                         ({"draft_tree": "2,2", "sampler": "sigmoid"}, "--sampler exact or greedy"),
                         ({"draft_tree": "2", "drafter": "prompt-lookup", "tree_children": "with-replacement"},
                          "deterministic children"),
                         ({"draft_tree": "2", "static_cache": False}, "the static-cache forward"),
                         ({"draft_tree": "2", "draft_schedule": "heuristic"}, "a constant draft length"),
                         ({"draft_tree": "2", "tree_children": "best"}, "--tree-children"),
                         ({"draft_tree": "2", "backend": "cupy", "verify_graphs": True}, "no --verify-graphs")]:
        with pytest.raises(SpecsweepError) as e:
            RunConfig.from_dict({**base, **extra}).validate_decoding()
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_specsweep_run_with_a_tree_at_t0_equals_the_target_alone(tmp_path):
    """`specsweep run --draft-tree 2,2,1 --temperature 0` on the quick toy text pair (built with `specsweep toy`)
    emits the γ = 0 run's tokens for every prompt."""
    data, models = tmp_path / "data", tmp_path / "models"
    assert main(["toy", "data", "--out", str(data), "--quick", "--no-progress"]) == 0
    assert main(["toy", "train", "--task", "text", "--data", str(data), "--out", str(models), "--quick",
                 "--threads", "1", "--no-progress"]) == 0
    common = ["run", "--task", "cnn_dailymail", "--target", str(models / "text" / "target"), "--draft",
              str(models / "text" / "draft"), "--data", str(data / "text" / "test.jsonl"), "--temperature", "0",
              "--max-new-tokens", "12", "--batch-size", "3", "--device", "cpu", "--threads", "1", "--repeats", "3",
              "--no-progress"]
    assert main([*common, "--draft-tree", "2,2,1", "--out", str(tmp_path / "tree.json")]) == 0
    assert main([*common, "--gamma", "0", "--out", str(tmp_path / "alone.json")]) == 0
    tree = json.loads((tmp_path / "tree.json").read_text())
    alone = json.loads((tmp_path / "alone.json").read_text())
    assert [s["token_ids"] for s in tree["samples"]] == [s["token_ids"] for s in alone["samples"]]
    assert tree["config"]["gamma"] == 10 and tree["config"]["draft_tree"] == "2,2,1"
    assert sum(s["accepted"] for s in tree["samples"]) > 0
    # a step accepts at most the tree's depth: the histogram, the per-depth acceptance and α count up to 3, not 10
    metrics = tree["metrics"]
    assert len(metrics["accepted_histogram"]) == 4 and len(metrics["position_acceptance"]) == 3
    hist = metrics["accepted_histogram"]
    accepted = sum(k * n for k, n in enumerate(hist))
    assert metrics["iid_alpha"] == pytest.approx(accepted / (accepted + sum(hist[:3])))


def test_accepted_characters_count_the_accepted_path(pair):
    """With the engine's per-token character counts, a tree step's accepted characters are those of the tokens it
    accepted (its path), not of the first nodes it proposed."""
    from pipeline.origins import ACCEPTED

    target, draft, tok = pair
    enc = tok(PROMPTS[:3], return_tensors="pt", padding=True)
    tree = TokenTree.from_widths((3, 2))
    chars = torch.arange(target.config.vocab_size) % 7 + 1
    engine = SpeculativeEngine(target, TreeDrafter(draft, tree), TreeSampler(get_sampler("exact", temperature=1.0)),
                               gamma=tree.n_nodes, device="cpu", eos_token_ids=[], pad_token_id=0, char_lengths=chars)
    res = engine.generate(enc.input_ids, enc.attention_mask, 16, torch.Generator().manual_seed(2))
    for tokens, origins, stats in zip(res.tokens, res.origins, res.row_stats):
        assert stats["accepted_chars"] == sum(int(chars[t]) for t, o in zip(tokens, origins) if o == ACCEPTED)
        assert stats["drafted_chars"] > 0
    assert any(o == ACCEPTED for row in res.origins for o in row)


def test_a_grid_lists_trees_with_slashes_and_chain_for_none(tmp_path):
    from pipeline.commands.run import expand_grid

    values = {"sampler": "exact", "backend": "torch", "gamma": "3", "dtype": "float32", "drafter": "model",
              "draft_tree": "chain/2,2,1/3,1,1", "out": str(tmp_path / "r-{draft_tree}.json")}
    points = expand_grid(values)
    assert [p["draft_tree"] for p in points] == [None, "2,2,1", "3,1,1"]
    assert [p["out"] for p in points] == [str(tmp_path / f"r-{t}.json") for t in ("None", "2,2,1", "3,1,1")]
    assert [p["draft_tree"] for p in expand_grid({**values, "draft_tree": None})] == [None]
    with pytest.raises(SpecsweepError, match=r"must name \{draft_tree\}"):
        expand_grid({**values, "out": "r.json"})


def test_the_search_space_searches_tree_shapes_and_prunes_rules_that_cannot_verify_them(tmp_path):
    import optuna

    from pipeline.tuning.space import SearchSpace

    path = tmp_path / "space.yaml"
    path.write_text("gamma: {low: 1, high: 4}\nsampler: [exact, sigmoid]\ndraft: [fixed, heuristic]\n"
                    "draft_tree: [chain, '2,2,1', '3,1,1']\n")
    space = SearchSpace.load(path)
    assert space.first_point()["draft_tree"] == "chain" and space.recorded()["trees"] == ["chain", "2,2,1", "3,1,1"]
    fixed = {"gamma": 2, "dtype": "float32", "draft": "heuristic", "gamma_max": 4}
    tree = space.suggest(optuna.trial.FixedTrial({**fixed, "sampler": "exact", "draft_tree": "2,2,1"}))
    assert tree["draft_tree"] == "2,2,1" and "draft_schedule" not in tree
    config = RunConfig.from_dict({"target": "t", "draft": "d", "data": str(path), **tree}).validate_decoding()
    assert config.gamma == 10
    chain = space.suggest(optuna.trial.FixedTrial({**fixed, "sampler": "exact", "draft_tree": "chain"}))
    assert "draft_tree" not in chain and chain["draft_schedule"] == "heuristic"
    with pytest.raises(optuna.TrialPruned):
        space.suggest(optuna.trial.FixedTrial({**fixed, "sampler": "sigmoid", "alpha": 1.0, "beta": 0.0,
                                               "draft_tree": "3,1,1"}))
    assert "trees" not in SearchSpace().recorded()             # a study made before trees continues
    for bad, words in (("draft_tree: ['2,0']\n", "widths must be >= 1"),
                       ("sampler: [sigmoid]\ndraft_tree: ['2,2']\n", "draft_tree needs a rule")):
        path.write_text("gamma: {low: 1, high: 4}\n" + bad)
        with pytest.raises(SpecsweepError, match=words):
            SearchSpace.load(path)


def test_the_report_sets_each_tree_beside_the_chains_of_its_cost_and_depth(tmp_path):
    from test_schedule import fake_result

    from pipeline.analysis.build import build_report
    from pipeline.results_table import load_runs

    runs = tmp_path / "runs"

    def run(name: str, gamma: int, tree: str | None, tokens: float, ratios: list[float]):
        path = fake_result(runs / f"{name}.json", gamma=gamma, ratios=ratios)
        result = json.loads(path.read_text())
        result["config"]["draft_tree"] = tree
        result["metrics"]["mean_accepted_tokens"] = tokens
        path.write_text(json.dumps(result))

    run("tree-221", 10, "2,2,1", 3.55, [1.5, 1.52, 1.51, 1.5, 1.53, 1.52])
    run("chain-3", 3, None, 3.45, [1.8, 1.85, 1.84, 1.82, 1.86, 1.85])
    run("chain-10", 10, None, 4.64, [1.6, 1.62, 1.61, 1.63, 1.62, 1.6])
    run("chain-4", 4, None, 3.9, [1.9, 1.9, 1.91, 1.92, 1.9, 1.89])
    report = (tmp_path / "report").resolve()
    build_report(load_runs(runs), report)
    text = (report / "report.md").read_text()
    section = text[text.index("## Token trees"):]
    section = section[: section.index("\n## ", 4)] if "\n## " in section[4:] else section
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines[1].startswith("| tree 2,2,1 | 10 | 3 | 3.55 |")
    assert lines[2].startswith("| chain (as many tokens scored) | 10 | 10 | 4.64 |")
    assert lines[3].startswith("| chain (the tree's depth) | 3 | 3 | 3.45 |")
    assert len(lines) == 4 and "chain-4" not in section          # the header, the tree and its two chains


def test_a_step_with_fewer_uniforms_than_nodes_proposes_the_top_k(pairs):
    """Near the end of a row the step draws fewer uniforms than the tree has nodes (for the batch, or for one row with
    per-row generators, whose later columns are zeros): sampled children would not follow the draft there, so the
    tree's children are the draft's top-k, a deterministic draft the verify step treats exactly."""
    from pipeline.decoding.drafters.base import DraftAsk, DraftPrompt, DraftSetup
    from pipeline.decoding.timing import PhaseTimer

    target, draft, tok = pairs("gpt2")
    tree = TokenTree.from_widths((2, 2))
    drafter = TreeDrafter(draft, tree)
    drafter.bind(DraftSetup(torch.device("cpu"), tree.n_nodes, 1.0, 1.0, "causal", None, 0, False, True,
                            target.config.vocab_size))
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    prompt = DraftPrompt(enc.input_ids, enc.attention_mask.bool(), True, None, {}, None, 64, 8, PhaseTimer("cpu"))
    u = torch.rand(2, tree.n_nodes, generator=torch.Generator().manual_seed(0))
    for ask, sampled in ((DraftAsk(6, u, True), True), (DraftAsk(6, u, True, None, [6, 4]), False),
                         (DraftAsk(4, u[:, :4], True), False)):
        drafter.start(prompt)
        root = drafter.carry.clone()                                  # the draft's logits at the root [2, V]
        proposal = drafter.propose(ask)
        assert proposal.tree == tree and proposal.width == tree.n_nodes
        assert (proposal.logits is not None) is sampled
        if not sampled:
            assert torch.equal(proposal.tokens[:, :2], root.topk(2, dim=-1).indices)


def test_per_row_generators_near_the_end_keep_the_target_distribution(pairs):
    """Per-row generators and little room: a 2,2 tree (6 nodes) with 4 tokens to go draws uniforms for 3 positions
    per row, so its children are the top-k; the first two tokens still follow the target (chi-square)."""
    from pipeline.rng import RowGenerators

    target, draft, tok = pairs("gpt2")
    n = 4000
    enc = tok([PROMPTS[1]] * n, return_tensors="pt", padding=True)
    engine = tree_engine(target, draft, (2, 2), 1.0, eos=())
    res = engine.generate(enc.input_ids, enc.attention_mask, 4, RowGenerators(5, range(n), "cpu"))
    out = np.array([row[:2] for row in res.tokens])
    V = target.config.vocab_size
    p1, p2 = first_two_laws(target, enc.input_ids[:1])
    assert_fits(counts(out[:, 0], V), p1, "tree first token, per-row generators")
    assert_fits(counts(out[:, 1], V), p2, "tree second token, per-row generators")
    assert 0 < sum(s["accepted"] for s in res.row_stats)
