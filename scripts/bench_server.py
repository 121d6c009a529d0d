"""Load benchmark of the HTTP server: requests/s and p50/p99 latency at several concurrencies.

    python scripts/bench_server.py runs/x/checkpoints/best.ckpt --engine torch --json docs/bench/server.json
    python scripts/bench_server.py exports/x_ct2 --engine ct2 --concurrency 1 8 64 --seconds 10

Starts ``scripts/serve.py`` on a free loopback port (a subprocess, as a user runs it), then, for each
concurrency C, runs C clients that each send one sentence per request (cycling through ``--source``)
and wait for the answer before sending the next, for ``--seconds`` or ``--requests`` (whichever ends
first). Records the CPU model and flags, the command, and per level: requests/s, sentences/s, latency
p50/p99, and the non-200 answers. The client is asyncio + httpx (a few dozen lines; locust would add
gevent and a web UI for what is one loop here), run in this process, so at high concurrency it shares
the CPUs with the server: the figures are for the pair, as on a single machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import httpx  # noqa: E402

from app.hardware import cpu_description  # noqa: E402

DEFAULT_SOURCE = REPO_ROOT / "tests" / "fixtures" / "multi30k" / "test_2016_flickr.de.gz"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a .ckpt checkpoint or a directory from scripts/export.py")
    parser.add_argument("--engine", choices=("torch", "ct2"), help="default: as serve.py chooses")
    parser.add_argument("--threads", type=int, default=1, help="server CPU threads")
    parser.add_argument(
        "--compile",
        choices=("auto", "aot", "off"),
        default="auto",
        help="serve.py's --compile (default: as serve.py); off times the eager engine, builds no packages",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=10.0, help="per concurrency level, at most")
    parser.add_argument("--requests", type=int, default=2000, help="per concurrency level, at most")
    parser.add_argument("--beam", type=int, default=1, help="1 = greedy")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="sentences, one a line (.gz ok)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's batching wait")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    """``serve.py`` on ``port``, once its /health answers 200 (or an error after 120 s)."""
    command = [sys.executable, str(REPO_ROOT / "scripts" / "serve.py"), args.model, "--port", str(port)]
    command += ["--threads", str(args.threads), "--max-wait-ms", str(args.max_wait_ms)]
    command += ["--max-queued", "1024", "--compile", args.compile]
    command += ["--engine", args.engine] if args.engine else []
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"serve.py exited with status {server.returncode}: {' '.join(command)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.kill()
    raise RuntimeError("serve.py did not answer /health within 120 s")


async def run_level(url: str, sentences: list[str], concurrency: int, args: argparse.Namespace) -> dict:
    """C clients in a closed loop; each request's latency and status."""
    latencies: list[float] = []
    failures: dict[str, int] = {}
    stop_at = time.monotonic() + args.seconds
    counter = iter(range(args.requests))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def user() -> None:
            for index in counter:
                if time.monotonic() > stop_at:
                    return
                body = {"sentences": [sentences[index % len(sentences)]], "beam": args.beam}
                start = time.perf_counter()
                response = await client.post("/translate", json=body)
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    failures[str(response.status_code)] = failures.get(str(response.status_code), 0) + 1

        began = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return summarize(concurrency, latencies, failures, elapsed)


def summarize(concurrency: int, latencies: list[float], failures: dict[str, int], elapsed: float) -> dict:
    ordered = sorted(latencies)

    def percentile(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000 if ordered else float("nan")

    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "seconds": round(elapsed, 2),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(0.50), 1),
        "p99_ms": round(percentile(0.99), 1),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else float("nan"),
        "failures": failures,
    }


def markdown(result: dict) -> str:
    rows = [
        "| engine | concurrency | requests | req/s | p50 ms | p99 ms | non-200 |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for level in result["levels"]:
        rows.append(
            f"| {result['engine']} | {level['concurrency']} | {level['requests']} "
            f"| {level['requests_per_s']} | {level['p50_ms']} | {level['p99_ms']} "
            f"| {level['failures'] or 'none'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sentences = read_lines(args.source)
    load_before = os.getloadavg()[0]  # other work on the machine, which the figures share it with
    port = free_port()
    server = start_server(args, port)
    url = f"http://127.0.0.1:{port}"
    try:
        engine = httpx.get(f"{url}/health", timeout=5).json()["engine"]
        asyncio.run(
            run_level(url, sentences, 4, argparse.Namespace(**{**vars(args), "requests": 16}))
        )  # warm-up
        levels = [asyncio.run(run_level(url, sentences, c, args)) for c in args.concurrency]
    finally:
        server.terminate()  # SIGTERM: uvicorn's graceful shutdown
        server.wait(timeout=60)
    result = {
        "command": " ".join(["python", "scripts/bench_server.py", *(argv or sys.argv[1:])]),
        "engine": engine,
        "beam": args.beam,
        "compile": args.compile,
        "server_threads": args.threads,
        "cpu_count": os.cpu_count(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # 1-min, before and after
        **cpu_description(),
        "levels": levels,
    }
    print(markdown(result))
    flags = ", ".join(result["cpu_flags"])
    cores, load = result["cpu_count"], result["load_average"]
    print(f"CPU: {result['cpu_model']} ({cores} cores; flags {flags}); load average {load}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
