"""The scenario runner's operator process: a restart (a crash, then a start) is never seen as an exit."""

from __future__ import annotations

import threading
from pathlib import Path

from gpu_efficiency_sim.operator_process import OperatorProcess


def test_restart_kills_and_starts_again_without_an_exit_in_between(tmp_path: Path) -> None:
    proc = OperatorProcess("sleep 60", {"PATH": "/usr/bin:/bin"}, tmp_path / "op.log").start()
    first = proc._proc
    seen: list[int | None] = []
    stop = threading.Event()

    def watch() -> None:  # what the runner's observe loop does, while the restart happens
        while not stop.is_set():
            seen.append(proc.exit_code)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        proc.restart()
    finally:
        stop.set()
        watcher.join()
    try:
        assert first is not None
        assert first.poll() == -9, "the first process was not killed"
        assert proc._proc is not first
        assert proc.exit_code is None
        assert seen
        assert set(seen) == {None}, "the observe loop saw the killed process"
    finally:
        proc.stop()
