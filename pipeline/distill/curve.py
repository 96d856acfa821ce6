"""The training curve: ``curve.json`` (every point) and ``curve.png`` (training loss and held-out agreement against
training time), both written atomically, so a reader never sees half a file and a crash keeps the last complete
curve."""

from __future__ import annotations

from pathlib import Path

from pipeline.io import atomic_file, write_json_atomic


def write_curve(folder: str | Path, curve: list[dict], meta: dict) -> None:
    """``folder``/curve.json: ``{**meta, "points": curve}``; ``folder``/curve.png: its figure."""
    folder = Path(folder)
    write_json_atomic(folder / "curve.json", {**meta, "points": curve})
    write_png(folder / "curve.png", curve, meta.get("divergence", "loss"))


def write_png(path: Path, curve: list[dict], divergence: str) -> None:
    """Two panels against training seconds: the training loss (mean between points) and, where there are held-out
    sequences, their loss; the held-out agreement (T = 0 per-token acceptance) and the T = 1 acceptance bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    trained = [p for p in curve if p["train_loss"] is not None]
    left.plot([p["seconds"] for p in trained], [p["train_loss"] for p in trained], "o-", label="training")
    held = [p for p in curve if p.get("heldout")]
    if held:
        seconds = [p["seconds"] for p in held]
        left.plot(seconds, [p["heldout"]["loss"] for p in held], "s--", label="held out")
        right.plot(seconds, [p["heldout"]["agreement"] for p in held], "o-", label="agreement (T = 0)")
        right.plot(seconds, [p["heldout"]["acceptance_t1"] for p in held], "s--", label="Σ min(p, q) (T = 1)")
        right.set_ylim(0, 1)
        right.legend(fontsize=8)
    left.set(xlabel="training seconds", ylabel=divergence, title="loss")
    right.set(xlabel="training seconds", ylabel="per-token acceptance", title="held-out continuations")
    left.legend(fontsize=8)
    fig.tight_layout()
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
