"""The report in a real browser: headless Chromium loads it from disk with no console error and
no network request, shows the verdict, and draws a page that is not blank.

Console errors, exceptions and requests are captured over the Chrome DevTools Protocol (aiohttp's
websocket client); the screenshot is taken the way a reviewer's tooling would, with
``--screenshot``. Chromium missing is a failure, not a skip: CI installs it
(scripts/install-sysdeps.sh).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import queue
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from matplotlib.image import imread

from harness.analyze.campaign import analyze_campaign
from harness.gate.evaluate import evaluate_gates
from harness.report import render_report
from tests.conftest import DATA
from tests.report.test_report import make_tiny_campaign

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
WIDTH, HEIGHT = 1280, 2000


def _chromium() -> str:
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).is_file() else None)
    if path is None:
        pytest.fail(
            "chromium is not installed: the report's browser test needs it. Install it with "
            "`apt-get install -y chromium` (or `make sysdeps`, which runs "
            "scripts/install-sysdeps.sh)"
        )
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny campaign's report, rendered with figures."""
    root = make_tiny_campaign(tmp_path_factory.mktemp("report-browser"))
    analysis = analyze_campaign(root)
    return render_report(root, analysis, evaluate_gates(analysis))


class Page:
    """What the browser saw while loading the page."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.text = ""
        self.banner: dict[str, Any] = {}
        self.scroll_width = 0


async def _devtools(ws_url: str, url: str) -> Page:
    seen = Page()
    ids = itertools.count(1)
    pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
    loaded = asyncio.Event()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:

        async def reader() -> None:
            async for message in ws:
                data = json.loads(message.data)
                if "id" in data and data["id"] in pending:
                    pending.pop(data["id"]).set_result(data)
                    continue
                method, params = data.get("method", ""), data.get("params", {})
                if method == "Page.loadEventFired":
                    loaded.set()
                elif method == "Runtime.exceptionThrown":
                    seen.errors.append(json.dumps(params["exceptionDetails"])[:500])
                elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                    "error",
                    "assert",
                ):
                    seen.errors.append(json.dumps(params.get("args"))[:500])
                elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                    seen.errors.append(params["entry"].get("text", ""))
                elif method == "Network.requestWillBeSent":
                    seen.requests.append(params["request"]["url"])

        async def call(method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
            number = next(ids)
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            pending[number] = future
            message: dict[str, Any] = {"id": number, "method": method, "params": params}
            if session:
                message["sessionId"] = session
            await ws.send_str(json.dumps(message))
            reply = await asyncio.wait_for(future, 30)
            assert "error" not in reply, f"{method}: {reply['error']}"
            result: dict[str, Any] = reply.get("result", {})
            return result

        task = asyncio.create_task(reader())
        target = await call("Target.createTarget", url="about:blank")
        attached = await call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            await call(f"{domain}.enable", session)
        await call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=WIDTH,
            height=HEIGHT,
            deviceScaleFactor=1,
            mobile=False,
        )
        await call("Page.navigate", session, url=url)
        await asyncio.wait_for(loaded.wait(), 30)
        await asyncio.sleep(0.5)  # let late console messages and requests arrive
        text = await call(
            "Runtime.evaluate", session, expression="document.body.innerText", returnByValue=True
        )
        seen.text = str(text["result"]["value"])
        banner = await call(
            "Runtime.evaluate",
            session,
            returnByValue=True,
            expression=(
                "(() => { const e = document.querySelector('.banner'); const r = "
                "e.getBoundingClientRect(); const s = getComputedStyle(e); return {word: "
                "e.dataset.verdict, top: r.top, height: r.height, visible: s.display !== 'none' "
                "&& s.visibility !== 'hidden', background: s.backgroundColor}; })()"
            ),
        )
        seen.banner = banner["result"].get("value") or {}
        width = await call(
            "Runtime.evaluate",
            session,
            returnByValue=True,
            expression="document.documentElement.scrollWidth",
        )
        seen.scroll_width = int(width["result"]["value"])
        task.cancel()
    return seen


def _load(chromium: str, report: Path, profile: Path) -> Page:
    process = subprocess.Popen(
        [
            chromium,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    found: queue.Queue[str] = queue.Queue()

    def drain() -> None:
        # Read stderr to the end, so chromium never blocks on a full pipe.
        assert process.stderr is not None
        for line in process.stderr:
            match = re.search(r"DevTools listening on (ws://\S+)", line)
            if match:
                found.put(match.group(1))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        try:
            ws_url = found.get(timeout=60)
        except queue.Empty:
            pytest.fail("chromium did not print its DevTools address within 60 s")
        return asyncio.run(_devtools(ws_url, report.as_uri()))
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        if process.stderr is not None:
            process.stderr.close()


def test_report_loads_without_errors_or_requests(report: Path, tmp_path: Path) -> None:
    chromium = _chromium()
    page = _load(chromium, report, tmp_path / "profile")
    assert page.errors == []
    own = report.as_uri()
    outside = [u for u in page.requests if u != own and not u.startswith("data:")]
    assert outside == [], f"the report fetched: {outside}"
    analysis = analyze_campaign(report.parent)
    word = evaluate_gates(analysis).word
    assert page.banner["word"] == word and page.banner["visible"]
    assert 0 <= page.banner["top"] < HEIGHT and page.banner["height"] > 40
    colour = {"PASS": "rgb(231, 245, 234)", "UNDECIDED": "rgb(255, 244, 222)"}.get(
        word, "rgb(253, 236, 234)"
    )
    assert page.banner["background"] == colour
    assert page.text.lstrip().startswith("tiny-report")
    assert word in page.text and "gates passed" in page.text


def test_the_ladders_page_fits_a_1280_px_window(tmp_path: Path) -> None:
    # The queue-rate ladder's recovery table (a row per rung, both shift directions, every
    # column seed 000 reads) ran past the page's right edge: a wide table scrolls in its own
    # box, and the page itself is never wider than the window.
    root = tmp_path / "ladder" / "20260101T000000Z"
    shutil.copytree(DATA / "campaigns" / "ladder-shaped", root)
    analysis = analyze_campaign(root)
    page = render_report(root, analysis, evaluate_gates(analysis), figures=False)
    seen = _load(_chromium(), page, tmp_path / "profile")
    assert seen.errors == []
    assert seen.scroll_width <= WIDTH, seen.scroll_width


def test_screenshot_is_not_blank_and_dom_has_the_verdict(report: Path, tmp_path: Path) -> None:
    chromium = _chromium()
    shot = tmp_path / "report.png"
    common = [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run(
        [*common, f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", report.as_uri()],
        capture_output=True,
        timeout=90,
        check=True,
    )
    assert shot.is_file()
    pixels = imread(str(shot))
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    assert float(np.var(pixels[..., :3])) > 1e-3, "the screenshot is blank"
    # The banner (top of the page) carries the verdict colour: green or red pixels are present.
    top = pixels[:400, :, :3]
    red = (top[..., 0] > 0.6) & (top[..., 1] < 0.3) & (top[..., 2] < 0.3)
    green = (top[..., 1] > 0.4) & (top[..., 0] < 0.3) & (top[..., 2] < 0.35)
    assert red.sum() + green.sum() > 200
    dom = subprocess.run(
        [*common, "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    assert re.search(
        r'class="banner (pass|undecided|fail)" data-verdict="(PASS|UNDECIDED|FAIL)"', dom
    )
