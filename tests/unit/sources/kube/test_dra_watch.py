"""ResourceSlices and our DeviceTaintRules from watches: no request in a steady cycle, changes seen
without a LIST, and DraReader's safety kept (not served, not synced, blind, read-your-writes)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from tests.unit.sources.kube.fake_watch_api import FakeListApi, FakeStream, bookmark, event, wait_until

from gpu_efficiency.engine.model import DraDevice, TaintDevices
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.metrics import REGISTRY
from gpu_efficiency.objects.dra import rule_body
from gpu_efficiency.runtime.deps import feed_writes
from gpu_efficiency.sources.kube.dra import DraReader, DraState
from gpu_efficiency.sources.kube.dra_cache import DraCache, WatchedDraReader
from gpu_efficiency.sources.kube.watch import Backoff

FAST = Backoff(initial=0.001, maximum=0.002)
FALLBACKS = "gpu_efficiency_cache_fallback_lists_total"
DRIVER = "gpu.nvidia.com"


def gpu(node: str, index: int) -> DraDevice:
    return DraDevice(DRIVER, node, f"gpu-{index}", node, f"GPU-{node}-{index}")


def slice_(node: str, rv: int, gpus: int = 2, generation: int = 1) -> dict[str, Any]:
    devices = [
        {"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{node}-{i}"}}} for i in range(gpus)
    ]
    return {
        "metadata": {
            "name": f"{node}-{DRIVER}",
            "uid": f"slice-{node}-{generation}",
            "resourceVersion": str(rv),
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def rule(device: DraDevice, rv: int) -> dict[str, Any]:
    body = rule_body("xid", "NoExecute", device)
    body["metadata"].update(uid=f"rule-{device.node}-{device.device}", resourceVersion=str(rv))
    return body


class Server:
    """One API server's slices and rules: the watches (``FakeListApi``) and a plain LIST of them
    (the fallback's ``list_cluster_custom_object``) see the same objects."""

    def __init__(self, slices: list[dict[str, Any]], rules: list[dict[str, Any]], rv: int = 100) -> None:
        self.slices = FakeListApi(slices, rv=rv)
        self.rules = FakeListApi(rules, rv=rv)
        self.lists: list[str] = []  # plurals LISTed by the cycle (not the informers)
        self.fail: int | None = None

    def list_cluster_custom_object(
        self, group: str, version: str, plural: str, *, label_selector: str | None = None
    ) -> Any:
        self.lists.append(plural)
        if self.fail is not None:
            raise ApiException(status=self.fail, reason="nope")
        source = self.slices if plural == "resourceslices" else self.rules
        return {"items": list(source.objects), "metadata": {"resourceVersion": str(source.rv)}}


@pytest.fixture
def readers() -> Iterator[list[WatchedDraReader]]:
    made: list[WatchedDraReader] = []
    yield made
    for reader in made:
        reader.stop()


def watched(
    server: Server, made: list[WatchedDraReader], *, sync: bool = True, **options: Any
) -> WatchedDraReader:
    options.setdefault("backoff", FAST)
    reader = WatchedDraReader(DraCache(server.slices, server.rules, **options), DraReader(server))
    made.append(reader)
    reader.start()
    if sync:
        assert reader.cache.slices.wait_synced(5)
        assert reader.cache.rules.wait_synced(5)
    return reader


def streams(server: Server) -> tuple[FakeStream, FakeStream]:
    return server.slices.next_watch(), server.rules.next_watch()


def test_a_steady_cycle_makes_no_request(readers: list[WatchedDraReader]) -> None:
    server = Server([slice_("n1", 50), slice_("n2", 51)], [rule(gpu("n1", 1), 60)])
    streams(server)
    reader = watched(server, readers)
    for _ in range(5):
        state = reader.read()
        assert [d.uuid for d in state.devices] == ["GPU-n1-0", "GPU-n1-1", "GPU-n2-0", "GPU-n2-1"]
        assert [(r.node, r.device) for r in state.rules] == [("n1", "gpu-1")]
        assert not state.error
        assert not state.blind
    assert reader.requests == 0
    assert server.lists == []
    assert (server.slices.lists, server.rules.lists) == (1, 1)  # the informers' first LIST only


def test_a_cluster_without_dra_gpus_makes_no_request_either(readers: list[WatchedDraReader]) -> None:
    server = Server([], [])
    streams(server)
    reader = watched(server, readers)
    for _ in range(3):
        assert reader.read() == DraState()
    assert reader.requests == 0
    assert server.lists == []


def test_a_new_slice_and_a_new_generation_are_seen_without_a_list(readers: list[WatchedDraReader]) -> None:
    server = Server([slice_("n1", 50)], [])
    slices, _ = streams(server)
    reader = watched(server, readers)
    slices.put(event("ADDED", slice_("n2", 101, gpus=1)))
    wait_until(lambda: len(reader.read().devices) == 3)
    # The driver republishes n1's pool with one GPU fewer: the old generation no longer counts.
    slices.put(event("ADDED", slice_("n1", 102, gpus=1, generation=2)))
    wait_until(lambda: [d.uuid for d in reader.read().devices] == ["GPU-n1-0", "GPU-n2-0"])
    assert reader.requests == 0
    assert server.lists == []
    assert server.slices.lists == 1


def test_our_rule_deleted_by_an_admin_is_seen_without_a_list(readers: list[WatchedDraReader]) -> None:
    ours = rule(gpu("n1", 1), 60)
    server = Server([slice_("n1", 50)], [ours])
    _, rules = streams(server)
    reader = watched(server, readers)
    assert len(reader.read().rules) == 1
    server.rules.objects.clear()
    rules.put(event("DELETED", ours))
    wait_until(lambda: reader.read().rules == ())
    assert reader.requests == 0
    assert server.lists == []


@pytest.mark.parametrize(("kind", "status"), [("slices", 404), ("rules", 404), ("rules", 403)])
def test_not_served_or_not_allowed_means_node_taints_asked_again_once_a_minute(
    readers: list[WatchedDraReader], kind: str, status: int
) -> None:
    server = Server([slice_("n1", 50)], [])
    streams(server)
    failing = server.slices if kind == "slices" else server.rules
    failing.list_errors = [ApiException(status=status, reason="nope") for _ in range(100)]
    server.fail = status  # a LIST from the cycle would be refused too (it must not make one)
    reader = watched(server, readers, sync=False)
    informer = reader.cache.slices if kind == "slices" else reader.cache.rules
    wait_until(lambda: informer.error is not None)
    for _ in range(3):
        state = reader.read()
        assert (state.devices, state.rules, state.blind) == ((), (), False)
        assert "faults taint nodes" in state.error
    time.sleep(0.3)  # with the plain backoff (FAST) it would have retried a hundred times by now
    assert failing.lists == 1
    assert reader.requests == 0
    assert server.lists == []


def test_not_synced_lists_instead_counted_then_reads_the_watch(readers: list[WatchedDraReader]) -> None:
    server = Server([slice_("n1", 50)], [rule(gpu("n1", 0), 60)])
    streams(server)
    gate = server.slices.list_gate = threading.Event()
    reader = watched(server, readers, sync=False)
    fallbacks = REGISTRY.get_sample_value(FALLBACKS, {"resource": "resourceslices"}) or 0.0
    state = reader.read()
    assert REGISTRY.get_sample_value(FALLBACKS, {"resource": "resourceslices"}) == fallbacks + 1
    assert [d.uuid for d in state.devices] == ["GPU-n1-0", "GPU-n1-1"]
    assert len(state.rules) == 1
    assert sorted(server.lists) == ["devicetaintrules", "resourceslices"]
    assert reader.requests == 2
    gate.set()
    assert reader.cache.slices.wait_synced(5)
    assert reader.read().devices == state.devices
    assert reader.requests == 2


def test_unsynced_and_a_failed_list_with_nothing_read_before_is_blind(
    readers: list[WatchedDraReader],
) -> None:
    server = Server([slice_("n1", 50)], [])
    streams(server)
    gate = server.slices.list_gate = threading.Event()
    server.fail = 500
    reader = watched(server, readers, sync=False)
    state = reader.read()
    assert state.blind
    assert "500" in state.error
    assert reader.requests == 1
    gate.set()
    wait_until(lambda: server.slices.opened)  # stopped once watching (the stream unblocks it)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_watch_broken_too_long_lists_and_a_failed_list_keeps_the_last_good_state(
    readers: list[WatchedDraReader],
) -> None:
    server = Server([slice_("n1", 50)], [rule(gpu("n1", 0), 60)])
    slices, _ = streams(server)
    clock = Clock()
    reader = watched(server, readers, clock=clock, max_broken=75.0, backoff=Backoff(initial=60, maximum=60))
    good = reader.read()
    assert len(good.devices) == 2
    assert len(good.rules) == 1
    assert reader.requests == 0
    slices.fail(ConnectionResetError("gone"))
    wait_until(lambda: reader.cache.slices.error is not None)
    assert reader.read() == good
    assert reader.requests == 0
    clock.now += 76
    server.slices.objects.append(slice_("n2", 120))
    listed = reader.read()  # the watch cannot be vouched for: LIST, counted
    assert len(listed.devices) == 4
    assert reader.requests == 2
    server.fail = 500
    clock.now += 60
    stale = reader.read()
    assert (stale.devices, stale.rules) == (listed.devices, listed.rules)
    assert not stale.blind
    assert "500" in stale.error


def test_our_own_writes_are_read_back_by_the_next_cycle_though_the_watch_is_late(
    readers: list[WatchedDraReader],
) -> None:
    server = Server([slice_("n1", 50)], [])
    _, rules = streams(server)
    reader = watched(server, readers)
    assert reader.read().rules == ()
    created = rule(gpu("n1", 1), 130)
    server.rules.objects.append(created)  # our create: the server has it, the watch not yet
    server.rules.rv = 130
    reader.rules_written()
    assert [r.device for r in reader.read().rules] == ["gpu-1"]
    assert server.lists == ["devicetaintrules"]
    assert reader.requests == 1
    assert [r.device for r in reader.read().rules] == ["gpu-1"]  # the watch is still behind: LIST
    assert reader.requests == 2
    rules.put(event("ADDED", created), bookmark(140))
    wait_until(lambda: reader.cache.rules.resource_version == "140")
    assert [r.device for r in reader.read().rules] == ["gpu-1"]  # past the LIST: the watch again
    assert reader.requests == 2
    server.rules.objects.clear()  # our delete, its event late too
    server.rules.rv = 150
    reader.rules_written()
    assert reader.read().rules == ()
    assert reader.read().rules == ()  # still from a LIST: the watch shows the rule yet
    assert reader.requests == 4
    rules.put(event("DELETED", created))
    wait_until(lambda: reader.cache.rules.snapshot() == ())
    assert reader.read().rules == ()
    assert reader.requests == 5  # the LIST that saw the watch had caught up
    assert reader.read().rules == ()
    assert reader.requests == 5


def test_a_write_whose_event_arrives_before_the_next_cycle_costs_one_list(
    readers: list[WatchedDraReader],
) -> None:
    server = Server([slice_("n1", 50)], [])
    _, rules = streams(server)
    reader = watched(server, readers)
    created = rule(gpu("n1", 1), 130)
    server.rules.objects.append(created)
    server.rules.rv = 130
    reader.rules_written()
    rules.put(event("ADDED", created))
    wait_until(lambda: reader.cache.rules.snapshot())
    for _ in range(3):
        assert [r.device for r in reader.read().rules] == ["gpu-1"]
    assert reader.requests == 1


def test_a_failed_list_after_our_write_is_blind_not_an_admins_removal(
    readers: list[WatchedDraReader],
) -> None:
    server = Server([slice_("n1", 50)], [])
    streams(server)
    reader = watched(server, readers)
    reader.read()
    server.rules.objects.append(rule(gpu("n1", 1), 130))
    reader.rules_written()
    server.fail = 503
    state = reader.read()
    assert state.blind
    assert "503" in state.error
    server.fail = None
    assert len(reader.read().rules) == 1  # asked again, and seen


def test_a_rule_write_is_fed_to_the_dra_reader() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.written = 0

        def rules_written(self) -> None:
            self.written += 1

        def pod_written(self, obj: Any) -> None: ...

        def node_written(self, obj: Any) -> None: ...

        def pod_evicted(self, uid: str) -> None: ...

    dra, cluster = Recorder(), Recorder()
    action = TaintDevices(node="n1", kind="xid", effect="NoExecute", devices=(gpu("n1", 1),))
    for result in (Result.DONE, Result.FAILED, Result.NOOP):
        feed_writes(cluster, dra, Outcome(action, result, ""))  # type: ignore[arg-type]
    assert dra.written == 2  # a failed write may have written part of its rules; a no-op wrote none


def test_the_listing_reader_reads_our_rules_after_a_write_and_is_blind_if_it_cannot() -> None:
    """DraReader (one-shot commands, the watches' fallback): a cluster with no DRA GPU skips reads
    between slice reads, but not the one after our write; a failed read then is blind, since the
    last good read predates the write."""
    server = Server([], [])
    now = [0.0]
    reader = DraReader(server, clock=lambda: now[0])
    assert reader.read() == DraState()
    now[0] = 30.0
    server.rules.objects.append(rule(gpu("n1", 1), 130))
    reader.rules_written()
    assert len(reader.read().rules) == 1
    reader.rules_written()
    server.fail = 500
    now[0] = 40.0
    assert reader.read().blind


def test_an_expected_refusal_is_logged_once_not_at_every_retry(
    readers: list[WatchedDraReader], caplog: pytest.LogCaptureFixture
) -> None:
    server = Server([], [])
    streams(server)
    server.rules.list_errors = [ApiException(status=404, reason="Not Found") for _ in range(100)]
    caplog.set_level(logging.INFO, logger="gpu_efficiency.sources.kube.watch")
    watched(server, readers, sync=False, retry_after=lambda exc: 0.001)
    wait_until(lambda: server.rules.lists >= 5)
    said = [
        r for r in caplog.records if r.name == "gpu_efficiency.sources.kube.watch" and "failed" in r.message
    ]
    assert [(r.levelname, r.message) for r in said] == [
        ("INFO", "devicetaintrules: list failed (ApiException: HTTP 404: Not Found); retrying in 0.0s")
    ]
