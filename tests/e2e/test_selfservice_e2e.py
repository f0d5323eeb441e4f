"""The researcher's page behind a warning, in a real browser (issue 36), on the real local cluster.

The operator runs with its self-service page on (a key file, a port, the page's URL); the scenario
``procedural/selfservice.yaml`` warns two idle Deployments. Headless Chromium opens the link the
warning carries: the page shows the chart and the countdown (the screenshot is the README's: run
with ``GPUEFF_UPDATE_SCREENSHOT=1`` to refresh docs/img/selfservice.png); a real mouse click on
"Keep for 2h" writes keep-for and the pod outlives its old deadline; "Release now" on the other pod
gets it scaled to zero at the next cycle, before its deadline; a tampered link changes nothing, a
second click (a replay) writes nothing more, and a standby replica shows the page but answers a
click with "try again".
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from kubernetes import client

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import parse_rfc3339
from tests.e2e.browser import Tab, headless_chromium
from tests.e2e.harness import Cluster, OperatorIdentity, OperatorProcess, wait_for
from tests.e2e.scenario_driver import BackgroundScenario

pytestmark = pytest.mark.e2e

WORKLOAD_LABEL = "sim.gpuefficiency.io/workload"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "selfservice.png"
INTERVAL_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tampered(url: str) -> str:
    """The same link with one character of its signature changed."""
    last = url[-2]
    return url[:-2] + ("A" if last != "A" else "B") + url[-1]


def test_keep_and_release_from_the_warning_link_in_a_browser(
    cluster: Cluster,
    k8s: client.ApiClient,
    operator_identity: OperatorIdentity,
    tmp_path: Path,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    core = client.CoreV1Api(k8s)
    apps = client.AppsV1Api(k8s)
    key = tmp_path / "selfservice-key"
    key.write_text(secrets.token_hex(32) + "\n")
    port = free_port()
    first = f"http://127.0.0.1:{port}"
    args = (f"--selfservice-port {port}", f"--selfservice-url {first}", f"--selfservice-key-file {key}")
    with (
        BackgroundScenario("selfservice", cluster, operator_identity, tmp_path, operator_args=args) as bg,
        headless_chromium() as browser,
    ):
        ns = bg.namespace("sim-self")
        # A second replica: it serves the page too, but as a standby it must not write a click. Both
        # start within a second, so either may win the Lease: the links name the leader's URL.
        second_port = free_port()
        second = f"http://127.0.0.1:{second_port}"
        start_operator(
            "--selfservice-port", str(second_port), "--selfservice-url", second, "--selfservice-key-file", str(key)
        )  # fmt: skip

        def pod_of(workload: str) -> client.V1Pod | None:
            pods = core.list_namespaced_pod(ns, label_selector=f"{WORKLOAD_LABEL}={workload}").items
            live = [p for p in pods if p.metadata.deletion_timestamp is None]
            return live[0] if live else None

        def warned(workload: str) -> client.V1Pod | None:
            pod = pod_of(workload)
            return pod if pod is not None and names.SELF_SERVICE in (pod.metadata.annotations or {}) else None

        keeper = wait_for(lambda: warned("keeper"), 90, what="keeper warned with a self-service link")
        giver = wait_for(lambda: warned("giver"), 30, what="giver warned with a self-service link")
        keep_link = keeper.metadata.annotations[names.SELF_SERVICE]
        release_link = giver.metadata.annotations[names.SELF_SERVICE]
        leader, standby = (first, second) if keep_link.startswith(f"{first}/") else (second, first)
        assert keep_link.startswith(f"{leader}/gpu?t="), keep_link
        assert release_link.startswith(f"{leader}/gpu?t="), release_link
        keeper_deadline = parse_rfc3339(keeper.metadata.annotations[names.EVICT_AFTER])
        giver_deadline = parse_rfc3339(giver.metadata.annotations[names.EVICT_AFTER])
        assert keeper_deadline is not None
        assert giver_deadline is not None
        warning = wait_for(
            lambda: [
                e
                for e in core.list_namespaced_event(
                    ns, field_selector=f"involvedObject.name={keeper.metadata.name}"
                ).items
                if e.reason == names.EV_EVICTION_SCHEDULED
            ],
            15,
            what="the GPUIdleEvictionScheduled event",
        )
        assert keep_link in warning[0].message, warning[0].message  # the event carries the same link

        # The page, as the researcher sees it: chart with data and the threshold line, the countdown.
        async def look(tab: Tab) -> dict[str, Any]:
            await tab.open(keep_link)
            await tab.screenshot(tmp_path / "selfservice.png")
            return {
                "text": await tab.text(),
                "lines": await tab.evaluate("document.querySelectorAll('svg path').length"),
                "threshold": await tab.evaluate("document.querySelectorAll('line[stroke-dasharray]').length"),
                "buttons": await tab.evaluate(
                    "[...document.querySelectorAll('button')].map(b => b.innerText)"
                ),
            }

        seen = browser.run(look)
        assert "This GPU has done no real work" in seen["text"], seen["text"]
        assert "Reclaimed in" in seen["text"], seen["text"]
        assert "scaled to zero" in seen["text"], seen["text"]
        assert "gpu-efficiency restore deployment/keeper" in seen["text"], seen["text"]
        assert seen["lines"] >= 2, seen  # SM activity and memory drawn
        assert seen["threshold"] >= 1, seen
        assert seen["buttons"] == ["Keep for 1h", "Keep for 2h", "Keep for 4h", "Release now"], seen[
            "buttons"
        ]
        if os.environ.get("GPUEFF_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(tmp_path / "selfservice.png", SCREENSHOT)

        # A tampered link shows a plain error and changes nothing, in the browser and by a forged POST.
        def open_text(url: str) -> str:
            async def script(tab: Tab) -> str:
                await tab.open(url)
                return await tab.text()

            return str(browser.run(script))

        assert "cannot be used" in open_text(tampered(keep_link))
        forged = httpx.post(
            f"{leader}/gpu/release", data={"t": unquote(tampered(release_link).split("t=", 1)[1])}
        )
        assert forged.status_code == 403, forged.text
        for pod in (pod_of("keeper"), pod_of("giver")):
            assert pod is not None
            ann = pod.metadata.annotations or {}
            assert names.RELEASE not in ann, ann
            assert names.KEEP_FOR not in ann, ann

        # The standby shows the page but answers a click with "try again", writing nothing.
        token = unquote(keep_link.split("t=", 1)[1])
        shown = wait_for(
            lambda: (r := httpx.get(keep_link.replace(leader, standby), timeout=30)).status_code == 200 and r,
            60,
            what="the standby serving the page",
        )
        assert "Keep for 2h" in shown.text
        refused = httpx.post(f"{standby}/gpu/keep", data={"t": token, "duration": "2h"}, timeout=30)
        assert refused.status_code == 503, refused.text
        assert "try again" in refused.text
        assert names.KEEP_FOR not in (pod_of("keeper").metadata.annotations or {})  # type: ignore[union-attr]

        # Keep for 2h: a real click writes keep-for; a second click (a replay) writes nothing more.
        def click(url: str, selector: str) -> str:
            async def script(tab: Tab) -> str:
                await tab.open(url)
                await tab.click(selector)
                return await tab.text()

            return str(browser.run(script))

        answer = click(keep_link, 'button[value="2h"]')
        assert "Done" in answer, answer
        assert "kept for 2h" in answer, answer
        kept = pod_of("keeper")
        assert kept is not None
        assert kept.metadata.uid == keeper.metadata.uid
        assert (kept.metadata.annotations or {}).get(names.KEEP_FOR) == "2h"
        again = click(keep_link, 'button[value="2h"]')
        assert "already kept" in again, again

        # Release now: the other pod's Deployment is scaled to zero at the next cycle.
        clicked = time.time()
        answer = click(release_link, "button.release")
        assert "released" in answer, answer
        wait_for(
            lambda: apps.read_namespaced_deployment("giver", ns).spec.replicas == 0,
            3 * INTERVAL_S,
            what="giver scaled to zero at the next cycle",
        )
        assert time.time() < giver_deadline, "the release had to come before the deadline"
        assert time.time() - clicked <= 3 * INTERVAL_S

        clicks = [
            e for e in core.list_namespaced_event(ns).items
            if e.reason in (names.EV_KEEP_CLICKED, names.EV_RELEASE_CLICKED)
        ]  # fmt: skip
        assert sorted(e.reason for e in clicks) == [names.EV_KEEP_CLICKED, names.EV_RELEASE_CLICKED], clicks
        assert all("127.0.0.1" in e.message for e in clicks), [e.message for e in clicks]

        # The kept pod outlives its old deadline (two cycles past it), and is no longer warned.
        while time.time() < keeper_deadline + 2 * INTERVAL_S:
            pod = pod_of("keeper")
            assert pod is not None, "the kept pod was reclaimed"
            assert pod.metadata.uid == keeper.metadata.uid, "the kept pod was replaced"
            time.sleep(1)
        assert apps.read_namespaced_deployment("keeper", ns).spec.replicas == 1
        assert names.EVICT_AFTER not in (pod_of("keeper").metadata.annotations or {})  # type: ignore[union-attr]
    result = bg.finish()
    assert result.passed, bg.report()
