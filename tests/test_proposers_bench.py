"""`python -m pipeline.benchmarks.proposers`: the teacher-forced step loop by hand, a smoke run on a tiny JSONL, and
the skip without data; speed itself is never asserted in tests."""

from __future__ import annotations

import json

from pipeline.benchmarks.proposers import main, measure_cost, teacher_forced
from pipeline.decoding.drafters.ngram import NgramIndex


def test_teacher_forced_steps_by_hand():
    proposer = NgramIndex(1, 1, "last")
    proposer.start([1, 2, 3, 4, 1])
    # step 1 proposes 2 3 4 1 (after the earlier 1): 2 3 accepted, 9 emitted as the correction;
    # step 2: 9 is new, nothing proposed, 1 emitted; step 3 proposes 2 3 9 1 (after the latest 1): all accepted,
    # and the text ends
    r = teacher_forced(proposer, [2, 3, 9, 1, 2, 3, 9, 1], gamma=4)
    assert r == {"steps": 3, "emitted": 8, "proposed": 8, "accepted": 6, "proposing": 2, "seconds": 0.0}
    assert proposer.tokens == [1, 2, 3, 4, 1, 2, 3, 9, 1]   # the last step's tokens are never read


def test_cost_rows_pair_ours_with_transformers_on_the_same_steps():
    examples = [(list(range(10)) * 4, [1, 2]), (list(range(5)) * 8, [3])]
    rows = measure_cost(examples, contexts=(32,), gammas=(4,), windows=2, steps=5, repeats=2)
    by = {r["proposer"]: r for r in rows}
    assert set(by) == {"ngram", "transformers", "suffix", "suffix+outputs"}
    assert by["ngram"]["tokens_per_step"] == by["transformers"]["tokens_per_step"] > 1   # the text repeats
    assert by["ngram"]["transformers_over_ours"]["n"] == 2


def test_main_writes_json_and_skips_without_data(tmp_path, capsys):
    data = tmp_path / "test.jsonl"
    data.write_text("\n".join(json.dumps({"id": str(i), "article": "the cat sat on the mat . " * 80,
                                          "highlights": "the cat sat on the mat ."}) for i in range(2)))
    out = tmp_path / "p.json"
    assert main(["--data", str(data), "--repeats", "2", "--windows", "1", "--steps", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    # 2 x 562 tokens hold a 512-token context, not a 2048-token one
    assert {r["context"] for r in result["cost"]} == {r["context"] for r in result["memory"]} == {512}
    proxy = {(r["setting"], r["gamma"]): r for r in result["proxy"]}
    assert proxy[("ngram first 1-3", 4)]["tokens_per_step"] > 1
    missing = tmp_path / "absent.jsonl"
    assert main(["--data", str(missing), "--out", str(tmp_path / "q.json")]) == 0
    assert "skipping" in capsys.readouterr().out and not (tmp_path / "q.json").exists()
