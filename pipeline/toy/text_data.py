"""A generated summarisation task with the shape of CNN/DailyMail.

Each example is a short "news article" of 4 to 6 sentences and a one-line reference summary
("highlights"). The first sentence states the key event (who, what, how many, where, when) in one of
one of two word orders; later sentences add a detail about it (an adjective) and distractors: other people,
places, numbers and days. The highlights restate the key facts in a fixed order::

    <first> <last> <verb> <n> <objects> in <city> on <day> . the <job> said they were <adjective> .

so a model must copy the right entities out of the article (a language prior alone cannot guess them:
every slot is drawn uniformly from its vocabulary) while the template words are easy. Records are
``{"id": str, "article": str, "highlights": str}``, the schema :func:`pipeline.data.load_task_data` reads
for ``cnn_dailymail``; the prompt a run builds from them is ``article + " Summary:"`` (see
:mod:`pipeline.tasks.cnn_dailymail`).

Text is lower-case words and the punctuation tokens ``,`` and ``.`` separated by single spaces, so a
word-level tokenizer covers it exactly (:func:`vocabulary`). Generation uses Python's ``random.Random``
(Mersenne Twister) seeded per split, so a seed always gives the same bytes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pipeline.io import write_text_atomic

FIRST = tuple("""anna ben carla david elena frank grace henry irene jack karen leo maria nina oscar paula
quinn rosa sam tina victor wendy xavier yara zoe adam bella chris dora emil""".split())
LAST = tuple("""smith jones brown taylor wilson evans thomas roberts walker wright hall green baker hill
clark lewis young king scott adams nelson carter mitchell turner parker collins morris cook bell ward""".split())
CITIES = tuple("""paris london berlin madrid rome vienna prague dublin oslo lisbon athens warsaw boston denver
austin dallas seattle chicago miami houston toronto sydney tokyo seoul cairo lagos lima quito delhi dubai""".split())
JOBS = tuple("""teacher farmer baker nurse pilot driver doctor chef painter student lawyer engineer
sailor miner tailor""".split())
OBJECTS = tuple("""books bikes boats chairs clocks coins lamps maps pianos rings shoes tables tents toys
trucks violins watches wheels kites phones""".split())
VERBS = tuple("found sold repaired delivered painted collected donated built bought lost".split())
DAYS = tuple("monday tuesday wednesday thursday friday saturday sunday".split())
ADJECTIVES = tuple("""old new rare broken heavy cheap valuable small large strange famous useful red blue
green ancient modern fragile shiny rusty""".split())
NUMBERS = tuple(str(n) for n in range(2, 61))
WEATHER = tuple("rain snow wind fog heat sun".split())

FUNCTION_WORDS = tuple("""a an the in on of from by to was were said they it and who as last year
officials reported police weather local residents later visited works other news according summary
more than also met an this week""".split())
PUNCTUATION = (",", ".", ":")
SUMMARY_WORD = "summary"  # the cue " Summary:" of pipeline.tasks.cnn_dailymail, lower-cased by the tokenizer

TRAIN_EXAMPLES = 6000
TEST_EXAMPLES = 100
QUICK_TRAIN_EXAMPLES = 64
QUICK_TEST_EXAMPLES = 8


def vocabulary() -> list[str]:
    """Every word and punctuation token the generator can write (plus the prompt cue), in a fixed order."""
    words: list[str] = []
    for group in (FUNCTION_WORDS, PUNCTUATION, (SUMMARY_WORD,), FIRST, LAST, CITIES, JOBS, OBJECTS, VERBS, DAYS,
                  ADJECTIVES, NUMBERS, WEATHER):
        for w in group:
            if w not in words:
                words.append(w)
    return words


def _key_sentence(rng: random.Random, f: dict) -> str:
    """The key event in one of two word orders."""
    who = f"{f['first']} {f['last']}"
    forms = (
        f"{who} , a {f['job']} from {f['city']} , {f['verb']} {f['n']} {f['objects']} on {f['day']} .",
        f"{f['city']} {f['job']} {who} {f['verb']} {f['n']} {f['objects']} on {f['day']} , officials said .",
    )
    return rng.choice(forms)


def _distractor(rng: random.Random, f: dict) -> str:
    """A sentence about other entities (never the key city, person or day)."""
    city = rng.choice([c for c in CITIES if c != f["city"]])
    day = rng.choice([d for d in DAYS if d != f["day"]])
    first, last = rng.choice(FIRST), rng.choice([n for n in LAST if n != f["last"]])
    forms = (
        f"{first} {last} , a {rng.choice(JOBS)} , visited {city} on {day} .",
        f"last year {rng.choice(NUMBERS)} {rng.choice(OBJECTS)} were {rng.choice(VERBS)} in {city} .",
        f"the weather in {city} was {rng.choice(WEATHER)} on {day} .",
        f"local residents in {city} reported more than {rng.choice(NUMBERS)} {rng.choice(OBJECTS)} this week .",
        f"{first} {last} met the {rng.choice(JOBS)} from {city} on {day} .",
        f"other news from {city} : {rng.choice(NUMBERS)} {rng.choice(OBJECTS)} were {rng.choice(ADJECTIVES)} .",
    )
    return rng.choice(forms)


def make_example(rng: random.Random, example_id: str) -> dict[str, str]:
    """One record ``{"id", "article", "highlights"}`` drawn from ``rng``."""
    f = {"first": rng.choice(FIRST), "last": rng.choice(LAST), "city": rng.choice(CITIES), "job": rng.choice(JOBS),
         "objects": rng.choice(OBJECTS), "verb": rng.choice(VERBS), "day": rng.choice(DAYS),
         "n": rng.choice(NUMBERS), "adj": rng.choice(ADJECTIVES)}
    detail = rng.choice((f"{f['last']} said the {f['objects']} were {f['adj']} .",
                         f"according to the {f['job']} , they were {f['adj']} ."))
    others = [_distractor(rng, f) for _ in range(rng.randint(2, 4))]
    others.insert(rng.randint(0, len(others)), detail)
    article = " ".join([_key_sentence(rng, f), *others])
    highlights = (f"{f['first']} {f['last']} {f['verb']} {f['n']} {f['objects']} in {f['city']} on {f['day']} . "
                  f"the {f['job']} said they were {f['adj']} .")
    return {"id": example_id, "article": article, "highlights": highlights}


def make_split(seed: int, split: str, n: int) -> list[dict[str, str]]:
    """``n`` records of ``split`` ("train" or "test"); the splits use independent streams of one seed."""
    rng = random.Random(f"specsweep-toy-text:{seed}:{split}")
    return [make_example(rng, f"{split}-{i:05d}") for i in range(n)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    """Write records as JSONL (one compact object per line, keys in a fixed order), atomically."""
    return write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def generate(out_dir: Path, seed: int = 0, quick: bool = False) -> dict:
    """Write ``<out_dir>/train.jsonl`` and ``<out_dir>/test.jsonl``; return a summary dict
    ``{"train": {"path", "examples"}, "test": {...}}``."""
    sizes = {"train": QUICK_TRAIN_EXAMPLES if quick else TRAIN_EXAMPLES,
             "test": QUICK_TEST_EXAMPLES if quick else TEST_EXAMPLES}
    summary = {}
    for split, n in sizes.items():
        path = write_jsonl(Path(out_dir) / f"{split}.jsonl", make_split(seed, split, n))
        summary[split] = {"path": str(path), "examples": n}
    return summary
