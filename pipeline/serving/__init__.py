"""``specsweep serve``: a draft/target pair and its verify settings behind an HTTP API.

    settings.py   which settings are served and where they came from: the command line, or the recommended
                  point of an Optuna study or of a report (analysis/recommend.py)
    decoder.py    the loaded pair, one engine per temperature, and the decoding of one batch of requests with
                  ``SpeculativeEngine.generate`` (tokens streamed per verify step, rows cancelled)
    batching.py   the request queue and the dynamic batcher: a worker thread that takes up to --max-batch
                  queued requests, waiting at most --max-wait-ms for the batch to fill
    metrics.py    the Prometheus metrics of GET /metrics
    app.py        the ASGI app (FastAPI): POST /predict, POST /v1/completions (with Server-Sent Events),
                  GET /health, GET /metrics; validation and errors
    server.py     running the app with uvicorn: on a port, or in a background thread (tests, the benchmark)

The endpoints, the batching rules and what a response holds: docs/serve.md.
"""
