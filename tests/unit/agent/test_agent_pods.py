"""Pod attribution: the kubelet pod-resources API through a fake gRPC server on a unix socket, the
cgroup fallback on a fake /proc tree, and the static mapping of the fake backend."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from gpu_efficiency.agent.pods import (
    Attributor,
    PodAttribution,
    PodResourcesClient,
    parse_static,
    pod_from_cgroup,
    pods_for,
    pods_from_processes,
)
from gpu_efficiency.agent.proto import podresources_pb2
from gpu_efficiency_sim.fake_nvml.backend import FakeBackend, FakeGpu

pb: Any = podresources_pb2
UID = "0f2b6c1e-3d4a-4b5c-8d9e-a1b2c3d4e5f6"
CID = "ab" * 32


class _Kubelet:
    """A stand-in kubelet serving v1.PodResourcesLister/List from a list of pods."""

    def __init__(self, path: str) -> None:
        self.pods: list[Any] = []
        self.fail: grpc.StatusCode | None = None
        self.calls = 0
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=pb.ListPodResourcesRequest.FromString,
                    response_serializer=pb.ListPodResourcesResponse.SerializeToString,
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def _list(self, _request: Any, context: grpc.ServicerContext) -> Any:
        self.calls += 1
        if self.fail is not None:
            context.abort(self.fail, "kubelet says no")
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


def pod(namespace: str, name: str, *containers: tuple[str, str, list[str]]) -> Any:
    return pb.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)])
            for c, r, ids in containers
        ],
    )


@pytest.fixture
def kubelet() -> Iterator[tuple[_Kubelet, str]]:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # unix socket paths must stay short
        path = str(Path(tmp, "kubelet.sock"))
        k = _Kubelet(path)
        yield k, path
        k.server.stop(grace=None)


def test_pod_resources_maps_uuids_mig_indices_and_replicas(kubelet: tuple[_Kubelet, str]) -> None:
    k, path = kubelet
    k.pods = [
        pod("ml", "train", ("worker", "nvidia.com/gpu", ["GPU-aaa", "GPU-bbb"])),
        pod("web", "infer", ("server", "nvidia.com/mig-1g.10gb", ["MIG-ccc"])),
        pod("lab", "a", ("nb", "nvidia.com/gpu", ["GPU-ddd::0"])),  # time-slicing replicas
        pod("lab", "b", ("nb", "nvidia.com/gpu", ["GPU-ddd::3"])),
        pod("old", "idx", ("c", "nvidia.com/gpu", ["3"])),  # device plugin index strategy
        pod("net", "x", ("c", "example.com/nic", ["GPU-aaa"])),  # not a GPU resource
    ]
    got = PodResourcesClient(path).list()
    assert got["GPU-aaa"] == got["GPU-bbb"] == (PodAttribution("ml", "train", "worker"),)
    assert got["MIG-ccc"] == (PodAttribution("web", "infer", "server"),)
    assert got["GPU-ddd"] == (PodAttribution("lab", "a", "nb"), PodAttribution("lab", "b", "nb"))
    assert pods_for(got, FakeGpu(index=3, uuid="GPU-zzz").info()) == (PodAttribution("old", "idx", "c"),)
    assert pods_for(got, FakeGpu(index=9, uuid="GPU-none").info()) == ()


def test_agent_labels_metrics_from_the_kubelet(
    kubelet: tuple[_Kubelet, str],
    serve: Callable[..., Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    k, path = kubelet
    backend = FakeBackend([FakeGpu(index=0, uuid="GPU-aaa")])
    k.pods = [pod("ml", "train", ("worker", "nvidia.com/gpu", ["GPU-aaa"]))]
    _, url = serve(backend, Attributor(backend, kubelet=PodResourcesClient(path)))
    wait_until(lambda: 'pod="train"' in http.get(f"{url}/metrics").text)
    assert http.get(f"{url}/snapshot?history=0").json()["attribution"] == {
        "source": "pod-resources",
        "error": "",
    }
    k.pods = []  # the pod went away: the next refresh drops it
    wait_until(lambda: 'pod="train"' not in http.get(f"{url}/metrics").text)


def _proc(root: Path, pid: int, text: str) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "cgroup").write_text(text)


def test_kubelet_failure_falls_back_to_cgroups(kubelet: tuple[_Kubelet, str], tmp_path: Path) -> None:
    k, path = kubelet
    k.fail = grpc.StatusCode.UNAVAILABLE
    backend = FakeBackend([FakeGpu(index=0, uuid="GPU-aaa", pids=[7, 101, 102, 999])])
    backend.init()
    _proc(
        tmp_path,
        101,
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
    )
    _proc(tmp_path, 102, "0::/system.slice/sshd.service\n")  # not a pod; 999 has exited
    own = "11111111-2222-3333-4444-555555555555"
    _proc(tmp_path, 7, f"0::/kubepods/pod{own}/{CID}\n")  # one of the agent's own threads (no hostPID)
    (tmp_path / "self").symlink_to(tmp_path / "7")
    result = Attributor(backend, kubelet=PodResourcesClient(path), proc_root=str(tmp_path)).resolve(
        [backend.gpu(0).info()]
    )
    assert result.source == "cgroup"
    assert "UNAVAILABLE" in result.error
    assert result.pods == {"GPU-aaa": (PodAttribution("", "", uid=UID, container_id=CID),)}
    assert k.calls == 1


def test_missing_socket_without_fallback_attributes_nothing(tmp_path: Path) -> None:
    backend = FakeBackend([FakeGpu(index=0, uuid="GPU-aaa")])
    backend.init()
    client = PodResourcesClient(str(tmp_path / "absent.sock"))
    result = Attributor(backend, kubelet=client, cgroup_fallback=False).resolve([backend.gpu(0).info()])
    assert (result.source, dict(result.pods)) == ("none", {})
    assert "not found" in result.error


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n", (UID, CID)),  # cgroup v1, cgroupfs driver
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            (UID, CID),
        ),  # cgroup v2, systemd driver
        (f"0::/kubepods/pod{UID}/\n", (UID, "")),
        ("0::/user.slice/user-0.slice\n", None),
    ],
)
def test_cgroup_parsing(text: str, expected: tuple[str, str] | None) -> None:
    assert pod_from_cgroup(text) == expected


def test_nvml_process_errors_are_skipped(tmp_path: Path) -> None:
    backend = FakeBackend([FakeGpu(index=0, uuid="GPU-aaa", pids=[1])])
    backend.init()
    backend.fail(0, "pids")
    assert pods_from_processes(backend, [backend.gpu(0).info()], str(tmp_path)) == {}


def test_static_mapping() -> None:
    got = parse_static("ml/train/worker=GPU-aaa, ml/eval=1")
    assert got == {
        "GPU-aaa": (PodAttribution("ml", "train", "worker"),),
        "1": (PodAttribution("ml", "eval"),),
    }
    for bad in ("ml=GPU-a", "ml/train", "/x=GPU-a", "a/b/c/d=GPU-a"):
        with pytest.raises(ValueError, match="bad pod mapping"):
            parse_static(bad)
