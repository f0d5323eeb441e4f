"""An in-memory stand-in for a generated ``CoreV1Api.list_*`` method: paged LISTs of a mutable object
set, and watch streams the test feeds event by event (or ends, or breaks)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

END = object()


def pod(
    name: str,
    uid: str,
    rv: int,
    *,
    gpus: int = 1,
    namespace: str = "ns",
    node: str = "n1",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": str(rv),
            "annotations": annotations or {},
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": "Running"},
    }


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(rv: int) -> dict[str, Any]:
    return event("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": str(rv)}})


def expired() -> dict[str, Any]:
    return event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})


class FakeStream:
    """A watch response: yields what the test puts, until END; an exception put is raised."""

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue()
        self.connection = None
        self.closed = False

    def put(self, *events: dict[str, Any]) -> None:
        """Each event as its own line, two of them split across chunks to exercise the line reader."""
        for e in events:
            line = orjson.dumps(e) + b"\n"
            half = len(line) // 2
            self.items.put(line[:half])
            self.items.put(line[half:])

    def end(self) -> None:
        self.items.put(END)

    def fail(self, exc: BaseException) -> None:
        self.items.put(exc)

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        while True:
            item = self.items.get()
            if item is END or self.closed:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.closed = True
        self.items.put(END)

    def release_conn(self) -> None:
        pass


class FakeListResponse:
    def __init__(self, data: bytes) -> None:
        self.data = data


class FakeListApi:
    """Call it like ``core.list_pod_for_all_namespaces(...)`` with ``_preload_content=False``."""

    def __init__(self, objects: list[dict[str, Any]], rv: int = 100) -> None:
        self.objects = list(objects)
        self.rv = rv
        self.calls: list[dict[str, Any]] = []
        self.watches: queue.Queue[FakeStream | BaseException] = queue.Queue()
        self.list_errors: list[BaseException] = []
        self.list_gate: threading.Event | None = None  # set: LISTs block until it is set
        self.opened: list[FakeStream] = []

    @property
    def lists(self) -> int:
        return sum(1 for c in self.calls if not c.get("watch"))

    @property
    def watch_calls(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c.get("watch")]

    def next_watch(self) -> FakeStream:
        stream = FakeStream()
        self.watches.put(stream)
        return stream

    def fail_next_watch(self, exc: BaseException) -> None:
        self.watches.put(exc)

    def __call__(self, **kwargs: Any) -> Any:
        assert kwargs.get("_preload_content") is False
        self.calls.append(kwargs)
        if kwargs.get("watch"):
            assert kwargs.get("allow_watch_bookmarks") is True
            item = self.watches.get(timeout=10)
            if isinstance(item, BaseException):
                raise item
            self.opened.append(item)
            return item
        if self.list_gate is not None:
            self.list_gate.wait(10)
        if self.list_errors:
            raise self.list_errors.pop(0)
        limit = int(kwargs.get("limit") or len(self.objects) or 1)
        start = int(kwargs.get("_continue") or 0)
        page = self.objects[start : start + limit]
        more = start + limit < len(self.objects)
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if more:
            meta["continue"] = str(start + limit)
        return FakeListResponse(orjson.dumps({"items": page, "metadata": meta}))


def gone() -> ApiException:
    return ApiException(status=410, reason="Gone")


def wait_until(probe: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {probe}")
