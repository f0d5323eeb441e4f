"""Which pods use which GPU: the kubelet pod-resources API first, process cgroups as the fallback.

pod-resources (gRPC ``v1.PodResourcesLister/List`` on the kubelet's unix socket) lists the device IDs the
device plugin allocated to each container: GPU UUIDs, MIG UUIDs, indices (the plugin's ``index``
strategy) or time-slicing replicas ``<uuid>::<n>``; all are mapped back to the device.

The cgroup fallback asks NVML for the PIDs running on each GPU and reads ``/proc/<pid>/cgroup`` for the
pod UID. Its limits: the agent needs ``hostPID`` to see those PIDs, it only sees pods with a live CUDA
context (an idle pod holding a GPU without a process is invisible), and it learns the pod UID, not the
namespace and name: the operator resolves UIDs to pods (``AgentSource(uid_resolver=...)``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_efficiency.agent.nvml.types import DeviceInfo, NvmlBackend, NvmlError

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCE_PREFIX = "nvidia.com/"  # nvidia.com/gpu, nvidia.com/mig-1g.10gb, renamed shared resources

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"(?:cri-containerd-|docker-|crio-)?([0-9a-f]{64})(?:\.scope)?$")


class AttributionError(Exception):
    """A source of attribution is unavailable (socket missing, RPC failed)."""


@dataclass(frozen=True, slots=True)
class PodAttribution:
    namespace: str  # empty when only the UID is known (cgroup fallback)
    name: str
    container: str = ""
    uid: str = ""
    container_id: str = ""


#: device ID as the kubelet or the fallback names it (UUID or index) -> pods using it
Attribution = Mapping[str, tuple[PodAttribution, ...]]


def device_key(device_id: str) -> str:
    """Strip the time-slicing replica suffix: ``GPU-abc::3`` -> ``GPU-abc``."""
    return device_id.split("::", 1)[0]


def pods_for(attribution: Attribution, device: DeviceInfo) -> tuple[PodAttribution, ...]:
    """Pods on one device: by UUID, or by index for the device plugin's index strategy."""
    found = attribution.get(device.uuid)
    if found is None and not device.is_mig:
        found = attribution.get(str(device.index))
    return found or ()


def _merge(pairs: Iterable[tuple[str, PodAttribution]]) -> dict[str, tuple[PodAttribution, ...]]:
    out: dict[str, list[PodAttribution]] = {}
    for key, pod in pairs:
        bucket = out.setdefault(key, [])
        if pod not in bucket:
            bucket.append(pod)
    return {k: tuple(v) for k, v in out.items()}


class PodResourcesClient:
    """Reads allocations from the kubelet. Uses the generated messages and a plain unary call (no
    generated stub, whose grpcio version check would pin grpcio to the generator's version)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self._timeout_s = timeout_s
        self._channel: object | None = None
        self._list: Callable[..., Any] | None = None

    def list(self) -> dict[str, tuple[PodAttribution, ...]]:
        import grpc

        from gpu_efficiency.agent.proto import podresources_pb2

        pb: Any = podresources_pb2  # messages are built at import time, invisible to mypy

        if not os.path.exists(self.socket_path):
            raise AttributionError(f"kubelet pod-resources socket {self.socket_path} not found")
        if self._list is None:
            channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            self._channel = channel
            self._list = channel.unary_unary(
                LIST_METHOD,
                request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                response_deserializer=pb.ListPodResourcesResponse.FromString,
            )
        try:
            response = self._list(pb.ListPodResourcesRequest(), timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise AttributionError(f"pod-resources List failed: {exc.code().name}: {exc.details()}") from exc
        return _merge(
            (device_key(device_id), PodAttribution(pod.namespace, pod.name, container.name))
            for pod in response.pod_resources
            for container in pod.containers
            for devices in container.devices
            if devices.resource_name.startswith(GPU_RESOURCE_PREFIX)
            for device_id in devices.device_ids
        )

    def close(self) -> None:
        close = getattr(self._channel, "close", None)
        if close is not None:
            close()
        self._channel = self._list = None


def pod_from_cgroup(text: str) -> tuple[str, str] | None:
    """(pod UID, container ID) from the contents of /proc/<pid>/cgroup, cgroup v1 or v2, any driver."""
    for line in text.splitlines():
        path = line.rsplit(":", 1)[-1]
        match = _POD_UID.search(path)
        if match:
            uid = match.group(1).replace("_", "-")
            leaf = path.rstrip("/").rsplit("/", 1)[-1]
            cid = _CONTAINER_ID.search(leaf)
            return uid, cid.group(1) if cid else ""
    return None


def _own_pod_uid(proc_root: str) -> str | None:
    try:
        found = pod_from_cgroup(Path(proc_root, "self", "cgroup").read_text())
    except OSError:
        return None
    return found[0] if found else None


def pods_from_processes(
    backend: NvmlBackend, devices: Iterable[DeviceInfo], proc_root: str = "/proc"
) -> dict[str, tuple[PodAttribution, ...]]:
    """The fallback: NVML compute PIDs -> cgroups -> pod UIDs (namespace and name left empty).

    NVML gives host PIDs; without hostPID a small one can name one of the agent's own threads, so the
    agent's own pod is never attributed."""
    own = _own_pod_uid(proc_root)
    pairs: list[tuple[str, PodAttribution]] = []
    for device in devices:
        try:
            pids = backend.compute_pids(device.uuid)
        except NvmlError:
            continue
        for pid in pids:
            try:
                text = Path(proc_root, str(pid), "cgroup").read_text()
            except OSError:  # process gone, or no hostPID
                continue
            found = pod_from_cgroup(text)
            if found and found[0] != own:
                pairs.append((device.uuid, PodAttribution("", "", uid=found[0], container_id=found[1])))
    return _merge(pairs)


def parse_static(spec: str) -> dict[str, tuple[PodAttribution, ...]]:
    """``ns/pod[/container]=DEVICE,...`` (DEVICE a UUID or an index), for the fake backend."""
    pairs: list[tuple[str, PodAttribution]] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        ref, sep, device = item.partition("=")
        parts = ref.split("/")
        if not sep or not device or len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"bad pod mapping {item!r}: use namespace/pod[/container]=GPU-uuid-or-index")
        pairs.append((device, PodAttribution(parts[0], parts[1], parts[2] if len(parts) == 3 else "")))
    return _merge(pairs)


@dataclass(frozen=True, slots=True)
class AttributionResult:
    pods: Attribution
    source: str  # "pod-resources" | "cgroup" | "static" | "none"
    error: str = ""  # why the preferred source was not used


class Attributor:
    """Chooses the source: static when given, else pod-resources, else the cgroup fallback."""

    def __init__(
        self,
        backend: NvmlBackend,
        *,
        kubelet: PodResourcesClient | None = None,
        static: Attribution | None = None,
        cgroup_fallback: bool = True,
        proc_root: str = "/proc",
    ) -> None:
        self._backend = backend
        self._kubelet = kubelet
        self._static = static
        self._cgroup_fallback = cgroup_fallback
        self._proc_root = proc_root
        self._last_error = ""

    def resolve(self, devices: list[DeviceInfo]) -> AttributionResult:
        if self._static is not None:
            return AttributionResult(self._static, "static")
        error = "no kubelet socket configured"
        if self._kubelet is not None:
            try:
                pods = self._kubelet.list()
            except AttributionError as exc:
                error = str(exc)
                if error != self._last_error:
                    log.warning("%s; falling back to process cgroups", error)
                self._last_error = error
            else:
                if self._last_error:
                    log.info("kubelet pod-resources answers again")
                    self._last_error = ""
                return AttributionResult(pods, "pod-resources")
        if self._cgroup_fallback:
            return AttributionResult(
                pods_from_processes(self._backend, devices, self._proc_root), "cgroup", error
            )
        return AttributionResult({}, "none", error)
