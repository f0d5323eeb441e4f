"""Session fixtures for e2e tests: real API server, real Prometheus, the operator as a process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.e2e import ordering
from tests.e2e.harness import (
    Cluster,
    OperatorIdentity,
    OperatorProcess,
    create_namespace,
    delete_namespace,
    drop_lease_of,
    install_crds,
    install_operator_rbac,
    start_cluster,
    stop_cluster,
)

WORKER_PORT_STRIDE = 1000  # worker gwN's cluster listens on the default ports + N * 1000


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make e2e` runs two workers) every worker has a local cluster of its own:
    gw0 the default one (the one `make demo` uses), gwN one in ``$GPUEFF_STATE_DIR-gwN`` on ports
    moved by N * 1000, so tests on different workers never share a Lease, a policy or a node."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    if os.environ.get("GPUEFF_USE_EXISTING_CLUSTER") == "1" and workers > 1:
        raise pytest.UsageError(
            "GPUEFF_USE_EXISTING_CLUSTER=1 runs every test on one cluster: run the e2e suite with one worker "
            "(`make e2e E2E_WORKERS=0`), since tests on parallel workers would act on each other's pods"
        )
    if not worker.startswith("gw") or worker == "gw0":
        return
    index = int(worker.removeprefix("gw"))
    base_state = os.environ.get("GPUEFF_STATE_DIR", "/tmp/gpueff-localcluster")
    base_offset = int(os.environ.get("GPUEFF_PORT_OFFSET", "0") or "0")
    os.environ["GPUEFF_STATE_DIR"] = f"{base_state}-{worker}"
    os.environ["GPUEFF_PORT_OFFSET"] = str(base_offset + index * WORKER_PORT_STRIDE)
    os.environ.pop("GPUEFF_PROMETHEUS_URL", None)  # the worker's own cluster says where its Prometheus is
    os.environ.pop("GPUEFF_PROMETHEUS_TARGETS_DIR", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Mark every e2e test; once selection is done, order them longest first, in shares xdist's
    workers end together on (ordering.py). Every worker reorders the same collection the same way
    (xdist aborts on differing collections)."""
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
    yield
    if len(items) < 2 or not all("tests/e2e" in str(item.fspath) for item in items):
        return  # a run mixing unit and e2e tests keeps its order
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    cache = getattr(config, "cache", None)  # absent with -p no:cacheprovider
    cached = cache.get(ordering.CACHE_KEY, None) if cache is not None else None
    items[:] = ordering.balanced_order(items, ordering.load_durations(cached), workers)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each passed e2e test's call time, and what each test that is run again (`make e2e`'s
    ``--reruns``) failed on the first time (the controller gets the workers' reports too)."""
    if report.when == "call" and report.passed and "tests/e2e" in report.nodeid:
        _timings[report.nodeid] = round(report.duration, 1)
    if report.outcome == "rerun":
        _reruns.append((report.nodeid, _first_failure(report.longreprtext)))


def _first_failure(text: str, lines: int = 12) -> str:
    """The lines of a failure that say what failed: a scenario's FAIL lines, else pytest's E lines."""
    failed = [line for line in text.splitlines() if "FAIL  [" in line or line.lstrip().startswith("ERROR ")]
    said = failed or [line for line in text.splitlines() if line.startswith("E ")] or text.splitlines()[-1:]
    return "\n".join(said[:lines]) or "(no report)"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A flaky test stays visible: what each rerun test failed on before it passed (or failed again)."""
    if not _reruns:
        return
    terminalreporter.section("e2e tests run again after a failure: what the first run failed on")
    for nodeid, said in _reruns:
        terminalreporter.write_line(f"{nodeid}\n{said}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if not _timings or hasattr(session.config, "workerinput") or cache is None:
        return  # only the controller (or a run without xdist) writes, once
    cache.set(ordering.CACHE_KEY, {**(cache.get(ordering.CACHE_KEY, None) or {}), **_timings})


_timings: dict[str, float] = {}
_reruns: list[tuple[str, str]] = []


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = start_cluster()
    install_crds(c)
    yield c
    stop_cluster(c)


@pytest.fixture(scope="session")
def k8s(cluster: Cluster) -> client.ApiClient:
    return cluster.api_client()


@pytest.fixture(scope="session")
def prometheus_url(cluster: Cluster) -> str:
    return cluster.prometheus_url


@pytest.fixture(scope="session")
def operator_identity(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> OperatorIdentity:
    return install_operator_rbac(cluster, tmp_path_factory.mktemp("operator"))


@pytest.fixture
def namespace(k8s: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    prefix = "t-" + request.node.name.lower().replace("_", "-")[:30].strip("-")
    name = create_namespace(k8s, prefix)
    yield name
    delete_namespace(k8s, name)


@pytest.fixture
def start_operator(
    operator_identity: OperatorIdentity,
    prometheus_url: str,
    k8s: client.ApiClient,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., OperatorProcess]]:
    """Factory: start_operator(*extra_args) -> a running OperatorProcess; all are stopped at teardown,
    and a Lease one of them still holds (a killed replica does not release it) is deleted, so the
    next test's operator does not wait out its term."""
    started: list[OperatorProcess] = []

    def start(*extra_args: str) -> OperatorProcess:
        op = OperatorProcess(
            identity=operator_identity, prometheus_url=prometheus_url, log_dir=tmp_path, extra_args=extra_args
        ).start()
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()  # SIGTERM: the operator releases its Lease, so the next test's operator leads at once
    drop_lease_of(k8s, {op.name for op in started})
    failed = request.node.rep_call.failed if hasattr(request.node, "rep_call") else False
    if failed:
        for op in started:
            print(f"\n----- operator log {op.name} (last 4000 chars) -----\n{op.log()[-4000:]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
