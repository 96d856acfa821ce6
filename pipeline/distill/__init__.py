"""`specsweep distill`: a draft made for a target, trained on the target's own next-token laws (docs/distill.md).

    settings.py    the settings, their flags and one-line checks
    teacher.py     the target's continuations and its law along them (top k per position)
    student.py     the draft's shape, initial weights and vocabulary; its logits at chosen positions
    divergence.py  forward KL, reverse KL, total variation on the target's top tokens
    on_policy.py   the draft's own samples scored by the target
    train.py       the loop: batches, budget, held-out evaluation
    curve.py       curve.json and curve.png, atomically
    recipe.py      end to end, and the output folder
"""
