"""Token origins: which model produced each emitted token, where the draft fails, and how to show it.

Every token the engine emits has an **origin** (pipeline/decoding/engine.py records it on the device, at no extra host
sync) and the verify **step** it came from:

  code  letter  origin
  0     A       an accepted draft token
  1     C       the target's corrected token after a rejection (the draft's token was on offer and refused)
  2     B       the bonus token after every draft token of the step was accepted
  3     T       a target token with no draft on offer (γ = 0, or a last step shortened to γ = 0)

Every step emits its accepted draft tokens, then exactly one C, B or T token; only a row's last step may stop
early, cut by EOS or max_new_tokens. A results file stores the origins of a sample as one letter per token
(``origins``, aligned with ``token_ids``) and its steps as run lengths (``origin_steps``: tokens per step, in
order). The key is ``origins``, never ``provenance``: a results file's ``provenance`` is where it was measured.

**Acceptance by token class** (what a better draft must learn): over the emitted tokens at positions where a
draft token was on offer (A or C; B and T tokens are excluded), the share that were accepted draft tokens,
grouped by the class of the emitted token and by the class of the token before it. Classes come from the
tokenizer's decoded strings (:func:`token_pieces`, in context, so SentencePiece's and byte-level BPE's leading
spaces survive): punctuation, digit, word start (a leading space, or the beginning of the output, or after
whitespace), continuation (letters inside a word) and other (whitespace, special tokens, mixed strings).

Rendering: :func:`render_rich` (a terminal: rich colours), :func:`render_plain` (a pipe or a file: markers
around what the target produced), :func:`render_html` (the report and W&B), each with its legend.
"""

from __future__ import annotations

import functools
import html
import sys
import unicodedata
from collections.abc import Callable, Iterable

from pipeline.errors import SpecsweepError
from pipeline.models import load_tokenizer

ACCEPTED, CORRECTED, BONUS, TARGET = 0, 1, 2, 3
N_ORIGINS = 4                       # the engine packs (step, origin) as step * N_ORIGINS + origin
LETTERS = "ACBT"                    # code -> letter in results files
NAMES = {ACCEPTED: "accepted draft token", CORRECTED: "target's correction after a rejection",
         BONUS: "bonus token after a full acceptance", TARGET: "target token, no draft on offer"}
# terminal styles (rich), HTML background colours, plain-text markers around the token's text
STYLES = {ACCEPTED: "green", CORRECTED: "bold red", BONUS: "bold cyan", TARGET: "yellow"}
COLOURS = {ACCEPTED: "#c8efc8", CORRECTED: "#f7c6c6", BONUS: "#c6dcf7", TARGET: "#f1e6b8"}
MARKERS = {ACCEPTED: ("", ""), CORRECTED: ("[", "]"), BONUS: ("{", "}"), TARGET: ("<", ">")}

CLASSES = ("punctuation", "digit", "word start", "continuation", "other")
START = "start"                     # the "previous class" of an output's first token


# ---------------------------------------------------------------------------------------------- storage

def encode_origins(codes: Iterable[int]) -> str:
    """Origin codes -> one letter per token ("AACAB...")."""
    return "".join(LETTERS[c] for c in codes)


def decode_origins(letters: str) -> list[int]:
    """One letter per token -> origin codes; a bad letter is a ValueError."""
    try:
        return [LETTERS.index(ch) for ch in letters]
    except ValueError:
        raise ValueError(f"origins {letters!r}: letters must be among {LETTERS}") from None


def run_lengths(steps: Iterable[int]) -> list[int]:
    """Per-token step numbers (non-decreasing) -> tokens per step, in order: [1, 1, 2, 4, 4] -> [2, 1, 2]."""
    out: list[int] = []
    last = None
    for s in steps:
        if s == last:
            out[-1] += 1
        else:
            out.append(1)
            last = s
    return out


def steps_from_origins(origins: Iterable[int]) -> list[int]:
    """Tokens per step as the origins imply them: a step ends after each C, B or T token (a trailing run of A
    tokens is a last step cut by EOS or max_new_tokens)."""
    out, n = [], 0
    for code in origins:
        n += 1
        if code != ACCEPTED:
            out.append(n)
            n = 0
    if n:
        out.append(n)
    return out


@functools.lru_cache(maxsize=64)
def origin_table(gamma: int, device):
    """int64 [γ+1, γ+1] on ``device``: row k is the origins of a step that accepted k of γ draft tokens, position j:
    A for j < k, then C (k < γ), B (k = γ > 0) or T (γ = 0) at j = k, -1 after. Built once per (γ, device), so the
    engine's step looks its origins up with one index instead of computing them. Built on the device (no copy
    from the host)."""
    import torch

    k = torch.arange(gamma + 1, device=device)[:, None]                      # accepted
    j = torch.arange(gamma + 1, device=device)[None, :]                      # position in the step
    last = torch.full_like(k, TARGET) if gamma == 0 else torch.where(k == gamma, BONUS, CORRECTED)
    return torch.where(j < k, ACCEPTED, torch.where(j == k, last, -1))


def well_formed(origins: list[int], step_lengths: list[int] | None = None) -> bool:
    """True when every step is A...A then one C, B or T (only the last step may lack its final token) and, when
    given, ``step_lengths`` splits the tokens that way."""
    implied = steps_from_origins(origins)
    if step_lengths is not None and list(step_lengths) != implied:
        return False
    return sum(implied) == len(origins)


# ---------------------------------------------------------------------------------------------- token strings

def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """The text each token adds to the decoded output, in context: ``"".join(pieces)`` is the decoded text (special
    tokens included). Decoded incrementally as streaming detokenizers do (a piece is the text that decoding one
    more token adds after the previous token), so SentencePiece's word-start spaces are kept; a token that ends
    inside a multi-byte character gets "" and the character goes to the token that completes it."""
    def decode(part):
        return tokenizer.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    pieces: list[str] = []
    prefix, read = 0, 0                     # context start; tokens whose text is out
    for i in range(len(ids)):
        before = decode(ids[prefix:read])
        text = decode(ids[prefix:i + 1])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            pieces += [""] * (i - read) + [text[len(before):]]
            prefix, read = read, i + 1
    if read < len(ids):                      # an unfinished character at the end: its bytes as they decode
        rest = decode(ids[prefix:])[len(decode(ids[prefix:read])):]
        pieces += [""] * (len(ids) - read - 1) + [rest]
    return pieces


def token_class(piece: str, previous: str | None, special: bool = False) -> str:
    """The class of a token from its text (see the module docstring); ``previous`` is the text before it (None:
    the output's first token)."""
    body = piece.strip()
    if special or not body:
        return "other"
    if all(unicodedata.category(ch)[0] in "PS" for ch in body):
        return "punctuation"
    if body.isdigit():
        return "digit"
    if piece[0].isspace() or previous is None or (previous and previous[-1].isspace()):
        return "word start"
    if any(ch.isalpha() for ch in body):
        return "continuation"
    return "other"


def token_classes(pieces: list[str], special: list[bool] | None = None) -> list[str]:
    """The class of each token of one output."""
    special = special or [False] * len(pieces)
    return [token_class(p, pieces[i - 1] if i else None, special[i]) for i, p in enumerate(pieces)]


# ---------------------------------------------------------------------------------------------- acceptance by class

def empty_counts() -> dict:
    """{"token": {class: {offered, accepted}}, "previous": {class or "start": {offered, accepted}}}."""
    return {"token": {c: {"offered": 0, "accepted": 0} for c in CLASSES},
            "previous": {c: {"offered": 0, "accepted": 0} for c in (START, *CLASSES)}}


def class_counts(classes: list[str], origins: list[int], counts: dict | None = None) -> dict:
    """Add one output's tokens to ``counts`` (a new :func:`empty_counts` when None): each position where a draft
    token was on offer (A or C) counts as offered, and as accepted when it is A, under the class of the emitted
    token and under the class of the token before it."""
    counts = counts if counts is not None else empty_counts()
    for i, (cls, origin) in enumerate(zip(classes, origins)):
        if origin not in (ACCEPTED, CORRECTED):
            continue
        hit = int(origin == ACCEPTED)
        for key, name in (("token", cls), ("previous", classes[i - 1] if i else START)):
            slot = counts[key].setdefault(name, {"offered": 0, "accepted": 0})
            slot["offered"] += 1
            slot["accepted"] += hit
    return counts


def merge_counts(into: dict, other: dict | None) -> dict:
    """Add ``other``'s counts to ``into`` (both as :func:`empty_counts` makes them); returns ``into``."""
    for key, by_class in (other or {}).items():
        for name, slot in by_class.items():
            mine = into.setdefault(key, {}).setdefault(name, {"offered": 0, "accepted": 0})
            mine["offered"] += slot["offered"]
            mine["accepted"] += slot["accepted"]
    return into


def class_rates(counts: dict | None) -> list[dict]:
    """One row per class: {class, offered, accepted, rate, offered_after, accepted_after, rate_after}; rates are
    None where nothing was on offer."""
    counts = counts or {}
    rows = []
    for name in (START, *CLASSES):
        own = counts.get("token", {}).get(name)
        after = counts.get("previous", {}).get(name, {"offered": 0, "accepted": 0})
        row = {"class": name, "offered": own["offered"] if own else None, "accepted": own["accepted"] if own else None,
               "rate": _rate(own), "offered_after": after["offered"], "accepted_after": after["accepted"],
               "rate_after": _rate(after)}
        rows.append(row)
    return rows


def _rate(slot: dict | None) -> float | None:
    return slot["accepted"] / slot["offered"] if slot and slot["offered"] else None


# ---------------------------------------------------------------------------------------------- tokenizers

@functools.lru_cache(maxsize=8)
def _tokenizer(name: str):

    return load_tokenizer(name)


def pieces_for(config: dict) -> tuple[Callable[[list[int]], list[str]], str | None]:
    """(ids -> pieces, note): the target's tokenizer named in a results file's ``config``, loaded once per process;
    when it cannot be loaded (a model that is not here), token ids in angle brackets and a note saying so."""

    name = (config or {}).get("target")
    try:
        tok = _tokenizer(str(name))
    except (SpecsweepError, OSError, ValueError) as e:
        note = f"the tokenizer of {name} could not be loaded ({' '.join(str(e).split())[:100]}): token ids shown"
        return (lambda ids: [f"⟨{i}⟩" for i in ids]), note
    return functools.partial(token_pieces, tok), None


# ---------------------------------------------------------------------------------------------- rendering

def sample_origins(sample: dict) -> list[int] | None:
    """A results-file sample's origin codes, or None where the engine recorded none (``--engine hf``, older
    files)."""
    letters = sample.get("origins")
    return decode_origins(letters) if isinstance(letters, str) else None


def summary_line(sample: dict) -> str:
    """'p0: 12 tokens in 5 steps, acceptance 0.62 (10 of 16 drafted), 2.40 tokens/step'."""
    steps = sample.get("verify_steps", "?")
    parts = [f"{sample.get('new_tokens', len(sample.get('token_ids') or []))} tokens in {steps} "
             f"step{'' if steps == 1 else 's'}"]
    if sample.get("acceptance_rate") is not None:
        parts.append(f"acceptance {sample['acceptance_rate']:.2f} ({sample.get('accepted')} of "
                     f"{sample.get('drafted')} drafted)")
    if sample.get("mean_accepted_tokens") is not None:
        parts.append(f"{sample['mean_accepted_tokens']:.2f} tokens/step")
    return f"{sample.get('id')}: " + ", ".join(parts)


def legend_plain() -> str:
    return ("legend: text = accepted draft token, [text] = target's correction after a rejection, {text} = bonus "
            "token after a full acceptance, <text> = target token with no draft on offer")


def render_plain(pieces: list[str], origins: list[int]) -> str:
    """The output with markers around what the target produced (accepted draft tokens bare); leading whitespace
    stays outside the marker."""
    out = []
    for piece, code in zip(pieces, origins):
        left, right = MARKERS[code]
        body = piece.lstrip()
        out.append(piece[: len(piece) - len(body)] + left + body + right)
    return "".join(out)


def render_rich(pieces: list[str], origins: list[int]):
    """A rich Text of the output, each token styled by its origin."""
    from rich.text import Text

    text = Text()
    for piece, code in zip(pieces, origins):
        text.append(piece, style=STYLES[code])
    return text


def legend_rich(codes: Iterable[int] = (ACCEPTED, CORRECTED, BONUS, TARGET)):
    from rich.text import Text

    text = Text("legend: ")
    for i, code in enumerate(codes):
        text.append((", " if i else "") + NAMES[code], style=STYLES[code])
    return text


def render_html(pieces: list[str], origins: list[int], step_lengths: list[int] | None = None) -> str:
    """One <span> per token with its origin's background colour and a tooltip (origin, step); whitespace kept."""
    steps = [s for s, n in enumerate(step_lengths or steps_from_origins(origins), 1) for _ in range(n)]
    spans = []
    for i, (piece, code) in enumerate(zip(pieces, origins)):
        step = f", step {steps[i]}" if i < len(steps) else ""
        spans.append(f'<span style="background:{COLOURS[code]}" title="{html.escape(NAMES[code] + step, True)}">'
                     f"{html.escape(piece)}</span>")
    return ('<div style="white-space:pre-wrap;font-family:ui-monospace,monospace;line-height:1.6">'
            + "".join(spans) + "</div>")


def legend_html() -> str:
    return "legend: " + ", ".join(f'<span style="background:{COLOURS[c]}">{html.escape(NAMES[c])}</span>'
                                  for c in (ACCEPTED, CORRECTED, BONUS, TARGET))


def print_samples(samples: list[dict], pieces: Callable[[list[int]], list[str]], file=None,
                  terminal: bool | None = None, note: str | None = None) -> None:
    """Print each sample's output coloured by origin (a terminal: rich colours) or with plain markers (a pipe or a
    file), after a legend, each under its summary line (acceptance, tokens per step). ``terminal``: None decides
    from ``file`` (default stdout)."""
    from rich.console import Console

    file = file if file is not None else sys.stdout
    console = Console(file=file, force_terminal=terminal, highlight=False, soft_wrap=True, emoji=False)
    colour = console.is_terminal if terminal is None else terminal
    if note:
        console.print(f"note: {note}", markup=False)
    console.print(legend_rich() if colour else legend_plain(), markup=False)
    for s in samples:
        ids = s.get("token_ids") or []
        origins = sample_origins(s)
        console.print(summary_line(s), markup=False, style="bold" if colour else None)
        if origins is None or len(origins) != len(ids):
            console.print("(no token origins recorded: --engine hf or an older results file)", markup=False)
            console.print(s.get("text") or "", markup=False)
            continue
        parts = pieces(ids)
        console.print(render_rich(parts, origins) if colour else render_plain(parts, origins), markup=False)


def class_table_lines(counts: dict | None) -> list[str]:
    """Acceptance by token class as aligned text lines (``specsweep show``); [] without counts."""
    rows = class_rates(counts)
    if not counts or not any(r["offered_after"] for r in rows):
        return []

    def pct(rate):
        return "   -" if rate is None else f"{100 * rate:3.0f} %"

    lines = ["acceptance by token class (positions where a draft token was on offer; share accepted):",
             f"  {'class':<13}{'this token':>18}{'after this token':>24}"]
    for r in rows:
        own = "" if r["class"] == START else f"{pct(r['rate'])} of {r['offered']:<6}"
        lines.append(f"  {r['class']:<13}{own:>18}{pct(r['rate_after']) + ' of ' + str(r['offered_after']):>24}")
    return lines
