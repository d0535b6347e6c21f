"""The job page in a real browser (headless Debian chromium driven by playwright) on the embedded stack
started as a user starts it, `python -m worker embedded --serve`: a real API, a real Celery worker and real
training jobs of the tiny model.

The page's scripts call the /v1 API themselves with the session cookie (no API of the page's own), so the
tour runs the API's routes, streams and downloads too.

One tour: sign in with the key the stack wrote, see the jobs list, get a 404 page for another tenant's job,
open a running job and watch new points arrive on the entropy chart (read from the page's state), pause
and resume it from the page (the status checked through the API), overlay a second job (a series more),
download a checkpoint through the page's link, save a screenshot, cancel, sign out. Throughout, the API
key must never appear in a request URL or in the server's logs. Then SIGTERM: the stack exits 0 and leaves
no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from store import repository
from store.database import Database
from tests.conftest import requires_binary

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BASE_SPEC: dict[str, Any] = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 64, "eval_size": 4},
    "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
    "sampling": {"group_size": 4, "max_new_tokens": 5},
}
WATCHED = {
    **BASE_SPEC,
    "name": "watched",
    "optim": {"steps": 5000, "prompts_per_step": 3, "micro_batch_size": 6},
    "checkpoint": {"interval": 4, "keep_last": 1000},
}
OVERLAID = {  # a job with a PI entropy law (a target, no algorithm named: the default law)
    **BASE_SPEC,
    "algorithm": {"control": {"target_entropy": {"relative": 0.7}}},
    "name": "overlaid",
    "optim": {"steps": 3, "prompts_per_step": 3, "micro_batch_size": 6},
    "checkpoint": {"interval": 3},
}
# Function forms: playwright calls them through the DevTools protocol, which the page's CSP (no eval) allows.
ENTROPY_POINTS = "() => (window.stare ? window.stare.points('entropy') : 0)"
MORE_POINTS = "(n) => window.stare && window.stare.points('entropy') > n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Callable[[], Any], timeout_s: float = 90.0, every_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


T0 = [0.0]


def _mark(what: str) -> None:
    print(f"{time.monotonic() - T0[0]:6.1f} s  {what}", flush=True)


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its exit status is left for init to collect


@contextlib.contextmanager
def _served(home: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "worker", "embedded", "--serve", "--home", str(home)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*command, "--port", str(_free_port())], env=env, stdout=out, stderr=out, start_new_session=True
        )
        try:
            yield proc
        finally:  # after a failure too: stop the stack, then anything left in its process group
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=45)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _other_tenants_job(home: Path, base: str) -> str:
    """A job of a second tenant (created in the stack's own SQLite database), cancelled while queued."""
    db = Database(f"sqlite:///{home.resolve() / 'stare.db'}", pool_size=1)
    try:
        with db.transaction() as session:
            tenant = repository.create_tenant(session, "someone-else")
            _, secret = repository.create_api_key(session, tenant.id, "theirs")
    finally:
        db.dispose()
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as other:
        job_id = str(other.post("/v1/jobs", json={"spec": OVERLAID}).json()["id"])
        assert other.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    return job_id


@dataclass(frozen=True)
class _Tour:
    """What the tour's steps share: the stack's API address and key, the tenant's two jobs and another
    tenant's, and a way to read a job's status through the API."""

    base: str
    key: str
    api: httpx.Client
    watched: str
    overlaid: str
    theirs: str

    def status(self, job_id: str) -> str:
        answer = self.api.get(f"/v1/jobs/{job_id}")
        assert answer.status_code == 200, (answer.status_code, answer.text[:2000])
        return str(answer.json()["status"])


def _sign_in(page: Any, context: Any, tour: _Tour, url: str) -> None:
    """Sign in: the page asks for the key; the session is a cookie scripts cannot read. The jobs list shows
    the tenant's jobs only, and another tenant's job page is a 404."""
    page.goto(url)
    assert "/ui/sign-in" in page.url
    page.fill("#api-key", tour.key)
    page.click("#sign-in button[type=submit]")
    page.wait_for_url(f"{tour.base}/ui/jobs")
    (cookie,) = [c for c in context.cookies() if c["name"] == "stare_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert page.evaluate("() => document.cookie") == ""
    assert page.locator(f"#jobs tr[data-job-id='{tour.watched}']").count() == 1
    assert page.locator(f"#jobs tr[data-job-id='{tour.overlaid}']").count() == 1
    assert page.locator(f"#jobs tr[data-job-id='{tour.theirs}']").count() == 0

    # Another tenant's job: the page itself is a 404.
    missing = page.goto(f"{tour.base}/ui/jobs/{tour.theirs}")
    assert missing is not None and missing.status == 404


def _watch_pause_resume(page: Any, tour: _Tour) -> None:
    """The watched job, live: new points arrive on the entropy chart from the stream; then pause and resume
    from the page, the API telling the job's status."""
    _wait("the overlaid job to finish", lambda: tour.status(tour.overlaid) == "succeeded", 120)
    # The finished job with a PI law: its header line and its charts of u / e / I and of the actuator.
    page.goto(f"{tour.base}/ui/jobs/{tour.overlaid}")
    page.wait_for_function("() => window.stare && window.stare.points('control') > 0", timeout=30_000)
    control = page.text_content("#control") or ""
    assert control.startswith("· controller entropy_pi: u ") and " · I " in control, control
    assert page.evaluate("() => window.stare.seriesLabels('control')") == [
        "output u",
        "error e (relative)",
        "integral I",
    ]
    assert page.evaluate("() => window.stare.points('actuator')") > 0
    page.goto(f"{tour.base}/ui/jobs/{tour.watched}")
    _mark("overlaid job done; job page opened")
    page.wait_for_function(MORE_POINTS, arg=1, timeout=90_000)
    seen = page.evaluate(ENTROPY_POINTS)
    page.wait_for_function(MORE_POINTS, arg=seen, timeout=60_000)
    assert page.evaluate("() => window.stare.status()") == "running"
    drawn = page.evaluate("() => Object.keys(window.stare.charts)")
    assert {"entropy", "gate", "quadrants", "reward", "length", "throughput", "step_time"} <= set(drawn)
    assert "tool" not in drawn  # no tool/* metrics in this job: no tool chart
    assert "control" not in drawn and page.text_content("#control") == ""  # no PI law in this job
    assert "band high" in page.evaluate("() => window.stare.seriesLabels('entropy')")
    # Its samples and warnings (issue 46), as GET /v1/jobs/{id} gives them: the step-0 evaluation's
    # completions, and the first step's warning that entropy starts far from the target (0.3 nats by default).
    page.wait_for_function(
        "() => document.querySelectorAll('#samples table.samples tr').length > 1", timeout=30_000
    )
    view = tour.api.get(f"/v1/jobs/{tour.watched}").json()
    shown = page.evaluate(
        "() => Array.from(document.querySelectorAll('#samples pre')).map((e) => e.textContent)"
    )
    assert view["samples"]["eval"]["samples"][0]["prompt"] in shown, (view["samples"], shown)
    page.wait_for_function("() => document.querySelectorAll('#warnings li').length > 0", timeout=60_000)
    assert "entropy_far_from_band" in (page.text_content("#warnings") or "")
    # The header says the job's time to collapse (contract/stability.py), as the job view reports it.
    page.wait_for_function(
        "() => /collapsed/.test(document.getElementById('entropy-stability').textContent)", timeout=30_000
    )

    page.click("button[data-action=pause]")
    _mark("points grew; pausing")
    _wait("the job to pause", lambda: tour.status(tour.watched) == "paused", 90)
    page.wait_for_function("() => window.stare.status() === 'paused'", timeout=30_000)
    paused_at = page.evaluate(ENTROPY_POINTS)
    page.click("button[data-action=resume]")
    _mark("paused; resuming")
    _wait("the job to run again", lambda: tour.status(tour.watched) == "running", 90)
    page.wait_for_function(MORE_POINTS, arg=paused_at, timeout=90_000)


def _overlay_and_download(page: Any, tour: _Tour, tmp_path: Path) -> None:
    """Overlay the finished job (one more series on the entropy chart), then download a checkpoint through
    the page's cookie, as a tar, and keep a screenshot of the page."""
    series = page.evaluate("() => window.stare.seriesCount('entropy')")
    _mark("resumed and growing; overlay")
    page.select_option("#overlay-job", tour.overlaid)
    page.click("#overlay-add")
    page.wait_for_function("(n) => window.stare.seriesCount('entropy') > n", arg=series, timeout=30_000)
    assert "overlaid: policy entropy" in page.evaluate("() => window.stare.seriesLabels('entropy')")

    page.wait_for_selector("#checkpoints a.download", timeout=60_000)
    link = page.locator("#checkpoints a.download").first
    assert link.get_attribute("href", timeout=5_000).startswith(  # the API's own download route
        f"/v1/jobs/{tour.watched}/checkpoints/"
    )
    with page.expect_download() as download:
        link.click()
    saved = tmp_path / "checkpoint.tar"
    download.value.save_as(saved)
    with tarfile.open(saved) as archive:
        names = archive.getnames()
    assert any(name.endswith("state.json") for name in names), names

    _mark("downloaded")
    shot = tmp_path / "job-page.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("STARE_SCREENSHOT_DIR"):
        target = Path(os.environ["STARE_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target / "job-page.png")
    assert shot.stat().st_size > 20_000


def _browse(tour: _Tour, url: str, tmp_path: Path) -> list[str]:
    """The whole tour in chromium, ending with cancel and sign-out; the URLs the page requested."""
    from playwright.sync_api import sync_playwright

    urls: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1500}, accept_downloads=True)
        page = context.new_page()
        page.on("request", lambda request: urls.append(request.url))
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        _sign_in(page, context, tour, url)
        _watch_pause_resume(page, tour)
        _overlay_and_download(page, tour, tmp_path)
        page.click("button[data-action=cancel]")
        _wait("the job to be cancelled", lambda: tour.status(tour.watched) in ("cancelling", "cancelled"), 30)
        page.click("#sign-out")
        page.wait_for_url(f"{tour.base}/ui/sign-in")
        assert not [c for c in context.cookies() if c["name"] == "stare_session"]
        assert errors == [], errors
        browser.close()
    return urls


@pytest.mark.slow
@requires_binary("chromium")
def test_job_page_tour_in_chromium(tmp_path: Path) -> None:
    T0[0] = time.monotonic()
    home = tmp_path / "home"
    serve_log = tmp_path / "serve.log"
    with _served(home, serve_log) as proc:
        info = _wait("embedded.json", lambda: (home / "embedded.json").is_file() and proc.poll() is None, 90)
        info = json.loads((home / "embedded.json").read_text())
        assert info["pid"] == proc.pid and info["url"].endswith("/ui/jobs")
        key_file = home / "api-key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        key = key_file.read_text().strip()
        base = info["api"]
        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        overlaid = api.post("/v1/jobs", json={"spec": OVERLAID}).json()["id"]
        watched = api.post("/v1/jobs", json={"spec": WATCHED}).json()["id"]
        tour = _Tour(base, key, api, watched, overlaid, _other_tenants_job(home, base))
        _mark("jobs submitted")

        urls = _browse(tour, info["url"], tmp_path)
        _wait("the job to end", lambda: tour.status(watched) == "cancelled", 60)
        api.close()

        assert urls and all(key not in url for url in urls)
        for log in sorted((home / "logs").glob("*.log")):
            text = log.read_text(errors="replace")
            assert key not in text, f"the API key is in {log}"
        assert "POST /ui/session" in (home / "logs" / "api.log").read_text()  # the access log was captured

        left = _descendants(proc.pid)
        _mark("browser done")
        assert left, "the stack's API and worker should be running before SIGTERM"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    printed = serve_log.read_text()
    assert printed.count(key) == 1  # printed once, as promised, for the user to sign in with
    assert info["url"] in printed
    assert not (home / "embedded.json").exists()
    assert [pid for pid in left if _alive(pid)] == []
