"""Feeding the simulator from the Kubernetes API: the pods on simulated nodes, and (serve mode) the nodes.

Pods are listed and then watched as raw JSON (the client's model deserialisation is ~100x slower and
this has to keep up with thousands of pods); any error relists after a short pause, so the simulator
converges on the API's view however the watch breaks.
"""

from __future__ import annotations

import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Self

import orjson
import yaml
from kubernetes import client
from kubernetes import config as _config
from kubernetes.watch import watch as _watch

from gpu_efficiency.api.names import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpu_efficiency.sources.kube.watch import abort_stream
from gpu_efficiency_sim.allocation import PodInfo, claim_devices, pod_from_json
from gpu_efficiency_sim.gpu_models import DEFAULT_MODEL, find_model
from gpu_efficiency_sim.simulator import SLICES_LABEL, SimNode

log = logging.getLogger(__name__)

# The client's partial annotations make mypy --strict reject calls; treat it as untyped.
config: Any = _config
iter_resp_lines: Any = _watch.iter_resp_lines


def api_client(kubeconfig: str | None = None) -> Any:
    """An ApiClient from ``kubeconfig``, $KUBECONFIG/~/.kube/config, or the in-cluster service account."""
    try:
        return config.new_client_from_config(config_file=kubeconfig)
    except config.ConfigException as e:
        if kubeconfig:
            raise config.ConfigException(f"kubeconfig {kubeconfig}: {e}") from None
        problem = str(e)
    except (TypeError, ValueError, AttributeError, yaml.YAMLError) as e:  # a file that is not a kubeconfig
        raise config.ConfigException(f"invalid kubeconfig {kubeconfig or '$KUBECONFIG'}: {e}") from None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise config.ConfigException(
            f"no usable kubeconfig ({where}: {problem}) and not in a cluster"
        ) from None
    return client.ApiClient()


class PodWatcher:
    """Keeps ``on_change`` fed with every GPU pod in the cluster (or one namespace)."""

    def __init__(
        self,
        api: Any,
        on_change: Callable[[list[PodInfo]], None],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        watch_timeout_s: int = 60,
    ) -> None:
        self._core: Any = client.CoreV1Api(api)
        self._on_change = on_change
        self._namespace = namespace
        self._selector = label_selector
        self._timeout = watch_timeout_s
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name="sim-pod-watch", daemon=True)
        self._publisher = threading.Thread(target=self._publish_loop, name="sim-pod-publish", daemon=True)

    def start(self) -> PodWatcher:
        self._thread.start()
        self._publisher.start()
        return self

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list has been delivered."""
        return self._synced.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        if self._response is not None:
            abort_stream(self._response, "pod watch")
        self._dirty.set()
        self._thread.join(timeout=5)
        self._publisher.join(timeout=5)

    def _list(self, **kwargs: Any) -> Any:
        common: dict[str, Any] = {"_preload_content": False}
        if self._selector:
            common["label_selector"] = self._selector
        if self._namespace:
            return self._core.list_namespaced_pod(self._namespace, **common, **kwargs)
        return self._core.list_pod_for_all_namespaces(**common, **kwargs)

    def _publish_loop(self) -> None:
        """Coalesce bursts of watch events (thousands at start-up) into a few updates a second."""
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            self._dirty.clear()
            with self._lock:
                pods = list(self._pods.values())
            try:
                self._on_change(pods)
            except Exception:  # a bad update must not stop attribution for good
                log.exception("applying a pod update failed")
            self._stop.wait(0.2)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._relist()
                self._synced.set()
                while not self._stop.is_set():
                    version = self._watch(version)
            except _RelistError:
                log.debug("pod watch expired; relisting")
            except Exception:  # keep the simulator alive through API hiccups
                if not self._stop.is_set():
                    log.warning("pod watch failed; relisting in 1s", exc_info=True)
                    self._stop.wait(1.0)

    def _relist(self) -> str:
        response = self._list(_request_timeout=30)
        body = orjson.loads(response.data)
        pods = {}
        for item in body.get("items") or ():
            pod = pod_from_json(item)
            if pod is not None:
                pods[pod.uid] = pod
        with self._lock:
            self._pods = pods
        self._dirty.set()
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        response = self._list(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._timeout,
            _request_timeout=(10, self._timeout + 30),
        )
        self._response = response
        try:
            for line in iter_resp_lines(response):
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise _RelistError(str(obj.get("message", "")))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                uid = str((obj.get("metadata") or {}).get("uid", ""))
                pod = pod_from_json(obj) if kind != "DELETED" else None
                with self._lock:
                    changed = uid in self._pods or pod is not None
                    if pod is None:
                        self._pods.pop(uid, None)
                    else:
                        self._pods[uid] = pod
                if changed:
                    self._dirty.set()
        finally:
            self._response = None
            response.release_conn()
        return version


class _RelistError(Exception):
    """The watch's resourceVersion is gone (410) or the server sent an error: relist."""


def node_from_json(obj: Mapping[str, Any]) -> SimNode | None:
    """A SimNode for a node with ``nvidia.com/gpu`` capacity, its model from the product label and
    its time-slicing from ``nvidia.com/gpu.replicas`` (capacity = GPUs x replicas)."""
    meta = obj.get("metadata") or {}
    capacity = ((obj.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
    if capacity is None:
        return None
    labels = meta.get("labels") or {}
    try:
        devices = int(str(capacity))
        slices = max(1, int(str(labels.get(SLICES_LABEL, "1"))))
    except ValueError:
        return None
    gpus = devices // slices
    if gpus < 1:
        return None
    product = str(labels.get(GPU_PRODUCT_LABEL, ""))
    try:
        model = find_model(product) if product else DEFAULT_MODEL
    except ValueError:
        log.warning(
            "node %s: unknown GPU product %r, simulating %s", meta.get("name"), product, DEFAULT_MODEL.product
        )
        model = DEFAULT_MODEL
    return SimNode(str(meta.get("name", "")), gpus, model, slices)


class _Poller(ABC):
    """A daemon thread calling ``poll`` every ``interval_s``; a failed poll keeps the last state.
    Abstract: a subclass that lacks ``poll`` cannot be built (rather than failing in its thread)."""

    def __init__(self, interval_s: float, name: str, what: str) -> None:
        self._interval, self._what = interval_s, what
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @abstractmethod
    def poll(self) -> object:
        """One poll: read the cluster and hand what changed on (the result is for direct callers)."""

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception:  # keep serving the last state
                log.warning("%s failed", self._what, exc_info=True)


class NodePoller(_Poller):
    """Serve mode: simulate every node matching a label selector; polled, nodes change rarely."""

    def __init__(
        self,
        api: Any,
        on_change: Callable[[list[SimNode]], None],
        *,
        label_selector: str,
        interval_s: float = 5.0,
    ) -> None:
        super().__init__(interval_s, "sim-node-poll", "listing nodes")
        self._core: Any = client.CoreV1Api(api)
        self._on_change = on_change
        self._selector = label_selector
        self._last: list[SimNode] | None = None

    def poll(self) -> list[SimNode]:
        response = self._core.list_node(
            label_selector=self._selector, _preload_content=False, _request_timeout=30
        )
        body = orjson.loads(response.data)
        nodes = [n for item in body.get("items") or () if (n := node_from_json(item)) is not None]
        nodes.sort(key=lambda n: n.name)
        if nodes != self._last:
            self._last = nodes
            self._on_change(nodes)
        return nodes


class ClaimPoller(_Poller):
    """Which DRA GPUs each pod was allocated: ResourceClaims listed every second (the scheduler's
    choice, which the simulator attributes metrics by)."""

    def __init__(
        self, api: Any, on_change: Callable[[dict[str, tuple[int, ...]]], None], *, interval_s: float = 1.0
    ) -> None:
        super().__init__(interval_s, "sim-claim-poll", "listing resource claims")
        self._api: Any = client.CustomObjectsApi(api)
        self._on_change = on_change

    def poll(self) -> dict[str, tuple[int, ...]]:
        body = self._api.list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims")
        devices = claim_devices(body.get("items") or ())
        self._on_change(devices)
        return devices
