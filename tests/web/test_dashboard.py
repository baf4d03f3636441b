"""The dashboard in a real headless Chromium against a real server with real job processes.

The cluster: one node `node-a` of 4 GPUs; VCs `nlp` and `vision` are guaranteed 2 GPUs each.
Jobs: T (vision, 2 GPUs, prints `tick N` every 0.2 s), S (nlp, 1 GPU, sleeps) run; Q (nlp,
2 GPUs) waits, since only 1 GPU is free. They run until the tests cancel them (longer than the
tests take on a loaded machine). Sorted VC names give nlp the palette's first colour and
vision its second.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from PIL import Image

from corral.server.boot import RunningServer, ServerOptions, build_manager
from tests.server.helpers import kill_jobs_of, manager_settings, run_server

CHROMIUM = shutil.which("chromium")


@pytest.fixture(autouse=True)
def _needs_chromium() -> None:
    if CHROMIUM is None:  # a failure, not a skip: the dashboard must be tested in a real browser
        pytest.fail("the dashboard tests need Debian's chromium: apt-get install -y chromium")


CLUSTER_YAML = """\
cell_types:
  PAIR: {child: gpu, count: 2}
  NODE: {child: PAIR, count: 2, node: true}
physical_cells:
  - {type: NODE, names: [node-a]}
virtual_clusters:
  vision: {PAIR: 1}
  nlp: {PAIR: 1}
"""
NODE = "node-a"
# app.js's palette by sorted VC name, and style.css's free-GPU grey
NLP_COLOUR = (0x4E, 0x79, 0xA7)
VISION_COLOUR = (0xF2, 0x8E, 0x2B)
THIRD_COLOUR = (0x59, 0xA1, 0x4F)  # no third VC: must not appear
FREE_GREY = (0xD6, 0xDA, 0xE0)
GPU_CELL_AREA = 96 * 72  # style.css .gpu at device scale 1

# Each tick is also a progress report (docs/progress.md), appended by the shell.
TICKS = (
    "for i in $(seq 0 3000); do echo tick $i; "
    'echo "{\\"step\\": $i}" >> "$CORRAL_PROGRESS_FILE"; sleep 0.2; done'
)
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
#: Seconds to wait for what the server or the page does next: enough for a loaded 2-core machine
#: (every wait polls, and ends as soon as its condition holds).
WAIT_S = 60.0


# -- a real server with three real jobs --------------------------------------------------------


@dataclass(slots=True)
class Scenario:
    server: RunningServer
    token: str
    api: httpx.Client
    ticker: str  # T
    sleeper: str  # S
    queued: str  # Q
    data_dir: Path

    @property
    def url(self) -> str:
        return self.server.url

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.api.get(f"/api/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def start_scenario(tmp: Path) -> Scenario:
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "cluster.yaml"
    config.write_text(CLUSTER_YAML)
    data_dir = tmp / "corral"
    options = ServerOptions(
        data_dir=data_dir,
        gpus=4,
        config=config,
        settings=manager_settings(tick_s=0.05, relax_after_s=0.0),
        single_user=True,
    )
    server = run_server(build_manager(options))
    token = (data_dir / "admin.token").read_text().strip()
    client = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    scenario = Scenario(server, token, client, "", "", "", data_dir)
    try:
        submit_jobs(scenario)
    except BaseException:
        stop_scenario(scenario)  # what a start that failed half-way began goes too
        raise
    return scenario


def submit_jobs(scenario: Scenario) -> None:
    client = scenario.api

    def submit(**spec: Any) -> str:
        response = client.post("/api/v1/jobs", json={"grace_seconds": 1, **spec})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    scenario.ticker = submit(name="ticker", vc="vision", gpus=2, command=TICKS, total_steps=3000)
    scenario.sleeper = submit(name="sleeper", vc="nlp", gpus=1, command="sleep 3600")
    # Q only after T and S run: submitted together, the queue could put Q before S
    for job_id in (scenario.ticker, scenario.sleeper):
        wait_until(lambda j=job_id: scenario.job(j)["status"] == "RUNNING", WAIT_S, f"job {job_id}")
    scenario.queued = submit(name="queued", vc="nlp", gpus=2, command="sleep 3600")
    wait_until(
        lambda: "position 1 of 1" in scenario.job(scenario.queued)["reason"], WAIT_S, "Q queued"
    )


def stop_scenario(scenario: Scenario) -> None:
    """Cancel every job, wait for their processes to be gone, stop the server (and, should any
    of that fail, kill what the jobs left running)."""
    ended = False
    try:
        jobs = scenario.api.get("/api/v1/jobs").json()
        for job in jobs:
            if job["status"] not in FINAL:
                scenario.api.post(f"/api/v1/jobs/{job['id']}/cancel")

        def all_ended() -> bool:
            for job in jobs:
                detail = scenario.job(job["id"])
                if detail["status"] not in FINAL:
                    return False
                if any(a["state"] != "ended" for a in detail["attempt_history"]):
                    return False
            return True

        wait_until(all_ended, WAIT_S, "every attempt to end")
        ended = True
    finally:
        try:
            scenario.api.close()
            scenario.server.stop()
        finally:
            if not ended:
                kill_jobs_of(scenario.data_dir)
    for shim in scenario.data_dir.glob("jobs/*/attempt-*/shim.json"):
        pid = json.loads(shim.read_text())["pid"]
        assert not process_alive(pid), f"{shim}: process {pid} is still running"


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    running = start_scenario(tmp_path_factory.mktemp("dashboard"))
    try:
        yield running
    finally:
        stop_scenario(running)


# -- Chromium ---------------------------------------------------------------------------------


def chromium_args(profile: Path) -> list[str]:
    assert CHROMIUM is not None
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--force-color-profile=srgb",  # exact palette colours in screenshots
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ]


def run_chromium(profile: Path, *args: str) -> str:
    """Chromium once (a fresh profile: no token left in localStorage); its stdout. In a process
    group of its own: a run that fails or hangs takes its helper processes with it."""
    browser = subprocess.Popen(
        [*chromium_args(profile), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = browser.communicate(timeout=180)
    finally:
        try:
            os.killpg(browser.pid, signal.SIGKILL)  # what is left of its group, if anything
        except ProcessLookupError:
            pass
        browser.communicate()
    assert browser.returncode == 0, stderr[-2000:]
    return stdout


def dump_dom(tmp: Path, url: str, budget_ms: int = 2500) -> Element:
    """The DOM after the page's scripts ran for `budget_ms` of virtual time (two polls or more:
    virtual time stops while a fetch is pending)."""
    html = run_chromium(tmp / "profile", f"--virtual-time-budget={budget_ms}", "--dump-dom", url)
    return parse_html(html)


@dataclass(slots=True)
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.walk()

    def all(self, attr: str, value: str | None = None, tag: str | None = None) -> list[Element]:
        return [
            e
            for e in self.walk()
            if attr in e.attrs
            and (value is None or e.attrs[attr] == value)
            and (tag is None or e.tag == tag)
        ]

    def one(self, attr: str, value: str | None = None, tag: str | None = None) -> Element:
        found = self.all(attr, value, tag)
        assert len(found) == 1, f"{len(found)} elements with {attr}={value!r} ({tag})"
        return found[0]

    def by_id(self, element_id: str) -> Element:
        return self.one("id", element_id)

    @property
    def hidden(self) -> bool:
        return "hidden" in self.attrs


VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "wbr"}


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID_TAGS:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse_html(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


def cells(dom: Element) -> dict[str, Element]:
    return {e.attrs["data-gpu"]: e for e in dom.all("data-gpu")}


# -- the tests --------------------------------------------------------------------------------


def test_dump_shows_gpus_vcs_queue_jobs_and_the_detail(scenario: Scenario, tmp_path: Path) -> None:
    ticker, sleeper, queued = scenario.ticker, scenario.sleeper, scenario.queued
    placement = {job: scenario.job(job)["placement"] for job in (ticker, sleeper)}
    assert len(placement[ticker]) == 2 and len(placement[sleeper]) == 1
    queued_reason = scenario.job(queued)["reason"]

    wait_until(lambda: scenario.job(ticker)["progress"], WAIT_S, "the ticker's first report")
    dom = dump_dom(tmp_path, f"{scenario.url}/#token={scenario.token}&job={ticker}")

    body = dom.one("data-polls", tag="body")
    assert body.attrs["data-state"] == "live"
    assert int(body.attrs["data-polls"]) >= 2  # it polled again, not just once
    assert dom.by_id("login").hidden and not dom.by_id("dashboard").hidden

    gpus = cells(dom)
    assert sorted(gpus) == [f"{NODE}/{i}" for i in range(4)]
    free = set(gpus) - set(placement[ticker]) - set(placement[sleeper])
    assert len(free) == 1
    for job_id, vc in ((ticker, "vision"), (sleeper, "nlp")):
        for gpu in placement[job_id]:
            cell = gpus[gpu]
            assert (cell.attrs["data-job"], cell.attrs["data-vc"]) == (job_id, vc)
            assert f"#{job_id}" in cell.text()
            assert f"job {job_id} " in cell.attrs["title"] and f"vc {vc}" in cell.attrs["title"]
    (free_gpu,) = free
    assert gpus[free_gpu].attrs["data-job"] == "" and "free" in gpus[free_gpu].attrs["class"]

    # The node table: the one node, up, with 3 of its 4 GPUs used by the two running jobs.
    (node_row,) = dom.by_id("node-states-body").all("data-node", tag="tr")
    assert (node_row.attrs["data-node"], node_row.attrs["data-state"]) == (NODE, "up")
    assert "3/4" in node_row.text() and ticker in node_row.text()

    legend = {
        e.attrs["data-vc"]: e.attrs.get("data-colour") for e in dom.by_id("legend").all("data-vc")
    }
    assert legend == {"nlp": "#4e79a7", "vision": "#f28e2b", "": None}

    usage = dom.by_id("gpu-usage")
    assert (usage.attrs["data-used"], usage.attrs["data-total"]) == ("3", "4")
    counts = {e.attrs["data-count"]: e.text().split()[0] for e in dom.all("data-count")}
    assert counts == {
        "PENDING": "1",
        "RUNNING": "2",
        "SUCCEEDED": "0",
        "FAILED": "0",
        "CANCELLED": "0",
    }
    assert dom.by_id("policy").text() == "las"
    # A manager alone (SQLite): its address, no role.
    manager = dom.by_id("manager")
    assert manager.text() == scenario.url.removeprefix("http://")
    assert manager.attrs["data-role"] == ""
    assert NODE in dom.by_id("cluster-name").text()

    vc_rows = {row.attrs["data-vc"]: row for row in dom.by_id("vcs-body").all("data-vc", tag="tr")}
    table = {
        vc: {c.attrs["data-field"]: c.text().strip() for c in row.all("data-field")}
        for vc, row in vc_rows.items()
    }
    assert table == {
        "nlp": {"guaranteed": "2", "allocated": "1", "running": "1", "pending": "1"},
        "vision": {"guaranteed": "2", "allocated": "2", "running": "1", "pending": "0"},
    }

    (entry,) = dom.by_id("queue").all("data-job", tag="li")
    assert entry.attrs["data-job"] == queued and entry.attrs["data-position"] == "1"
    assert entry.one("data-reason").text() == queued_reason
    assert "waiting for 2 free GPUs (1 free)" in queued_reason

    rows = dom.by_id("jobs-body").all("data-job", tag="tr")
    assert [(r.attrs["data-job"], r.attrs["data-status"]) for r in rows] == [
        (queued, "PENDING"),
        (sleeper, "RUNNING"),
        (ticker, "RUNNING"),
    ]
    cols = [c for c in rows[2].children if isinstance(c, Element)]
    assert [c.text() for c in cols[:6] + cols[7:9]] == [
        ticker,
        "ticker",
        "admin",
        "vision",
        "RUNNING",
        "2",
        "1",
        "0",
    ]
    # The progress bar: a share of its 3,000 declared steps, a few ticks of 0.2 s in.
    bar = cols[6].one("role", "progressbar")
    assert 0 <= float(bar.attrs["data-share"]) < 0.1
    assert bar.text().endswith("%") and "of 3000" in bar.attrs["title"]
    assert [c.text() for c in rows[0].children if isinstance(c, Element)][6] == "–"  # queued
    # Each row's reason, without the queue position (the status is beside it): the queued job's
    # says what it waits for; and its submission time with its date, whatever the day.
    by_field = {
        row.attrs["data-job"]: {c.attrs["data-field"]: c for c in row.all("data-field")}
        for row in rows
    }
    queued_cells = by_field[queued]
    assert queued_cells["reason"].text() == queued_reason.split("; ", 1)[1]
    assert queued_cells["reason"].attrs["title"] == queued_reason
    for job_id in (queued, sleeper, ticker):
        submitted = scenario.job(job_id)["submitted_at"]
        shown = by_field[job_id]["submitted"].text()
        # Chromium runs in this process's time zone: the same local date and time.
        assert shown == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(submitted)), shown

    detail = dom.by_id("detail")
    assert not detail.hidden and detail.attrs["data-job"] == ticker
    assert detail.attrs["data-status"] == "RUNNING"
    attempts = dom.by_id("detail-attempts").all("data-attempt")
    assert [a.attrs["data-attempt"] for a in attempts] == ["1"]
    assert [e.attrs["data-kind"] for e in dom.by_id("detail-events").all("data-kind")] == [
        "submitted",
        "started",
    ]
    log = dom.by_id("log")
    assert log.attrs["data-attempt"] == "1" and log.attrs["data-finished"] == "false"
    assert log.text().startswith("tick 0\n")
    assert int(log.attrs["data-offset"]) == len(log.text().encode())


def test_screenshot_paints_both_vc_colours_and_the_free_grey(
    scenario: Scenario, tmp_path: Path
) -> None:
    shot = tmp_path / "dashboard.png"
    run_chromium(
        tmp_path / "profile",
        "--virtual-time-budget=2500",
        "--window-size=1400,1000",
        f"--screenshot={shot}",
        f"{scenario.url}/#token={scenario.token}",
    )
    with Image.open(shot) as image:
        assert image.size == (1400, 1000)
        rgb = np.asarray(image.convert("RGB"))

    def pixels(colour: tuple[int, int, int]) -> int:
        return int(np.all(rgb == colour, axis=-1).sum())

    # A GPU cell is ~6,900 px less its text; legend swatches and bars add under 1,000 px.
    assert pixels(VISION_COLOUR) > 2 * 0.7 * GPU_CELL_AREA  # T's two GPUs
    assert 0.7 * GPU_CELL_AREA < pixels(NLP_COLOUR) < 2 * GPU_CELL_AREA  # S's one GPU
    assert 0.7 * GPU_CELL_AREA < pixels(FREE_GREY) < 2 * GPU_CELL_AREA  # one free GPU
    assert pixels(THIRD_COLOUR) == 0


def test_without_a_token_only_the_token_form_shows(scenario: Scenario, tmp_path: Path) -> None:
    for fragment, error in (("", None), ("#token=not-a-real-token", "refused")):
        dom = dump_dom(tmp_path / fragment.strip("#"), f"{scenario.url}/{fragment}", 1500)
        assert dom.one("data-state", tag="body").attrs["data-state"] == "login"
        assert not dom.by_id("login").hidden
        assert dom.by_id("token-input").attrs["type"] == "password"
        assert dom.by_id("dashboard").hidden and dom.by_id("summary").hidden
        assert dom.all("data-gpu") == [] and dom.all("data-job") == []
        assert dom.all("data-vc") == [] and dom.all("data-count") == []
        assert "ticker" not in dom.text() and "sleeper" not in dom.text()
        message = dom.by_id("login-error")
        if error is None:
            assert message.hidden
        else:
            assert not message.hidden and error in message.text()


# -- live updates over the DevTools protocol -----------------------------------------------------


class DevTools:
    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.last_id = 0
        self.errors: list[str] = []  # uncaught exceptions in the page (Runtime.enable first)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.last_id += 1
        await self.socket.send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        while True:
            message = json.loads(await self.socket.recv())
            if message.get("method") == "Runtime.exceptionThrown":
                self.errors.append(json.dumps(message["params"]["exceptionDetails"])[:500])
            if message.get("id") == self.last_id:
                assert "error" not in message, message["error"]
                return dict(message["result"])

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            # null until the page has loaded far enough for the expression to make sense
            value = await self.evaluate(
                f"(() => {{ try {{ return {expression}; }} catch {{ return null; }} }})()"
            )
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            await asyncio.sleep(0.1)


def start_browser(profile: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Chromium with a DevTools port; the page's websocket address."""
    profile.mkdir(parents=True)
    browser = subprocess.Popen(
        [*chromium_args(profile), "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: the helpers it spawns go with it
    )
    try:
        port_file = profile / "DevToolsActivePort"
        port = wait_until(
            lambda: port_file.is_file() and port_file.read_text().split("\n")[0].strip(),
            WAIT_S,
            "Chromium's DevTools port",
        )
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=30).json()
        page = next(t for t in targets if t["type"] == "page")
    except BaseException:
        stop_browser(browser)  # a start that failed leaves no browser behind
        raise
    return browser, str(page["webSocketDebuggerUrl"])


def stop_browser(browser: subprocess.Popen[bytes]) -> None:
    if browser.poll() is None:
        os.killpg(browser.pid, signal.SIGTERM)
        try:
            browser.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(browser.pid, signal.SIGKILL)
            browser.wait()


def test_the_page_updates_live_and_follows_the_log(tmp_path: Path) -> None:
    scenario = start_scenario(tmp_path / "server")
    try:
        browser, address = start_browser(tmp_path / "profile")
        try:
            asyncio.run(live_session(scenario, address))
        finally:
            stop_browser(browser)
    finally:
        stop_scenario(scenario)


async def live_session(scenario: Scenario, address: str) -> None:
    ticker, sleeper, queued = scenario.ticker, scenario.sleeper, scenario.queued
    async with websockets.connect(address, max_size=None) as socket:
        page = DevTools(socket)
        await page.call("Runtime.enable")
        await page.call("Page.navigate", url=f"{scenario.url}/#token={scenario.token}&job={ticker}")
        await page.wait_for(
            "document.body.dataset.polls >= 1 && document.querySelectorAll('[data-gpu]').length",
            WAIT_S,
            "the first poll",
        )
        # the token left the address bar for localStorage; the job selection stayed
        assert await page.evaluate("location.hash") == f"#job={ticker}"
        assert await page.evaluate("localStorage.getItem('corral.token')") == scenario.token
        await page.evaluate("window.sameDocument = true")  # a reload would drop it
        first_log = await page.wait_for(
            "document.getElementById('log').textContent.includes('tick 2\\n')"
            " && document.getElementById('log').textContent",
            WAIT_S,
            "the ticker's log",
        )
        polls = await page.evaluate("Number(document.body.dataset.polls)")

        # S ends: Q takes S's GPU and the free one, and the page shows it without a reload
        assert scenario.api.post(f"/api/v1/jobs/{sleeper}/cancel").status_code == 200
        await page.wait_for(
            f"document.querySelector('#jobs-body [data-job=\"{sleeper}\"]').dataset.status"
            " === 'CANCELLED'"
            f" && document.querySelectorAll('[data-gpu][data-job=\"{queued}\"]').length === 2",
            WAIT_S,
            "S cancelled and Q running on the page",
        )
        assert await page.evaluate("window.sameDocument") is True
        await page.wait_for(
            f"Number(document.body.dataset.polls) > {polls}", WAIT_S, "a later poll"
        )
        state = await page.evaluate(
            """(() => {
                const q = (s) => [...document.querySelectorAll(s)];
                const text = (s) => document.querySelector(s).textContent;
                const nlp = '#vcs-body [data-vc="nlp"]';
                return {
                  vcs: q('[data-gpu]').map((g) => g.dataset.vc).sort(),
                  queue: q('#queue li').length,
                  nlpPending: text(`${nlp} [data-field="pending"]`),
                  nlpAllocated: text(`${nlp} [data-field="allocated"]`),
                  running: text('[data-count="RUNNING"] b'),
                  cancelled: text('[data-count="CANCELLED"] b'),
                };
            })()"""
        )
        assert state == {
            "vcs": ["nlp", "nlp", "vision", "vision"],
            "queue": 0,
            "nlpPending": "0",
            "nlpAllocated": "2",
            "running": "2",
            "cancelled": "1",
        }
        assert scenario.job(queued)["status"] == "RUNNING"

        # the log kept growing by appending from the offset: every tick once, in order
        later_log = await page.evaluate("document.getElementById('log').textContent")
        assert later_log.startswith(first_log) and len(later_log) > len(first_log)
        lines = later_log.splitlines()
        assert lines == [f"tick {i}" for i in range(len(lines))]

        # T ends: the drawer shows it and stops following a log that will not grow
        assert scenario.api.post(f"/api/v1/jobs/{ticker}/cancel").status_code == 200
        await page.wait_for(
            "document.getElementById('detail').dataset.status === 'CANCELLED'"
            " && document.getElementById('log').dataset.finished === 'true'",
            WAIT_S,
            "T cancelled in the drawer",
        )
        final_log = await page.evaluate("document.getElementById('log').textContent")
        lines = final_log.splitlines()
        assert lines == [f"tick {i}" for i in range(len(lines))]
        on_disk = (scenario.data_dir / "jobs" / ticker / "attempt-1" / "rank-0.stdout").read_text()
        assert final_log == on_disk

        # the drawer's controls: W (4 GPUs) waits behind Q; held, then released, by its buttons
        answer = scenario.api.post(
            "/api/v1/jobs", json={"name": "W", "vc": "nlp", "gpus": 4, "command": "sleep 600"}
        )
        assert answer.status_code == 201, answer.text
        waiting = answer.json()["id"]
        row = f'#jobs-body [data-job="{waiting}"]'
        await page.wait_for(f"!!document.querySelector('{row}')", WAIT_S, "W in the jobs table")
        await page.evaluate(f"document.querySelector('{row}').click()")
        for verb, held_by in (("hold", "admin"), ("release", None)):
            button = f'#detail-actions [data-action="{verb}"]'
            await page.wait_for(
                f"document.getElementById('detail').dataset.job === '{waiting}'"
                f" && !!document.querySelector('{button}')",
                WAIT_S,
                f"W's {verb} button",
            )
            await page.evaluate(f"document.querySelector('{button}').click()")
            wait_until(
                lambda held_by=held_by: scenario.job(waiting)["held_by"] == held_by,
                WAIT_S,
                f"W {verb} by the button",
            )
        reason = await page.wait_for(
            "document.querySelector('#detail-actions [data-action=\"hold\"]')"
            " && document.getElementById('detail-reason').textContent",
            WAIT_S,
            "the drawer offering hold again",
        )
        assert "held" not in reason
        assert scenario.job(waiting)["status"] == "PENDING"
        assert scenario.api.post(f"/api/v1/jobs/{waiting}/cancel").status_code == 200
        assert page.errors == []
