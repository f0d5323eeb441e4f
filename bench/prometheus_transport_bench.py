"""Prometheus transport benchmark: ``PrometheusClient`` reading one big instant-query answer.

    python bench/prometheus_transport_bench.py [--series 568000] [--rounds 5]

A local server (its own process, so it does not share this one's GIL) answers every query with one
vector of ``--series`` series (~124 bytes each: 568,000 series are ~70 MB of JSON, a window answer
at 8,000 GPUs), plain or gzip-compressed as Prometheus does when asked. Timed, median of
``--rounds`` after a warm-up: the body alone (read, gzip undone, not decoded), ``query`` (read and
``decode_vector``) and the window path (``iter_vector``, what the source folds).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpu_efficiency.sources.metrics.prometheus import PrometheusClient, PrometheusConfig
from gpu_efficiency.sources.metrics.prometheus.vector import iter_vector


def answer(series: int) -> bytes:
    result = [
        {
            "metric": {
                "UUID": f"GPU-{i:08x}-1f2e-4d3c-8b9a-{i * 7919 % 2**48:012x}",
                "__agg__": "SM_ACTIVE:max",
            },
            "value": [1700000000.123, str(0.5 + (i % 1000) / 1e4)],
        }
        for i in range(series)
    ]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(body, separators=(",", ":")).encode()


def serve(series: int, compress: bool) -> None:
    """The server process: prints its port, then answers until killed."""
    body = answer(series)
    packed = gzip.compress(body, 1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            zipped = compress and "gzip" in self.headers.get("Accept-Encoding", "")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if zipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(packed if zipped else body)))
            self.end_headers()
            self.wfile.write(packed if zipped else body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], len(body), len(packed), flush=True)
    server.serve_forever()


def median_s(run: Callable[[], object], rounds: int) -> float:
    run()  # warm-up: the connection, the allocator
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(mode: str, series: int, rounds: int) -> str:
    """One line of figures for a server answering ``mode`` (plain or gzip)."""
    server = subprocess.Popen(
        [sys.executable, __file__, "--series", str(series), "--serve", mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port, size, packed = (int(x) for x in server.stdout.readline().split())
        client = PrometheusClient(PrometheusConfig(url=f"http://127.0.0.1:{port}", timeout=120))
        body = median_s(lambda: client.exchange("x", None, lambda c: sum(len(b) for b in c)), rounds)
        query = median_s(lambda: client.query("x"), rounds)
        window = median_s(
            lambda: client.exchange("x", None, lambda c: sum(len(s) for s in iter_vector(c))), rounds
        )
    finally:
        server.terminate()
    return (
        f"{mode}: {series} series, {size / 1e6:.1f} MB of JSON ({packed / 1e6:.1f} MB gzip); median of {rounds}: "
        f"body {body:.3f} s ({size / body / 1e6:.0f} MB/s), query (read + decode_vector) {query:.3f} s, "
        f"window path (iter_vector) {window:.3f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--series", type=int, default=568_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve", choices=("plain", "gzip"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.series, args.serve == "gzip")
        return 0
    for mode in ("plain", "gzip"):
        print(measure(mode, args.series, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
