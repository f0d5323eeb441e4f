"""glibc malloc tuning at operator start-up: applied unless the environment sets it; real on glibc."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys

import pytest

from gpu_efficiency import malloc_tuning


class Recorder:
    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.result


def test_both_settings_are_applied_when_the_environment_gives_none() -> None:
    mallopt = Recorder()
    applied = malloc_tuning.tune(environ={}, mallopt=mallopt)
    assert mallopt.calls == [(malloc_tuning.M_ARENA_MAX, 2), (malloc_tuning.M_MMAP_THRESHOLD, 128 * 1024)]
    assert applied == {"MALLOC_ARENA_MAX": 2, "MALLOC_MMAP_THRESHOLD_": 131072}


def test_a_setting_the_environment_gives_is_left_to_glibc() -> None:
    mallopt = Recorder()
    applied = malloc_tuning.tune(environ={"MALLOC_ARENA_MAX": "8"}, mallopt=mallopt)
    assert mallopt.calls == [(malloc_tuning.M_MMAP_THRESHOLD, 128 * 1024)]
    assert applied == {"MALLOC_MMAP_THRESHOLD_": 131072}


def test_a_refused_setting_is_not_reported_as_applied() -> None:
    assert malloc_tuning.tune(environ={}, mallopt=Recorder(result=0)) == {}


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or not ctypes.util.find_library("c"),
    reason="mallopt is glibc's; this libc has none",
)
def test_glibc_accepts_them_in_a_fresh_process() -> None:
    code = "from gpu_efficiency import malloc_tuning; print(sorted(malloc_tuning.tune(environ={})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['MALLOC_ARENA_MAX', 'MALLOC_MMAP_THRESHOLD_']"
