"""The operator under test as a child process of the runner, with its output in a log file."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final

DEFAULT_OPERATOR_CMD: Final = "gpu-efficiency run --prometheus-url $GPUEFF_PROMETHEUS_URL"


class OperatorProcess:
    """Started in its own session so stopping it also stops anything it spawned."""

    def __init__(self, command: str, env: Mapping[str, str], log_path: Path) -> None:
        self.command = command
        self.env = dict(env)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._restarting = threading.Lock()  # exit_code never sees the killed process of a restart

    def start(self) -> OperatorProcess:
        # $VARS in the command expand against the environment the operator gets.
        expanded = self.command
        for key in sorted(self.env, key=len, reverse=True):
            expanded = expanded.replace(f"${{{key}}}", self.env[key]).replace(f"${key}", self.env[key])
        argv = shlex.split(expanded)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        return self

    @property
    def exit_code(self) -> int | None:
        with self._restarting:
            return None if self._proc is None else self._proc.poll()

    def restart(self) -> None:
        """Kill (as a crash) and start again with the same command, environment and log."""
        with self._restarting:
            self.kill()
            self.start()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``timeout``."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def kill(self) -> None:
        """SIGKILL to the process group: a crash, nothing released (its leader lease runs out)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
