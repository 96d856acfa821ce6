"""Stop strings (OpenAI's ``stop``): where a completion's text ends, and how much of a growing text a stream may show.

A completion ends at the first occurrence of any of its stop strings, which is not part of the text. The decoder
(pipeline/serving/decoder.py) keeps the fewest tokens whose text holds the stop string (:func:`tokens_to_stop`) and
ends the row there; the answer shows the text before it (:func:`cut`). A stream shows a growing text, and must
not show the start of a stop string that the next tokens may complete: :func:`shown` holds back the longest end
of the text that begins a stop string, so a stop string split across verify steps never leaks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string in ``text`` begins (None: none occurs)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def cut(text: str, stops: Sequence[str]) -> str:
    """``text`` up to its first stop string (all of it where none occurs)."""
    at = first_stop(text, stops)
    return text if at is None else text[:at]


def held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that begin some stop string (a stop string may be on its way)."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest


def shown(text: str, stops: Sequence[str], final: bool) -> str:
    """What a stream may show of ``text`` so far: cut at a stop string; while more may come (not ``final``), also
    without an end that begins a stop string."""
    if not stops:
        return text
    at = first_stop(text, stops)
    if at is not None:
        return text[:at]
    return text if final else text[: len(text) - held_back(text, stops)]


def tokens_to_stop(tokens: list[int], before: int, stops: Sequence[str],
                   decode: Callable[[list[int]], str]) -> int | None:
    """The fewest of ``tokens`` whose text holds a stop string, given that the first ``before`` tokens' text held
    none (None: the text of all of them holds none)."""
    if first_stop(decode(tokens), stops) is None:
        return None
    for k in range(before + 1, len(tokens)):
        if first_stop(decode(tokens[:k]), stops) is not None:
            return k
    return len(tokens)
