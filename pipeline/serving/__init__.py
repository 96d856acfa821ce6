"""``specsweep serve``: a draft/target pair (or a target and a drafter without a model) and its verify settings behind
an HTTP API that OpenAI's clients speak.

    settings.py    which settings are served and where they came from: the command line, or the recommended
                   point of an Optuna study or of a report (analysis/recommend.py)
    schemas.py     what each endpoint accepts and answers: the pydantic models behind validation and /openapi.json
    admission.py   a validated request -> its jobs (one per choice), with the checks that depend on the server
    decoder.py     the loaded pair, one engine per (temperature, drafter, γ), and the decoding of one batch of jobs
                   with ``SpeculativeEngine.generate`` (tokens streamed per verify step, rows cancelled)
    stops.py       stop strings: where a text ends, and what a stream may show of a growing text
    batching.py    the request queue and the dynamic batcher: a worker thread that takes up to --max-batch
                   queued jobs, waiting at most --max-wait-ms for the batch to fill
    state.py       one server's state, and a request's way through it: queued, then its events awaited
    answers.py     OpenAI's completion and chat completion objects and their Server-Sent Events streams
    errors.py      error answers: OpenAI's shape, one-line messages (pydantic's validation errors too)
    metrics.py     the Prometheus metrics of GET /metrics (ours, and vLLM's speculative-decoding counters)
    app.py         the ASGI app (FastAPI): the routes, error handlers and the served OpenAPI schema
    server.py      running the app with uvicorn: on a port, or in a background thread (tests, the benchmark)

The endpoints, the batching rules and what a response holds: docs/serve.md.
"""
