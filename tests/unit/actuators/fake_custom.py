"""An in-memory CustomObjectsApi for owner writes: merge patches, /scale, uid and resourceVersion
preconditions answered with 409 as the API server does, and a hook to fail one operation."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes.client.exceptions import ApiException

Key = tuple[str, str, str, str, str]  # group, version, namespace, plural, name


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            child = target.setdefault(key, {})
            merge(child, value)
        else:
            target[key] = value


class FakeCustom:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.fail: dict[str, int] = {}  # operation -> HTTP status, once
        self.always: dict[str, int] = {}  # operation -> HTTP status, every time
        self.on: dict[str, Any] = {}  # operation -> callable run before it (a concurrent writer)
        #: operation -> exception raised once *after* it was applied (a 504 or timeout after commit)
        self.after: dict[str, BaseException] = {}
        self.policies: list[dict[str, Any]] = []  # GPUEfficiencyPolicies, for their status

    def record(self, key: Key, kind: str, action: str = "ScaleToZero", replicas: int | None = None) -> None:
        """A policy's status.reclamations records reclaiming the object at ``key`` (its uid)."""
        obj = self.objects[key]
        record = {
            "owner": f"{key[2]}/{kind}/{key[4]}", "uid": obj["metadata"]["uid"], "action": action,
            "time": "2023-11-14T22:13:20Z", "replicas": replicas,
        }  # fmt: skip
        self.policies.append(
            {"metadata": {"name": f"p{len(self.policies)}"}, "status": {"reclamations": [record]}}
        )

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, *, field_selector: str = ""
    ) -> Any:
        self.calls.append("list")
        status = self.fail.pop("list", None)
        if status is not None:
            raise ApiException(status=status, reason="Injected")
        name = field_selector.removeprefix("metadata.name=")
        items = [
            o
            for k, o in self.objects.items()
            if k[:4] == (group, version, namespace, plural) and k[4] == name
        ]
        return {"items": copy.deepcopy(items)}

    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> Any:
        self.calls.append("list policies")
        status = self.fail.pop("list policies", None)
        if status is not None:
            raise ApiException(status=status, reason="Injected")
        assert (group, plural) == ("gpuefficiency.io", "gpuefficiencypolicies")
        return {"items": copy.deepcopy(self.policies)}

    def add(
        self, key: Key, *, replicas: int | None = None, annotations: dict[str, str] | None = None, **spec: Any
    ) -> dict[str, Any]:
        obj = {
            "metadata": {
                "name": key[4],
                "namespace": key[2],
                "uid": f"uid-{key[4]}",
                "resourceVersion": "1",
                "annotations": dict(annotations or {}),
            },
            "spec": ({"replicas": replicas} if replicas is not None else {}) | spec,
        }
        self.objects[key] = obj
        return obj

    def _begin(self, op: str, key: Key) -> dict[str, Any]:
        self.calls.append(op)
        hook = self.on.pop(op, None)
        if hook is not None:
            hook(self)
        status = self.fail.pop(op, None) or self.always.get(op)
        if status is not None:
            raise ApiException(status=status, reason="Injected")
        if key not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return self.objects[key]

    def _write(self, obj: dict[str, Any], patch: dict[str, Any]) -> None:
        meta = patch.get("metadata") or {}
        if "uid" in meta and meta["uid"] != obj["metadata"]["uid"]:
            raise ApiException(status=409, reason="Conflict: uid")
        if meta.get("resourceVersion") and meta["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict: resourceVersion")
        patch = copy.deepcopy(patch)
        patch.get("metadata", {}).pop("resourceVersion", None)
        merge(obj, patch)
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any:
        return copy.deepcopy(self._begin("get", (group, version, namespace, plural, name)))

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **kwargs: Any
    ) -> Any:
        assert kwargs.get("_content_type") == "application/merge-patch+json"
        obj = self._begin("patch", (group, version, namespace, plural, name))
        self._write(obj, body)
        self._committed("patch")
        return copy.deepcopy(obj)

    def _committed(self, op: str) -> None:
        exc = self.after.pop(op, None)
        if exc is not None:
            raise exc

    def get_namespaced_custom_object_scale(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any:
        obj = self._begin("get scale", (group, version, namespace, plural, name))
        return {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": {"replicas": obj["spec"].get("replicas", 1)},
        }

    def patch_namespaced_custom_object_scale(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **kwargs: Any
    ) -> Any:
        assert kwargs.get("_content_type") == "application/merge-patch+json"
        obj = self._begin("patch scale", (group, version, namespace, plural, name))
        self._write(
            obj, {"metadata": body.get("metadata") or {}, "spec": {"replicas": body["spec"]["replicas"]}}
        )
        self._committed("patch scale")
        return {"spec": {"replicas": obj["spec"]["replicas"]}}
