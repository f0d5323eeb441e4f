"""Which scrape target to believe for a GPU (safety rule 9: trust the source, not the series).

Any tenant who can add a scrape target (a ServiceMonitor or PodMonitor for a pod of their own)
can publish series with any labels: a real GPU's UUID, its node's ``Hostname``, an XID. Labels
prove nothing; where a series came from does. Prometheus sets every series' ``instance`` to the
address it scraped, and the cluster says where that address is: a pod's IP is on the pod's node, a
node's own addresses (and its name, which ``instance`` is often relabelled to) on that node. So:

- a GPU's identity (UUID -> node, and the pods on it) is believed only from a target on that node:
  a dcgm-exporter (or node-agent) DaemonSet pod, or a hostNetwork one at its node's address;
- a GPU that no target on its node reports is dropped whole (``DropReason.IDENTITY_OFF_NODE``): an invented
  UUID is then never a GPU of the node it names, and never fills its capacity;
- a fault window counts only from the targets that report the GPU's identity on its node; any
  other target's fault series for that GPU are dropped (``DropReason.FAULT_OFF_TARGET``).

What this cannot tell apart: a target whose ``instance`` its owner rewrote (ServiceMonitor
``relabelings``, or ``honorLabels: true`` with an ``instance`` label in the exposition) to an
exporter's address, and a tenant pod on the same node reporting that node's GPUs. Safety rule 9 in
docs/safety.md says what then still holds (a drain or NoExecute needs a second source).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpu_efficiency.engine.model import NodeView


@dataclass(frozen=True, slots=True)
class PodAddress:
    """A live pod's IPs (none once it has finished) and node: where a scrape target at them runs."""

    uid: str
    ips: tuple[str, ...]
    node: str


def target_host(instance: str) -> str:
    """The host of an ``instance`` (``10.1.2.3:9400``, ``[fd00::1]:9400``, ``node-0``)."""
    if instance.startswith("["):
        return instance[1 : instance.find("]")] if "]" in instance else ""
    if instance.count(":") == 1:
        return instance.split(":", 1)[0]
    return instance  # no port, or a bare IPv6 address


def address_book(nodes: Iterable[NodeView], pods: Iterable[PodAddress]) -> dict[str, str]:
    """Address -> node: every node's name and addresses, every live pod's IP. An address two nodes
    claim (a reused IP seen twice in a watch's lag) names neither: it is left out."""
    book: dict[str, str] = {}
    ambiguous: set[str] = set()

    def put(address: str, node: str) -> None:
        if not address or not node:
            return
        if book.setdefault(address, node) != node:
            ambiguous.add(address)

    for node in nodes:
        put(node.name, node.name)
        for address in node.addresses:
            put(address, node.name)
    for pod in pods:
        for ip in pod.ips:
            put(ip, pod.node)
    for address in ambiguous:
        del book[address]
    return book


def node_of_target(instance: str, book: Mapping[str, str]) -> str:
    """The node a scrape target runs on ('' when the cluster does not know its address)."""
    return book.get(target_host(instance), "") if instance else ""


def locator(book: Mapping[str, str]) -> Callable[[str], str]:
    """``node_of_target`` over ``book``, each target resolved once (thousands of GPUs share a few
    targets per node)."""
    return functools.cache(lambda instance: node_of_target(instance, book))


def on_node_targets(claims: Mapping[str, str], locate: Callable[[str], str]) -> dict[str, str]:
    """Of ``claims`` (target -> the node it says the GPU is on), those made from that very node."""
    return {t: node for t, node in claims.items() if node and locate(t) == node}


def merged_rows(rows: Iterable[list[float]]) -> list[float]:
    """Aggregate rows of one signal from several trusted targets, combined as ``max by (UUID)``
    combined every series of a GPU before targets were kept apart: the larger of each field."""
    out: list[float] = []
    for row in rows:
        if not out:
            out = list(row)
            continue
        out = [b if math.isnan(a) or b > a else a for a, b in zip(out, row, strict=True)]
    return out
