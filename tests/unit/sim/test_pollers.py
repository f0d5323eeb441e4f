"""The simulator's pollers: a failed poll keeps the last state and the loop goes on; the shared
loop (``_Poller``) is abstract, so a poller that forgets ``poll`` fails when it is built, not in
its thread at the first tick."""

from __future__ import annotations

import threading

import pytest

from gpu_efficiency_sim.kube import _Poller


class Flaky(_Poller):
    def __init__(self) -> None:
        super().__init__(0.01, "test-poll", "test polling")
        self.calls = 0
        self.second = threading.Event()

    def poll(self) -> object:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("API server down")
        self.second.set()
        return self.calls


def test_a_failed_poll_does_not_end_the_loop() -> None:
    poller = Flaky().start()
    try:
        assert poller.second.wait(5), "the poller stopped after its first poll failed"
    finally:
        poller.stop()
    assert not poller._thread.is_alive()


def test_a_poller_without_poll_cannot_be_built() -> None:
    class Forgetful(_Poller):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Forgetful(1.0, "t", "t")  # type: ignore[abstract]
