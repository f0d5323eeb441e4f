"""DeviceTaintRule writes for single-GPU quarantine (resource.k8s.io/v1beta2).

One rule per faulty device, selecting exactly it (driver, pool, device), with our taint key, the
fault kind as value and the policy's effect; labelled as ours, so only ours are ever read or
changed. Names are derived from the kind and the device, so two replicas (or a retry) create the
same object and the second create is answered 409 and read as done. Every function lists our
rules for the node and kind first and writes only the difference (``Result.NOOP`` when none).
"""

from __future__ import annotations

from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api.names import (
    DEVICE_RULE_KIND_LABEL,
    FAULT_TAINT_KEY,
)
from gpu_efficiency.engine.model import DeviceRule, TaintDevices, UntaintDevices
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.objects.dra import (
    GROUP,
    OURS,
    RULE_VERSION,
    parse_rules,
    rule_body,
    rule_name,
)

PLURAL = "devicetaintrules"


class RuleApi(Protocol):
    """The CustomObjectsApi methods used here (a fake implements them in unit tests)."""

    def list_cluster_custom_object(
        self, group: str, version: str, plural: str, *, label_selector: str | None = None
    ) -> Any: ...

    def create_cluster_custom_object(self, group: str, version: str, plural: str, body: Any) -> Any: ...

    def patch_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, body: Any
    ) -> Any: ...

    def delete_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> Any: ...


def _ours(api: RuleApi, node: str, kind: str) -> list[DeviceRule]:
    listed = api.list_cluster_custom_object(
        GROUP, RULE_VERSION, PLURAL, label_selector=f"{OURS},{DEVICE_RULE_KIND_LABEL}={kind}"
    )
    return [r for r in parse_rules(listed.get("items") or []) if r.node == node and r.kind == kind]


def _failed(action: TaintDevices | UntaintDevices, exc: ApiException) -> Outcome:
    return Outcome(action, Result.FAILED, f"HTTP {exc.status}: {exc.reason}")


def taint_devices(api: RuleApi, action: TaintDevices) -> Outcome:
    """Our rules for the node and kind become exactly one per device of ``action`` with its effect."""
    try:
        held = {r.key: r for r in _ours(api, action.node, action.kind)}
        done: list[str] = []
        for device in action.devices:
            rule = held.pop(device.key, None)
            if rule is None:
                try:
                    api.create_cluster_custom_object(
                        GROUP, RULE_VERSION, PLURAL, rule_body(action.kind, action.effect, device)
                    )
                except ApiException as exc:
                    if exc.status != 409:  # 409: another replica or an earlier try made it
                        raise
                done.append(f"created {rule_name(action.kind, device)}")
            elif rule.effect != action.effect:
                patch = {
                    "spec": {"taint": {"key": FAULT_TAINT_KEY, "value": action.kind, "effect": action.effect}}
                }
                api.patch_cluster_custom_object(GROUP, RULE_VERSION, PLURAL, rule.name, patch)
                done.append(f"set {rule.name} to {action.effect}")
        for rule in held.values():
            _delete(api, rule.name)
            done.append(f"deleted {rule.name}")
    except ApiException as exc:
        return _failed(action, exc)
    if not done:
        return Outcome(action, Result.NOOP, "device taints already so")
    return Outcome(action, Result.DONE, "; ".join(done))


def untaint_devices(api: RuleApi, action: UntaintDevices) -> Outcome:
    """Delete our rules for the node and kind."""
    try:
        names = [r.name for r in _ours(api, action.node, action.kind)]
        for name in names:
            _delete(api, name)
    except ApiException as exc:
        return _failed(action, exc)
    if not names:
        return Outcome(action, Result.NOOP, "no device taint of ours")
    return Outcome(action, Result.DONE, f"deleted {', '.join(names)}")


def _delete(api: RuleApi, name: str) -> None:
    try:
        api.delete_cluster_custom_object(GROUP, RULE_VERSION, PLURAL, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
