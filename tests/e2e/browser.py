"""Headless Chromium driven over the DevTools protocol (aiohttp's WebSocket client, already a Kopf
dependency): open a page, click an element with real mouse events, read the text, take a screenshot.

Debian's ``chromium`` package (``make deps`` installs it). A test that needs the browser fails with
a clear message when it is missing rather than skipping: the page's promise is tested in a browser.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

WIDTH = 900


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise AssertionError("headless Chromium is missing: `make deps` installs Debian's chromium package")
    return found


class Tab:
    """One page over one DevTools WebSocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        await self.ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive(timeout=30)).data)
            if msg.get("id") == ident:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self.events.append(msg)

    async def wait_event(self, method: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    del self.events[: i + 1]
                    return
            self.events.clear()
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {method} within {timeout}s")
            self.events.append(json.loads((await self.ws.receive(timeout=left)).data))

    async def evaluate(self, expression: str) -> Any:
        answer = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return answer.get("result", {}).get("value")

    async def open(self, url: str) -> None:
        self.events.clear()
        await self.call("Page.navigate", url=url)
        await self.wait_event("Page.loadEventFired")

    async def click(self, selector: str) -> None:
        """A real click: the mouse pressed and released on the element's centre, then the next page loaded."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
            "e.scrollIntoView(); const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        if box is None:
            raise AssertionError(f"nothing on the page matches {selector}")
        self.events.clear()
        for kind in ("mousePressed", "mouseReleased"):
            await self.call(
                "Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1
            )
        await self.wait_event("Page.loadEventFired")

    async def text(self) -> str:
        return str(await self.evaluate("document.body.innerText"))

    async def screenshot(self, path: Path) -> None:
        height = int(await self.evaluate("document.documentElement.scrollHeight"))
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=WIDTH,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = await self.call("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))


class Browser:
    """A running headless Chromium; ``run(coroutine_function)`` gives it a fresh tab."""

    def __init__(self, port: int) -> None:
        self.port = port

    def run(self, script: Any) -> Any:
        async def main() -> Any:
            async with aiohttp.ClientSession() as session:
                async with session.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as r:
                    target = await r.json(content_type=None)
                async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=64 * 2**20) as ws:
                    tab = Tab(ws)
                    await tab.call("Page.enable")
                    await tab.call(
                        "Emulation.setDeviceMetricsOverride",
                        width=WIDTH,
                        height=1200,
                        deviceScaleFactor=1,
                        mobile=False,
                    )
                    try:
                        return await script(tab)
                    finally:
                        await session.get(f"http://127.0.0.1:{self.port}/json/close/{target['id']}")

        return asyncio.run(main())


@contextmanager
def headless_chromium() -> Iterator[Browser]:
    profile = Path(tempfile.mkdtemp(prefix="gpueff-chromium-"))
    proc = subprocess.Popen(
        [
            chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-dev-shm-usage", "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        port_file = profile / "DevToolsActivePort"
        end = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError("headless Chromium did not start")
            time.sleep(0.2)
        yield Browser(int(port_file.read_text().split()[0]))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
