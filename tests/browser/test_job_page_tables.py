"""The job page without uPlot (`make web` never ran on the API host), in headless chromium: the page
answers, says that charts need `make web`, loads nothing from /ui/vendor/, and shows each chart as a table
of the latest steps fed by the live stream (issue 46, item 6). The API runs in this process (uvicorn, on
the session's PostgreSQL); a stand-in worker writes the metrics through the repository."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from service.app import create_app
from store import repository
from store.database import Database
from tests.browser.test_job_page import CHROMIUM, CHROMIUM_ARGS, ENTROPY_POINTS, _free_port
from tests.conftest import requires_binary
from tests.service.conftest import migrated_database, settings_for
from tests.service.helpers import TINY_SPEC, FakeWorker
from tests.services import PostgresServer


def _serve(app: Any, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the API did not start"
        time.sleep(0.05)
    return server, thread


@pytest.mark.slow
@requires_binary("chromium")
@pytest.mark.parametrize("installed", [False, True], ids=["without-uplot", "with-uplot"])
def test_each_chart_is_a_table_of_the_latest_steps_without_uplot(
    test_postgres: PostgresServer, tmp_path: Path, installed: bool
) -> None:
    """Without uPlot: tables and the notice. With it (`make web`, as `make test` installs; the control):
    uPlot's canvases."""
    from playwright.sync_api import sync_playwright

    with migrated_database(test_postgres, "page_tables") as url:
        app = create_app(settings_for(url, tmp_path / "artifacts"))
        if not installed:
            app.state.web_root = tmp_path / "web"  # no node_modules: uPlot is not installed
        db = Database(url, pool_size=1)
        with db.transaction() as session:
            tenant = repository.create_tenant(session, "tables")
            _, key = repository.create_api_key(session, tenant.id, "browser")
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        server, thread = _serve(app, port)
        try:
            created = httpx.post(
                f"{base}/v1/jobs",
                json={"spec": TINY_SPEC},
                headers={"Authorization": f"Bearer {key}"},
                timeout=120,
            )
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            FakeWorker(db, job_id).steps(1, 25)  # more steps than a table shows
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                page = browser.new_page()
                urls: list[str] = []
                errors: list[str] = []
                page.on("request", lambda request: urls.append(request.url))
                page.on("pageerror", lambda err: errors.append(str(err)))
                page.goto(f"{base}/ui/sign-in?next=/ui/jobs/{job_id}")
                page.fill("#api-key", key)
                page.click("#sign-in button[type=submit]")
                page.wait_for_url(f"{base}/ui/jobs/{job_id}")
                page.wait_for_function(f"() => ({ENTROPY_POINTS})() === 25", timeout=30_000)
                rows = page.locator("#chart-entropy table.fallback tr")
                assert errors == [], errors
                if installed:
                    assert page.locator("#charts-missing").count() == 0 and rows.count() == 0
                    assert page.locator("#chart-entropy canvas").count() >= 1
                    browser.close()
                    return
                assert "make web" in page.locator("#charts-missing").inner_text()
                assert rows.count() == 1 + 20  # the header and the 20 latest steps
                assert rows.nth(1).locator("td").first.inner_text() == "25"  # the newest first
                assert rows.nth(0).locator("th").first.inner_text() == "step"
                assert errors == [], errors
                assert not [u for u in urls if "/ui/vendor/" in u], urls
                browser.close()
        finally:
            server.should_exit = True
            thread.join(timeout=15)
            db.dispose()
