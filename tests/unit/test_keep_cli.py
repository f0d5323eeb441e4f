"""``gpu-efficiency keep NAMESPACE/POD 4h``: sets keep-for on the pod; bad input writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_efficiency import cli, keep
from gpu_efficiency.api import names


class FakeCore:
    def __init__(self, missing: bool = False) -> None:
        self.patches: list[tuple[str, str, Any]] = []
        self.missing = missing

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> None:
        if self.missing:
            raise ApiException(status=404, reason="Not Found")
        self.patches.append((name, namespace, body))


def test_keep_sets_keep_for_on_the_pod() -> None:
    core = FakeCore()
    message = keep.keep(core, "team-a/nb-0", "4h")  # type: ignore[arg-type]
    assert core.patches == [("nb-0", "team-a", {"metadata": {"annotations": {names.KEEP_FOR: "4h"}}})]
    assert "at most the policy's idle.maxKeep" in message


@pytest.mark.parametrize(("target", "duration"), [("nb-0", "4h"), ("team-a/", "4h"), ("team-a/nb-0", "4 hours"), ("team-a/nb-0", "0s")])  # fmt: skip
def test_bad_input_writes_nothing(target: str, duration: str) -> None:
    core = FakeCore()
    with pytest.raises(keep.KeepError) as err:
        keep.keep(core, target, duration)  # type: ignore[arg-type]
    assert err.value.code == keep.EXIT_USAGE
    assert core.patches == []


def test_a_missing_pod_is_a_clear_error() -> None:
    with pytest.raises(keep.KeepError, match="pod team-a/gone not found"):
        keep.keep(FakeCore(missing=True), "team-a/gone", "4h")  # type: ignore[arg-type]


def test_the_cli_parses_keep_and_refuses_a_bad_duration_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = cli.build_parser().parse_args(["keep", "team-a/nb-0", "4h"])
    assert (args.pod, args.duration, args.func) == ("team-a/nb-0", "4h", cli.cmd_keep)
    assert cli.main(["keep", "team-a/nb-0", "forever", "--kubeconfig", "/nonexistent"]) == keep.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("gpu-efficiency keep: error: ")
    assert "write it like 4h" in err
