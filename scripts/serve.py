"""Serve a model over HTTP: POST /translate, GET /health, and a page at GET / (see docs/serving.md).

python scripts/serve.py runs/x/checkpoints/best.ckpt --port 8080
python scripts/serve.py exports/x_ct2 --threads 4 --max-batch-tokens 8192
curl -s localhost:8080/translate --json '{"sentences": ["Ein Hund läuft."], "beam": 5}'
open http://127.0.0.1:8080/ in a browser: type sentences, read translations and attention maps
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.checkpoint import CheckpointError
from app.inference.cli import add_compile_arg, add_ensemble_arg
from app.inference.engines import ENGINES, open_engine
from app.serving import ServerLimits, create_app
from app.serving.connections import ConnectionLimits
from app.serving.warmup import warm_up


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = ServerLimits()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a .ckpt checkpoint or a directory from scripts/export.py")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--engine", choices=ENGINES, help="default: ct2 for an exported directory")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: the engine's choice)")
    add_compile_arg(parser)
    add_ensemble_arg(parser)
    parser.add_argument("--max-request-bytes", type=int, default=defaults.max_request_bytes)
    parser.add_argument("--max-sentences", type=int, default=defaults.max_sentences, help="per request")
    parser.add_argument(
        "--max-batch-tokens", type=int, default=defaults.max_batch_tokens, help="merged per engine call"
    )
    parser.add_argument(
        "--max-request-tokens", type=int, default=defaults.max_request_tokens, help="work per request"
    )
    parser.add_argument("--max-wait-ms", type=float, default=defaults.max_wait_ms, help="wait for company")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="sentences per search")
    parser.add_argument("--max-queued", type=int, default=defaults.max_queued, help="then 503")
    parser.add_argument(
        "--request-timeout", type=float, default=defaults.request_timeout_s, help="seconds per request"
    )
    parser.add_argument(
        "--stuck-after", type=float, default=defaults.stuck_after_s, help="/health 503 after (seconds)"
    )
    add_connection_args(parser)
    return parser.parse_args(argv)


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    """Bounds on connections, enforced below the app (see app/serving/connections.py)."""
    defaults = ConnectionLimits()
    parser.add_argument(
        "--max-connections", type=int, default=defaults.max_connections, help="open at once; then refused"
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=defaults.header_timeout_s,
        help="seconds for a request's headers to arrive, from connect or the last response",
    )
    parser.add_argument(
        "--keep-alive", type=float, default=defaults.keep_alive_s, help="seconds an idle connection is kept"
    )
    parser.add_argument(
        "--max-header-bytes", type=int, default=defaults.max_header_bytes, help="request line + headers"
    )


def connections_from(args: argparse.Namespace) -> ConnectionLimits:
    """The connection bounds from the command line (ValueError names a bad one)."""
    return ConnectionLimits(
        max_connections=args.max_connections,
        header_timeout_s=args.header_timeout,
        keep_alive_s=args.keep_alive,
        max_header_bytes=args.max_header_bytes,
    )


def limits_from(args: argparse.Namespace) -> ServerLimits:
    """The server's limits from the command line (ValueError names a bad one)."""
    return ServerLimits(
        max_request_bytes=args.max_request_bytes,
        max_sentences=args.max_sentences,
        max_request_tokens=args.max_request_tokens,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        batch_size=args.batch_size,
        max_queued=args.max_queued,
        request_timeout_s=args.request_timeout,
        stuck_after_s=args.stuck_after,
    )


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = parse_args(argv)
    try:
        limits, connections = limits_from(args), connections_from(args)
        # A server decodes for hours: auto's packages pay for themselves, built before it listens
        compile = "aot" if args.compile == "auto" else args.compile
        engine = open_engine(
            args.model, engine=args.engine, threads=args.threads, ensemble=args.ensemble, compile=compile
        )
    except (CheckpointError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if report := warm_up(engine):  # compiled steps: paid before the first request, not by it
        print(f"warm-up: {report}", file=sys.stderr)
    uvicorn.run(
        create_app(engine, limits),
        host=args.host,
        port=args.port,
        log_level="info",
        timeout_graceful_shutdown=int(limits.request_timeout_s) + 1,  # in-flight requests are answered
        **connections.uvicorn_options(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
