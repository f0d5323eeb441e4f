"""Run a scenario file in the background while a test acts on the cluster (procedural e2e tests).

The scenario file sets the stage (fake GPU nodes, the simulator and its faults, the policy, the
operator as a process with the chart's RBAC) and checks what it can express; the test adds the steps
the format cannot (an admin's kubectl, a DaemonSet, counting evictions per cycle) and asserts on
them. Files driven this way live in ``scenarios/procedural/``, which test_scenarios.py does not run.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client

from gpu_efficiency_sim.runner import RunOptions, ScenarioResult, ScenarioRun
from gpu_efficiency_sim.scenario import load_scenario
from tests.e2e.harness import Cluster, OperatorIdentity

PROCEDURAL = Path(__file__).parent / "scenarios" / "procedural"


class BackgroundScenario:
    """``with BackgroundScenario(...) as bg:`` starts the run and returns at t=0 (workloads submitted)."""

    def __init__(
        self,
        name: str,
        cluster: Cluster,
        identity: OperatorIdentity,
        log_dir: Path,
        before_teardown: Any = None,
        operator_args: tuple[str, ...] = (),
    ) -> None:
        """``operator_args``: flags added to the operator's command line."""
        self.lines: list[str] = []
        self._t0 = threading.Event()
        self.result: ScenarioResult | None = None
        operator_cmd = identity.run_command(cluster, *operator_args)
        self.run = ScenarioRun(
            load_scenario(PROCEDURAL / f"{name}.yaml"),
            RunOptions(
                kubeconfig=cluster.kubeconfig,
                prometheus_url=cluster.prometheus_url,
                targets_dir=cluster.prometheus_targets_dir(),
                operator=True,
                operator_cmd=operator_cmd,
                operator_env={"KUBECONFIG": identity.kubeconfig},
                namespace_prefix=f"e2e-{uuid.uuid4().hex[:4]}-",
                log_dir=log_dir,
                output=self._say,
                before_teardown=before_teardown,
            ),
        )
        self._thread = threading.Thread(target=self._main, name=f"scenario-{name}", daemon=True)

    def _say(self, line: str) -> None:
        self.lines.append(line)
        if " t=0, " in line:
            self._t0.set()

    def _main(self) -> None:
        try:
            self.result = self.run.run()
        finally:
            self._t0.set()  # a failed setup must not leave the test waiting

    def __enter__(self) -> BackgroundScenario:
        self._thread.start()
        self._t0.wait(300)
        if self.run.sim is None or not self._thread.is_alive():
            self._thread.join(60)
            raise AssertionError("the scenario did not start:\n" + self.report())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.stop()
        self._thread.join(600)

    def stop(self) -> None:
        """Decide every pending expectation now (failed) so the run tears down early."""
        self.run.tracker.abandon(self.elapsed(), "the procedural test stopped the run")

    def elapsed(self) -> float:
        """Scenario time: seconds since the workloads were submitted."""
        assert self.run.sim is not None
        return self.run.sim.elapsed()

    def sleep_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.elapsed()))

    def namespace(self, scenario_name: str) -> str:
        """A scenario namespace as created (with this run's prefix)."""
        return self.run.namespaces[scenario_name]

    def finish(self) -> ScenarioResult:
        """Wait for the run to end (its last deadline) and return its result."""
        self._thread.join(600)
        assert self.result is not None, self.report()
        return self.result

    def report(self) -> str:
        return scenario_report(self.lines, self.result)


def scenario_report(lines: list[str], result: ScenarioResult | None) -> str:
    """A run's lines for a failed assertion, its failed expectations and errors first: CI prints
    only the head and the tail of a long report, and the middle is where a failure's line would be."""
    failed = [line for line in lines if line.lstrip().startswith(("FAIL", "ERROR"))]
    text = "\n".join([*(["failed:", *failed, "----- the whole run -----"] if failed else []), *lines])
    log = result.operator_log if result else None
    if log is not None and log.exists():
        text += "\n----- operator log (tail) -----\n" + log.read_text(errors="replace")[-4000:]
    return text


def node_taints(core: client.CoreV1Api, name: str) -> list[tuple[str, str, str]]:
    """(key, value, effect) of every taint on the node."""
    node = core.read_node(name)
    return [(t.key, t.value or "", t.effect) for t in (node.spec.taints or [])]


def node_events(core: client.CoreV1Api, name: str, reason: str) -> list[client.CoreV1Event]:
    """Events about this node object, not about an earlier node of the same name (node events
    outlive their node by an hour, and scenario node names repeat from run to run)."""
    born = core.read_node(name).metadata.creation_timestamp
    events = core.list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind=Node,involvedObject.name={name},reason={reason}"
    )
    return [e for e in events.items if e.metadata.creation_timestamp >= born]
