"""The cluster cache through the real kubernetes client against a tiny HTTP API server: the LIST and
WATCH requests it makes (selector, bookmarks, version), raw chunked streams, and a prompt stop."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client
from tests.unit.sources.kube.fake_watch_api import pod, wait_until

from gpu_efficiency.sources.kube.cluster import ClusterReader
from gpu_efficiency.sources.kube.cluster_cache import CACHE_PAGE_SIZE, CachedClusterReader, ClusterCache
from gpu_efficiency.sources.metrics.targets import PodAddress


def _with_ip(obj: dict[str, Any], ip: str) -> dict[str, Any]:
    obj["status"]["podIP"] = ip
    return obj


LISTS: dict[str, list[dict[str, Any]]] = {
    "/api/v1/pods": [
        _with_ip(pod("listed", "u1", 5), "10.0.0.5"),
        _with_ip(pod("cpu-only", "u2", 6, gpus=0), "10.0.0.6"),
        pod("cpu-no-ip", "u4", 7, gpus=0),
    ],
    "/api/v1/nodes": [{"metadata": {"name": "n1", "uid": "n1", "resourceVersion": "3"}}],
    "/api/v1/namespaces": [{"metadata": {"name": "ns", "uid": "ns", "resourceVersion": "2"}}],
}


class _ApiServer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    requests: list[tuple[str, dict[str, list[str]]]] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        type(self).requests.append((url.path, query))
        if query.get("watch") == ["true"]:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if url.path == "/api/v1/pods":
                self._chunk({"type": "ADDED", "object": pod("watched", "u3", 11)})
                self._chunk({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}})
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline and not self.server.closing:  # type: ignore[attr-defined]
                time.sleep(0.05)
            return
        body = json.dumps({"items": LISTS[url.path], "metadata": {"resourceVersion": "10"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def api() -> Iterator[client.ApiClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    server.daemon_threads = True
    server.closing = False  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _ApiServer.requests = []
    config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield client.ApiClient(config)
    finally:
        server.closing = True  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


def _synced_reader(api: client.ApiClient) -> CachedClusterReader:
    """A started reader whose caches hold the LIST and the pods' watched event and bookmark."""
    reader = CachedClusterReader(ClusterCache(api), ClusterReader(api))
    reader.start()
    assert reader.cache.wait_synced(10)
    wait_until(lambda: reader.cache.bound.resource_version == "12")
    return reader


def test_cache_lists_then_watches_through_the_real_client(api: client.ApiClient) -> None:
    reader = _synced_reader(api)
    cache = reader.cache
    try:
        state = reader.read()
        assert [p.name for p in state.pods] == ["listed", "watched"]
        assert [n.name for n in state.nodes] == ["n1"]
        assert [n.name for n in state.namespaces] == ["ns"]
        assert state.requests == 0
        pods = [q for path, q in _ApiServer.requests if path == "/api/v1/pods"]
        # bound GPU pods, and (their own informer) pods not bound yet, for reclaimWhen OnPressure
        assert {q["fieldSelector"][0] for q in pods} == {
            "spec.nodeName!=",
            "spec.nodeName=,status.phase=Pending",
        }
        bound = [q for q in pods if q["fieldSelector"] == ["spec.nodeName!="]]
        watches = [q for q in bound if "watch" in q]
        assert watches, _ApiServer.requests
        assert watches[0]["resourceVersion"] == ["10"]
        assert watches[0]["allowWatchBookmarks"] == ["true"]
        lists = [q for q in bound if "watch" not in q]
        assert lists[0]["limit"] == [str(CACHE_PAGE_SIZE)]
        # One LIST and one watch of the bound pods serve both the GPU pods and every pod's address.
        assert (len(lists), len(watches)) == (1, 1), bound
        assert state.pod_addresses == (
            PodAddress("u1", ("10.0.0.5",), "n1"),
            PodAddress("u2", ("10.0.0.6",), "n1"),
        )
        assert cache.bound.snapshot() is not None
        assert len(cache.bound.snapshot() or ()) == 3
    finally:
        started = time.monotonic()
        reader.stop()
        took = time.monotonic() - started
    assert took < 3.0, f"stop() took {took:.1f}s while the watches were silent"


def test_writes_and_evictions_reach_the_gpu_pods_and_leave_the_addresses(api: client.ApiClient) -> None:
    reader = _synced_reader(api)
    try:
        before = reader.read()
        written = _with_ip(
            pod("listed", "u1", 50, annotations={"gpuefficiency.io/state": "Idle"}), "10.0.0.5"
        )
        reader.pod_written(written)
        reader.pod_evicted("u1")
        reader.pod_evicted("u2")  # a pod without GPUs: its address stays as it is
        after = reader.read()
        listed = next(p for p in after.pods if p.name == "listed")
        assert listed.annotations == {"gpuefficiency.io/state": "Idle"}
        assert listed.deleting
        assert after.pod_addresses == before.pod_addresses
        assert after.requests == 0
    finally:
        reader.stop()
