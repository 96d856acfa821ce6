"""Tuning: the Optuna search over verify settings, and what it deploys.

    space.py     the search space (γ, rule and parameters, dtype, draft length, draft-tokenizer mode) and the objectives
    storage.py   where a study lives and how workers share it (storage URL, heartbeats, retries, the Pareto front)
    study.py     a worker's trials, their AR baselines, and one study per (batch size, prompt length) cell
    schedule.py  a setting per cell, and the robust choice
    export.py    the chosen settings for transformers, vLLM, TensorRT-LLM and our JSON
"""
