"""``--engine llama.cpp``: llama.cpp's own speculative decoding, through its server, on GGUF files as they are.

    build.py       the pinned llama.cpp (llama-cpp-python's sdist) built once into the cache: llama-server & co.
    gguf_files.py  the GGUF files a run names (local, or a registry name's), their tokenizer and quantisation
    quantize.py    --dtype q8_0/f16/bf16: a GGUF file stored in another type by llama-quantize, kept in the cache
    server.py      one llama-server process: a free port, /health, /completion, a clean stop
    engine.py      LlamaCppEngine: the run's settings as the server's flags, generate() as our engines have it
"""
