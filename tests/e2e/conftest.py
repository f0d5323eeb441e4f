"""Session fixtures for e2e tests: real API server, real Prometheus, the operator as a process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.e2e.harness import (
    Cluster,
    OperatorIdentity,
    OperatorProcess,
    create_namespace,
    delete_namespace,
    install_crds,
    install_operator_rbac,
    start_cluster,
    stop_cluster,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


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
    operator_identity: OperatorIdentity, prometheus_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., OperatorProcess]]:
    """Factory: start_operator(*extra_args) -> a running OperatorProcess; all are stopped at teardown."""
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
    failed = request.node.rep_call.failed if hasattr(request.node, "rep_call") else False
    if failed:
        for op in started:
            print(f"\n----- operator log {op.name} (last 4000 chars) -----\n{op.log()[-4000:]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
