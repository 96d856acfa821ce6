"""Token origins: the engine's per-token origins against what each verify step accepted and emitted (B = 1 and
ragged batches, several samplers, γ = 0), token strings and classes, acceptance by class, rendering on a terminal
and a pipe, `specsweep run -v`, `specsweep show`, the W&B column and the report's section (CPU, tiny models)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import sys
import threading

import pytest
import torch
from tiny_models import PROMPTS, build_tokenizer, load_saved_pair, save_pair, write_prompts

from pipeline import origins as prov
from pipeline.cli import main
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.samplers import get_sampler

A, C, B, T = prov.ACCEPTED, prov.CORRECTED, prov.BONUS, prov.TARGET
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load_saved_pair(tmp_path_factory.mktemp("prov"), noise=0.2)


def _recording(engine):
    """Wrap the engine's sampler: every verify step's (γ, accepted [b], tokens [b, γ+1]) as host lists."""
    inner, calls = engine.sampler, []

    def sampler(draft_tokens, draft_logits, target_logits, generator=None):
        res = inner(draft_tokens, draft_logits, target_logits, generator=generator)
        calls.append((draft_tokens.shape[1], res.accepted.tolist(), res.tokens.tolist()))
        return res

    engine.sampler = sampler
    return calls


def _check_against_steps(res, calls, eos: int | None, max_new: int) -> int:
    """Every row's tokens, step by step, against what the sampler returned in that step: the accepted draft tokens
    (A), then one corrected (C), bonus (B) or target-alone (T) token; only a row's last step may stop early, and then
    at EOS or max_new_tokens. Returns how many steps were cut."""
    rows = len(res.tokens)
    last_step = [max(steps) for steps in res.origin_steps]
    cut = 0
    for r in range(rows):
        tokens, origins, steps = res.tokens[r], res.origins[r], res.origin_steps[r]
        assert len(origins) == len(steps) == len(tokens)
        assert prov.run_lengths(steps) == prov.steps_from_origins(origins)          # recorded steps = implied ones
        assert prov.well_formed(origins, prov.run_lengths(steps))
        assert sorted(set(steps)) == list(range(1, last_step[r] + 1)) and sorted(steps) == steps
        assert last_step[r] == res.row_stats[r]["verify_steps"]
        assert origins.count(A) <= res.row_stats[r]["accepted"]
        for s in range(1, last_step[r] + 1):
            gamma, accepted, step_tokens = calls[s - 1]
            active = [q for q in range(rows) if last_step[q] >= s]              # rows still decoding, in order
            i = active.index(r)
            k = accepted[i]
            full_origins = [A] * k + [T if gamma == 0 else B if k == gamma else C]
            got = [j for j, st in enumerate(steps) if st == s]
            assert [tokens[j] for j in got] == step_tokens[i][: len(got)]
            assert [origins[j] for j in got] == full_origins[: len(got)]
            if len(got) < k + 1:                                                 # cut: the row's last step only
                cut += 1
                assert s == last_step[r] and (tokens[-1] == eos or len(tokens) == max_new)
            else:
                assert len(got) == k + 1
    return cut


@pytest.mark.parametrize("sampler,temperature,gamma", [("exact", 1.0, 3), ("greedy", 0.0, 4), ("exact", 1.0, 0),
                                                       ("sigmoid", 0.8, 2)])
@pytest.mark.parametrize("batch", [1, len(PROMPTS)])
def test_origins_follow_each_verify_step(pair, sampler, temperature, gamma, batch):
    target, draft, tok = pair
    engine = SpeculativeEngine(target, draft if gamma else None, get_sampler(sampler, temperature=temperature),
                               gamma=gamma, device="cpu", eos_token_ids=[], pad_token_id=0)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    free = engine.generate(enc.input_ids, enc.attention_mask, 10, torch.Generator().manual_seed(0)).tokens
    eos = free[1][4]                                       # a token one row reaches mid-way: rows end at EOS too
    engine = SpeculativeEngine(target, draft if gamma else None, get_sampler(sampler, temperature=temperature),
                               gamma=gamma, device="cpu", eos_token_ids=[eos], pad_token_id=0)
    calls = _recording(engine)
    enc = tok(PROMPTS[:batch], return_tensors="pt", padding=True)
    res = engine.generate(enc.input_ids, enc.attention_mask, 10, torch.Generator().manual_seed(0))
    assert len(calls) == res.verify_steps
    _check_against_steps(res, calls, eos, 10)
    every = [o for row in res.origins for o in row]
    if gamma == 0:
        assert set(every) == {T}
    else:
        assert A in every and (C in every or B in every)
        if batch > 1:  # ragged: rows accepted different numbers of tokens in one step
            assert any(len(set(acc)) > 1 for _, acc, _ in calls) and C in every


def test_a_draft_equal_to_the_target_gets_only_accepted_and_bonus_tokens(pair):
    """Greedy verification of a draft identical to the target accepts every draft token: each full step is γ
    accepted draft tokens and a bonus token."""
    import copy

    target, _, tok = pair
    engine = SpeculativeEngine(target, copy.deepcopy(target), get_sampler("greedy", temperature=0.0), gamma=3,
                               device="cpu", eos_token_ids=[], pad_token_id=0)
    calls = _recording(engine)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    res = engine.generate(enc.input_ids, enc.attention_mask, 10)
    _check_against_steps(res, calls, None, 10)
    # 8 tokens in two full steps; two more fit, so the last step offers γ = 1 draft token: accepted, then a bonus
    assert [prov.encode_origins(o) for o in res.origins] == ["AAABAAABAB"] * len(PROMPTS)
    assert [c[0] for c in calls] == [3, 3, 1]


def test_a_step_cut_by_eos_ends_a_row_on_an_accepted_draft_token(pair):
    """EOS among a step's accepted draft tokens ends the row there: the step's tokens are accepted draft tokens
    only, with no corrected or bonus token after them (a draft identical to the target accepts everything)."""
    import copy

    target, _, tok = pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    same = copy.deepcopy(target)
    free = SpeculativeEngine(target, same, get_sampler("greedy", temperature=0.0), gamma=3, device="cpu",
                             eos_token_ids=[], pad_token_id=0).generate(
        enc.input_ids, enc.attention_mask, 10).tokens
    eos = free[0][1]                                   # row 0's second token: an accepted draft token of step 1
    engine = SpeculativeEngine(target, same, get_sampler("greedy", temperature=0.0), gamma=3, device="cpu",
                               eos_token_ids=[eos], pad_token_id=0)
    calls = _recording(engine)
    res = engine.generate(enc.input_ids, enc.attention_mask, 10)
    assert _check_against_steps(res, calls, eos, 10) >= 1
    assert res.tokens[0] == free[0][:2] and res.origins[0] == [A, A] and res.row_stats[0]["accepted"] == 3


def test_origin_codes_round_trip_and_step_lengths():
    assert prov.encode_origins([A, A, C, B, T]) == "AACBT"
    assert prov.decode_origins("AACBT") == [A, A, C, B, T]
    with pytest.raises(ValueError, match="letters must be among"):
        prov.decode_origins("AX")
    assert prov.run_lengths([1, 1, 2, 4, 4, 4]) == [2, 1, 3]
    assert prov.steps_from_origins([A, A, C, B, A, C, A, A]) == [3, 1, 2, 2]   # a trailing cut step of 2
    assert prov.well_formed([A, C, A, A, B], [2, 3])
    assert not prov.well_formed([A, C, A, A, B], [3, 2])
    # the engine's lookup: row k = a step that accepted k of γ draft tokens
    assert prov.origin_table(2, torch.device("cpu")).tolist() == [[C, -1, -1], [A, C, -1], [A, A, B]]
    assert prov.origin_table(0, torch.device("cpu")).tolist() == [[T]]


def test_token_pieces_keep_spaces_and_multibyte_characters():
    word = build_tokenizer()
    ids = word("the storm was in the city").input_ids
    pieces = prov.token_pieces(word, ids)
    assert pieces == ["the", " storm", " was", " in", " the", " city"]
    assert "".join(pieces) == word.decode(ids)

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_level = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=byte_level)
    ids = tok("a é1").input_ids                                     # é is two bytes, so two tokens
    pieces = prov.token_pieces(tok, ids)
    assert len(pieces) == len(ids) == 5 and "".join(pieces) == "a é1"
    assert pieces == ["a", " ", "", "é", "1"]                       # the first byte of é adds no text yet


@pytest.mark.parametrize("piece,previous,special,expected", [
    (",", " the", False, "punctuation"), (" (", "x", False, "punctuation"), ("...", "x", False, "punctuation"),
    (" 42", " is", False, "digit"), ("7", "1", False, "digit"),
    (" storm", "the", False, "word start"), ("The", None, False, "word start"), ("city", "the\n", False, "word start"),
    ("ing", " runn", False, "continuation"), ("\n", "x", False, "other"), ("<eos>", " x", True, "other"),
    ("x2", " a", False, "continuation"), (" ", "a", False, "other"),
])
def test_token_classes_from_the_tokenizers_strings(piece, previous, special, expected):
    assert prov.token_class(piece, previous, special) == expected


def test_acceptance_by_class_counts_only_positions_with_a_draft_on_offer():
    pieces = ["The", " storm", ",", " 42", " cars", " burn", "ed", "."]
    origins = [A, C, A, B, A, C, A, T]              # B and T tokens are not counted
    classes = prov.token_classes(pieces)
    assert classes == ["word start", "word start", "punctuation", "digit", "word start", "word start",
                       "continuation", "punctuation"]
    counts = prov.class_counts(classes, origins)
    assert counts["token"]["word start"] == {"offered": 4, "accepted": 2}       # The, storm, cars, burn
    assert counts["token"]["punctuation"] == {"offered": 1, "accepted": 1}      # ","; the final "." is T
    assert counts["token"]["digit"] == {"offered": 0, "accepted": 0}            # " 42" is a bonus token
    assert counts["previous"]["start"] == {"offered": 1, "accepted": 1}
    assert counts["previous"]["punctuation"] == {"offered": 0, "accepted": 0}   # after "," came the bonus " 42"
    assert counts["previous"]["digit"] == {"offered": 1, "accepted": 1}         # " cars" after " 42"
    assert counts["previous"]["word start"] == {"offered": 4, "accepted": 2}    # storm, ",", burn, ed
    merged = prov.merge_counts(prov.empty_counts(), counts)
    prov.merge_counts(merged, counts)
    assert merged["token"]["word start"] == {"offered": 8, "accepted": 4}
    rates = {r["class"]: r for r in prov.class_rates(merged)}
    assert rates["word start"]["rate"] == 0.5 and rates["digit"]["rate"] is None
    assert rates["start"]["rate"] is None and rates["start"]["rate_after"] == 1.0


def test_rendering_plain_terminal_and_html():
    pieces, origins = ["The", " storm", " hit", " <b>", " city"], [A, C, A, B, T]
    assert prov.render_plain(pieces, origins) == "The [storm] hit {<b>} <city>"
    html = prov.render_html(pieces, origins, [2, 3])
    assert html.count("<span") == 5 and "&lt;b&gt;" in html and "<b>" not in html
    assert 'title="target&#x27;s correction after a rejection, step 1"' in html
    assert "bonus token after a full acceptance, step 2" in html
    sample = {"id": "s1", "token_ids": [1, 2, 3, 4, 5], "origins": "ACABT", "new_tokens": 5, "verify_steps": 2,
              "accepted": 2, "drafted": 4, "acceptance_rate": 0.5, "mean_accepted_tokens": 2.5}
    for terminal in (True, False):
        out = io.StringIO()
        prov.print_samples([sample], lambda ids: pieces, file=out, terminal=terminal)
        text = out.getvalue()
        assert "s1: 5 tokens in 2 steps, acceptance 0.50 (2 of 4 drafted), 2.50 tokens/step" in ANSI.sub("", text)
        assert bool(ANSI.search(text)) == terminal
        if terminal:
            assert "accepted draft token" in text and "[storm]" not in text
        else:
            assert text.startswith("legend: text = accepted draft token") and "The [storm] hit" in text


# ---------------------------------------------------------------------------------------------- the CLI

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny pair, prompts, and a fake machine peak (a CPU probe takes about a second and depends on the machine)."""
    root = tmp_path_factory.mktemp("prov_cli")
    tp, dp = save_pair(root, noise=0.2)
    data = write_prompts(root / "prompts.jsonl")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECSWEEP_CACHE_DIR", str(root / "cache"))
        mp.setattr("pipeline.roofline.probe_in_child", lambda dtype_name, threads, timeout_s=120: {
            "flops_per_s": 1e10, "bytes_per_s": 1e9, "matmul_n": 0})
        yield root, tp, dp, data


def _run_args(tp, dp, data, out, *extra):
    return ["run", "--target", str(tp), "--draft", str(dp), "--data", str(data), "--device", "cpu",
            "--max-new-tokens", "12", "--gamma", "3", "--repeats", "3", "--samples-per-repeat", "1", "--no-progress",
            "--wandb-mode", "disabled", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def piped_run(tiny_run):
    """`specsweep run -v` with stdout a pipe (not a terminal): (results path, what it printed)."""
    root, tp, dp, data = tiny_run
    out, printed = root / "piped.json", io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(_run_args(tp, dp, data, out, "-v")) == 0
    return out, printed.getvalue()


def test_run_verbose_on_a_pipe_prints_plain_markers_and_a_legend(piped_run):
    path, printed = piped_run
    result = json.loads(path.read_text())
    assert not ANSI.search(printed)
    assert printed.startswith(prov.legend_plain())
    for s in result["samples"]:
        assert prov.summary_line(s) in printed
        assert len(s["origins"]) == len(s["token_ids"]) and sum(s["origin_steps"]) == s["new_tokens"]
        assert len(s["origin_steps"]) == s["verify_steps"]
        assert prov.well_formed(prov.decode_origins(s["origins"]), s["origin_steps"])
    assert re.search(r"\[\w+\]", printed) and re.search(r"\{\w+\}", printed)      # corrections and bonus tokens
    counts = result["metrics"]["token_class_acceptance"]
    letters = "".join(s["origins"] for s in result["samples"])
    assert sum(c["offered"] for c in counts["token"].values()) == letters.count("A") + letters.count("C")
    assert sum(c["accepted"] for c in counts["token"].values()) == letters.count("A")
    roof = result["metrics"]["roofline"]
    assert roof["peak"]["flops_per_s"] == 1e10 and set(roof["phases"]) == {"draft", "target", "verify"}
    assert roof["bounding_phase"] == max(roof["phases"], key=lambda p: roof["phases"][p]["time_s"])


def test_run_verbose_on_a_terminal_prints_colours(tiny_run, monkeypatch):
    """stdout a pseudo-terminal: rich colours each token (ANSI codes), no plain markers."""
    import pty

    root, tp, dp, data = tiny_run
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain():  # the pty's buffer is small: read while the run writes
        while True:
            ready, _, _ = select.select([master], [], [], 5)
            if not ready:
                return
            try:
                data_ = os.read(master, 65536)
            except OSError:
                return
            if not data_:
                return
            chunks.append(data_)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    with os.fdopen(slave, "w", encoding="utf-8", buffering=1) as terminal:
        monkeypatch.setattr(sys, "stdout", terminal)
        assert main(_run_args(tp, dp, data, root / "tty.json", "-v")) == 0
        terminal.flush()
        monkeypatch.undo()
    reader.join(timeout=10)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    plain = ANSI.sub("", text)
    assert ANSI.search(text), text[:200]
    assert "legend: accepted draft token" in plain
    result = json.loads((root / "tty.json").read_text())
    for s in result["samples"]:
        assert prov.summary_line(s) in plain.replace("\r\n", "\n")
    assert not re.search(r"\[\w+\]", plain)


def test_show_prints_a_results_file_and_one_sample(piped_run, capsys):
    path, printed = piped_run
    result = json.loads(path.read_text())
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("\n".join(printed.splitlines()[:-2]))   # the samples as `run -v` printed them
    assert "acceptance by token class" in out and "the " in out and "phase bounds the speedup" in out
    assert main(["show", str(path), "--id", "p2"]) == 0
    one = capsys.readouterr().out
    sample = next(s for s in result["samples"] if s["id"] == "p2")
    assert prov.summary_line(sample) in one and "p1:" not in one and "roofline" not in one


def test_show_refuses_a_missing_id_and_a_file_that_is_not_a_result(piped_run, capsys, tmp_path):
    path, _ = piped_run
    assert main(["show", str(path), "--id", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no sample with id 'nope'" in err and "p0, p1" in err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"benchmark": "engine"}))
    assert main(["show", str(other)]) == 2
    assert "not a specsweep results file" in capsys.readouterr().err


def test_show_copes_with_samples_without_origins(piped_run, capsys, tmp_path):
    """`--engine hf` records no origins: show prints the text and says so."""
    path, _ = piped_run
    result = json.loads(path.read_text())
    for s in result["samples"]:
        s.pop("origins"), s.pop("origin_steps")
    result["metrics"].pop("token_class_acceptance")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(result))
    assert main(["show", str(bare), "--id", "p0"]) == 0
    out = capsys.readouterr().out
    assert "no token origins recorded" in out and result["samples"][0]["text"] in out


def test_wandb_samples_table_has_the_coloured_output(piped_run):
    import wandb

    from pipeline.tracking import samples_table

    path, _ = piped_run
    result = json.loads(path.read_text())
    table = samples_table(result)
    column = table.columns.index("token_origins")
    cells = [row[column] for row in table.data]
    assert all(isinstance(c, wandb.Html) for c in cells)
    assert all(c.html.count("<span") == len(s["token_ids"]) + 4 for c, s in zip(cells, result["samples"]))
    result["samples"][0].pop("origins")
    assert samples_table(result).data[0][column] is None


def test_the_reports_section_shows_samples_classes_and_the_roofline(piped_run, tmp_path):
    from pipeline.analysis.build import build_report
    from pipeline.analysis.tables import load_all
    from pipeline.results_table import load_runs

    path, _ = piped_run
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a.json").write_text(path.read_text())
    written = build_report(load_all(load_runs(runs)), tmp_path / "reports")
    assert "roofline.png" in written and written["roofline.png"].is_file()
    html = written["report.html"].read_text()
    md = written["report.md"].read_text()
    section = md[md.index("## Where the draft fails"):]
    assert "accepted draft token" in section and "| word start |" in section and "bounds the speedup" in section
    assert "where a draft token was on offer" in section
    assert html.count('<span style="background:#f7c6c6"') >= 1          # corrected tokens, coloured
