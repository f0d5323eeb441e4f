"""Wall-clock deadlines for one HTTP exchange (a Prometheus query, a node agent's snapshot).

A client's timeout bounds each socket read, not the exchange: a server that trickles its body a
byte at a time, each byte inside the timeout, holds a query as long as it likes (seen: 8.2 s with a
1 s timeout), and with it the one thread that runs every policy. Here one watchdog thread shuts the
exchange's socket down at its deadline, which ends the read blocked on it at once; the caller then
sees ``expired`` and reports the source unavailable. Until the response's headers arrive there is
no socket to hold, and the client's own timeout (set to what is left of the deadline) bounds each
read of that short phase.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)


class Watchdog:
    """One daemon thread that calls each armed function at its monotonic time, unless disarmed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, at: float, call: Callable[[], None]) -> int:
        with self._wake:
            token = next(self._ids)
            self._armed[token] = call
            heapq.heappush(self._heap, (at, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()
        return token

    def disarm(self, token: int) -> None:
        with self._wake:
            self._armed.pop(token, None)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._wake.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, token = heapq.heappop(self._heap)
                call = self._armed.pop(token, None)
            if call is not None:
                try:
                    call()
                except Exception:  # a cut that fails must not end the watchdog
                    log.exception("cutting an exchange at its deadline failed")


WATCHDOG = Watchdog()


class Deadline:
    """The end of one exchange; ``hold`` the socket the watchdog shuts down when it comes."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def remaining(self) -> float:
        """Seconds left, at least a millisecond (a zero timeout means 'never' to some clients)."""
        return max(0.001, self.end - time.monotonic())

    def hold(self, sock: socket.socket | None) -> None:
        with self._lock:
            if sock is None:
                return
            self._sockets.append(sock)
            if not self.expired:
                return
        _shut(sock)

    def cut(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: nothing left to wake
        sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def deadline(seconds: float) -> Iterator[Deadline]:
    """A ``Deadline`` ``seconds`` from now, cut by the watchdog unless the block ends first."""
    limit = Deadline(seconds)
    token = WATCHDOG.arm(limit.end, limit.cut)
    try:
        yield limit
    finally:
        WATCHDOG.disarm(token)


def httpx_socket(response: Any) -> socket.socket | None:
    """The socket under a streamed ``httpx`` response (httpcore's ``network_stream`` extension)."""
    stream = getattr(response, "extensions", {}).get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    return sock if isinstance(sock, socket.socket) else None
