"""`specsweep bench distortion` (pipeline/benchmarks/distortion.py) on a tiny Llama pair: exact's distortion is 0 and a
saturated sigmoid's is not, every setting is read on the same positions, the choice is the most-accepting setting
within the bound and is written as a settings file `specsweep run --from-config` reads (and none, an earlier file left
as it was, when no setting is that close), and bad input is one line with exit 2."""

from __future__ import annotations

import json

import pytest
from tiny_models import save_pair, write_prompts

from pipeline.benchmarks.distortion import choose, expected_tokens
from pipeline.cli import main
from pipeline.settings_file import load_settings


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("distortion")
    target, draft = save_pair(root, kind="llama", noise=0.3)
    return root, target, draft, write_prompts(root / "prompts.jsonl")


def _bench(pair, out, *extra) -> int:
    _, target, draft, data = pair
    return main(["bench", "distortion", "--target", str(target), "--draft", str(draft), "--data", str(data),
                 "--task", "prompts", "--limit", "3", "--max-new-tokens", "12", "--gamma", "3", "--dtype", "float32",
                 "--device", "cpu", "--threads", "1", "--alphas", "0.5,2", "--betas=-20,0", "--no-progress",
                 "--out", str(out), *extra])


def test_exact_is_undistorted_a_saturated_sigmoid_is_not_and_the_choice_is_a_settings_file(pair, tmp_path, capsys):
    out, settings = tmp_path / "d.json", tmp_path / "settings.json"
    assert _bench(pair, out, "--max-distortion", "1", "--settings-out", str(settings)) == 0
    result = json.loads(out.read_text())
    rows = {r["label"]: r for r in result["results"]}
    assert list(rows)[:4] == ["exact", "exact, argmax draft", "typical epsilon 0.09 delta 0.3",
                              "sigmoid alpha 1 beta -20"]
    assert len(rows) == 4 + 4                        # the 2 x 2 grid (the registry's default is not in it)
    assert rows["exact"]["distortion"] < 1e-5 and rows["exact, argmax draft"]["distortion"] < 1e-5
    assert rows["sigmoid alpha 2 beta 0"]["distortion"] > 0.05
    assert len({r["tokens"] for r in rows.values()}) == 1 and rows["exact"]["tokens"] >= 3 * 12
    assert all(0 <= r["acceptance"] <= 1 and r["distortion_ci95"][0] <= r["distortion"] <= r["distortion_ci95"][1]
               for r in rows.values())
    sigmoid = [r for r in rows.values() if r["rule"] == "sigmoid"]
    best = max(sigmoid, key=lambda r: r["acceptance"])
    assert result["choice"]["label"] == best["label"]
    entry = load_settings(settings).entry(1)["settings"]
    assert entry["sampler"] == "sigmoid" and entry["params"] == best["params"] and entry["gamma"] == 3
    assert (tmp_path / "d.png").stat().st_size > 0
    assert "chosen: " + best["label"] in capsys.readouterr().out

    # docs/results.md's block from the same JSON: the three reference rows, then the front, the choice marked
    from analysis.bench_blocks import DISTORTION_QWEN, bench_distortion_qwen

    (tmp_path / DISTORTION_QWEN).parent.mkdir(parents=True)
    (tmp_path / DISTORTION_QWEN).write_text(out.read_text())
    lines = [line.split(" | ") for line in bench_distortion_qwen(tmp_path).splitlines() if line.startswith("| ")]
    names = ["exact (lossless: the check)", "exact, the draft's argmax (llama.cpp's rule; lossless)",
             "typical, the registry's ε and δ", "sigmoid, the registry's α and β"]
    assert all(line[0].lstrip("| ").startswith(name) for line, name in zip(lines[1:5], names, strict=True))
    marked = [line for line in lines if "(chosen: the most accepting within 1.00)" in line[0]]
    assert len(marked) == 1 and marked[0][1] == ", ".join(
        f"{sym} {value}" for sym, value in (("α", f"{best['params']['alpha']:.2f}"),
                                            ("β", f"{best['params']['beta']:.1f}".replace("-", "−"))))

    # nothing within the bound: no choice, no settings file written, and the earlier run's left as it was (and said)
    before = settings.read_bytes()
    assert _bench(pair, out, "--max-distortion", "0", "--settings-out", str(settings)) == 0
    assert json.loads(out.read_text())["choice"] is None and settings.read_bytes() == before
    printed = capsys.readouterr().out
    assert "no sigmoid setting has distortion <= 0 per token" in printed
    assert f"no settings file written to {settings} (the file there is an earlier run's, left as it was)" in printed


@pytest.mark.parametrize("extra,message", [
    (("--temperature", "0"), "--temperature 0.0: give T > 0"),
    (("--alphas", "1,-2"), "--alphas '1,-2': give comma-separated finite numbers > 0"),
    (("--max-distortion", "2"), "--max-distortion 2.0: a total variation, in [0, 1]"),
    (("--task", "librispeech"), "--task 'librispeech': one text prompt per record"),
])
def test_bad_input_is_one_line_with_exit_2(pair, tmp_path, capsys, extra, message):
    assert _bench(pair, tmp_path / "d.json", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "d.json").exists()


def test_the_choice_and_the_expected_tokens():
    rows = [{"rule": "sigmoid", "distortion": 0.01, "acceptance": 0.5, "label": "a"},
            {"rule": "sigmoid", "distortion": 0.04, "acceptance": 0.7, "label": "b"},
            {"rule": "sigmoid", "distortion": 0.20, "acceptance": 0.9, "label": "c"},
            {"rule": "typical", "distortion": 0.00, "acceptance": 0.95, "label": "d"}]
    assert choose(rows, "sigmoid", 0.05)["label"] == "b"
    assert choose(rows, "sigmoid", 0.005) is None
    assert expected_tokens(0.5, 3) == pytest.approx(1.875) and expected_tokens(1.0, 4) == 5.0


def test_the_argmax_draft_is_accepted_with_the_targets_probability_of_it_and_stays_lossless():
    """exact against the draft's argmax (llama.cpp's rule) at the probe's positions: its acceptance is p(argmax q), its
    emitted law the target's; exact against the sampled draft accepts Σ min(p, q), computed here independently."""
    import torch

    from pipeline.benchmarks.distortion import Setting, _Probe
    from pipeline.samplers import get_sampler

    g = torch.Generator().manual_seed(0)
    B, gamma, V, T = 3, 4, 50, 0.8
    z_t, z_d = torch.randn(B, gamma + 1, V, generator=g) * 3, torch.randn(B, gamma, V, generator=g) * 3
    z_d[:, :, :V // 2] += z_t[:, :gamma, :V // 2]          # a draft that partly agrees with the target
    settings = [Setting("exact"), Setting("exact", draft="argmax")]
    probe = _Probe(get_sampler("exact", temperature=T), settings, T)
    q = torch.softmax(z_d / T, dim=-1)
    tokens = torch.stack([torch.multinomial(q[b], 1, generator=g).squeeze(1) for b in range(B)])
    result = probe(tokens, z_d, z_t, generator=g)
    drafted = (torch.arange(gamma)[None] <= result.accepted[:, None]).double()
    p = torch.softmax(z_t[:, :gamma].double() / T, dim=-1)
    argmax_p = p.gather(2, z_d.argmax(dim=-1, keepdim=True)).squeeze(2)
    overlap = torch.minimum(p, q.double()).sum(dim=-1)
    steps = probe.steps()[0]                                # [settings, 4]: tv, tokens, acceptance sum, drafted
    assert steps[0, 2] == pytest.approx(float((overlap * drafted).sum()), rel=1e-4)
    assert steps[1, 2] == pytest.approx(float((argmax_p * drafted).sum()), rel=1e-4)
    assert steps[1, 0] / steps[1, 1] < 1e-5                # lossless: no distortion
    assert steps[0, 3] == steps[1, 3] == float(drafted.sum())
