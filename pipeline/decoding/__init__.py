"""Decoding: the speculative loop and everything it drives.

    engine.py        SpeculativeEngine: draft, score, verify, emit, sync, roll back (γ = 0: autoregressive)
    cache.py         CachedModel: one model's KV cache, its real-token mask per row, its forward
    static/          static-cache forwards for the model families that have one
    drafters/        what proposes tokens: a draft model, a draft with another tokenizer
    draft_policy.py  adaptive draft length
    timing.py        phase timer and peak memory
    hf_engine.py     transformers' own assisted generation, for comparison
    llama_cpp/       llama.cpp's own speculative decoding (llama-server) on GGUF files, --engine llama.cpp
"""
