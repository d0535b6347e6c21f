"""The job page's server side (service/routers/pages.py, service/sessions.py, and the /v1 routes its scripts
call with the session cookie) on the real app and PostgreSQL: sign-in sessions (cookie attributes, forgery,
expiry, revocation), CSRF on every cookie-authenticated write, tenancy, the live stream, the
cookie-authenticated downloads, the security headers of every page response, and the clear answer when the
charting library is not installed. The browser itself is driven in tests/browser/test_job_page.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from contract import metrics as catalogue
from service.app import create_app
from service.errors import BadRequest
from service.page_charts import chart_groups
from service.routers.events import parse_last_event_id
from service.sessions import COOKIE_NAME, SessionSigner
from service.settings import Settings
from store import repository
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC, FakeWorker, create_job

SIGN_IN = {"X-Stare-Sign-In": "1"}


def _signed_in(client: TestClient, key: str) -> str:
    client.cookies.clear()
    response = client.post("/ui/session", json={"api_key": key}, headers=SIGN_IN)
    assert response.status_code == 200, response.text
    return str(response.headers["set-cookie"])


def _csrf(client: TestClient, job_id: str) -> str:
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200, page.text
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert found is not None
    return found[1]


def test_sign_in_sets_a_scoped_http_only_strict_cookie_without_the_key(
    client: TestClient, tenant: TenantKey
) -> None:
    client.cookies.clear()
    assert client.get("/ui/jobs", follow_redirects=False).headers["location"] == "/ui/sign-in?next=/ui/jobs"
    no_header = client.post("/ui/session", json={"api_key": tenant.key})
    assert no_header.status_code == 400 and no_header.json()["error"]["param"] == "X-Stare-Sign-In"
    wrong = client.post("/ui/session", json={"api_key": "sk-stare-" + "x" * 40}, headers=SIGN_IN)
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    form = client.post("/ui/session", data={"api_key": tenant.key}, headers=SIGN_IN)
    assert form.status_code == 422 and "set-cookie" not in form.headers
    assert tenant.key not in form.text

    header = _signed_in(client, tenant.key)
    attributes = {part.strip().split("=")[0].lower() for part in header.split(";")}
    assert {"httponly", "path", "samesite", "max-age"} <= attributes
    values = {
        part.strip().split("=")[0].lower(): part.strip().partition("=")[2] for part in header.split(";")
    }
    assert values["path"] == "/" and "samesite=strict" in header.lower()  # the page's scripts call /v1
    assert "secure" not in attributes  # plain http here; https below
    assert tenant.key not in header and tenant.key_id not in header  # opaque, signed, no secret
    listing = client.get("/ui/jobs")
    assert listing.status_code == 200 and "Sign out" in listing.text

    with TestClient(client.app, base_url="https://testserver") as secure_client:
        secure = secure_client.post("/ui/session", json={"api_key": tenant.key}, headers=SIGN_IN)
        assert "secure" in {p.strip().lower() for p in secure.headers["set-cookie"].split(";")}


def test_the_page_cookie_reads_v1_but_never_writes_without_the_csrf_token(
    client: TestClient, tenant: TenantKey
) -> None:
    """The cookie authenticates /v1 as the key does (the page has no API of its own), but no write: every
    unsafe method needs the page's X-CSRF-Token too, which another site cannot read. Bearer never needs it."""
    job_id = create_job(client, tenant.headers)
    _signed_in(client, tenant.key)
    token = _csrf(client, job_id)
    assert client.get(f"/v1/jobs/{job_id}").json()["id"] == job_id
    assert client.get("/v1/me").json()["tenant"]["name"] == tenant.name
    writes = [
        ("POST", "/v1/jobs", {"spec": TINY_SPEC}),
        ("POST", f"/v1/jobs/{job_id}/pause", None),
        ("POST", f"/v1/jobs/{job_id}/cancel", None),
        ("POST", "/v1/api-keys", {"name": "stolen"}),
        ("DELETE", f"/v1/api-keys/{tenant.key_id}", None),
    ]
    for method, path, body in writes:
        for headers in ({}, {"X-CSRF-Token": "x" + token}, {"X-CSRF-Token": ""}):
            refused = client.request(method, path, json=body, headers=headers)
            assert refused.status_code == 403, (method, path, headers, refused.text)
            assert refused.json()["error"] == {**refused.json()["error"], "code": "csrf_failed"}
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["status"] == "queued"
    assert client.get("/v1/jobs", headers=tenant.headers).json()["data"][0]["id"] == job_id  # none created
    assert [k["name"] for k in client.get("/v1/api-keys").json()["data"]] == ["test"]
    created = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers={"X-CSRF-Token": token})
    assert created.status_code == 201, created.text
    client.cookies.clear()
    assert client.post(f"/v1/jobs/{job_id}/pause", headers=tenant.headers).json()["status"] == "paused"
    assert client.get(f"/v1/jobs/{job_id}").status_code == 401  # neither key nor cookie
    assert client.get(f"/ui/api/jobs/{job_id}", headers=tenant.headers).status_code == 404  # no second API


def test_another_tenants_job_is_a_404_page(
    client: TestClient, make_tenant: Callable[[], TenantKey], tenant: TenantKey
) -> None:
    other = make_tenant()
    theirs = create_job(client, other.headers)
    mine = create_job(client, tenant.headers)
    _signed_in(client, tenant.key)
    page = client.get(f"/ui/jobs/{theirs}")
    assert page.status_code == 404 and "text/html" in page.headers["content-type"]
    for path in ("", "/metrics", "/checkpoints", "/live", "/events", "/report"):
        assert client.get(f"/v1/jobs/{theirs}{path}").status_code == 404, path
        if path != "/live":  # a queued job's live stream runs until the job ends
            assert client.get(f"/v1/jobs/{mine}{path}").status_code == 200, path
    assert client.get(f"/ui/jobs/{theirs}/report").status_code == 404
    listing = client.get("/ui/jobs").text
    assert mine in listing and theirs not in listing
    own = client.get(f"/ui/jobs/{mine}")
    assert own.status_code == 200
    assert "script-src 'self'" in own.headers["content-security-policy"]
    assert own.headers["cache-control"] == "no-store"


def test_state_changes_need_the_csrf_token(client: TestClient, tenant: TenantKey) -> None:
    job_id = create_job(client, tenant.headers)
    _signed_in(client, tenant.key)
    token = _csrf(client, job_id)
    refused = client.post(f"/v1/jobs/{job_id}/pause")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "csrf_failed"
    assert client.post(f"/v1/jobs/{job_id}/pause", headers={"X-CSRF-Token": "x" + token}).status_code == 403
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["status"] == "queued"
    paused = client.post(f"/v1/jobs/{job_id}/pause", headers={"X-CSRF-Token": token})
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    resumed = client.post(f"/v1/jobs/{job_id}/resume", headers={"X-CSRF-Token": token})
    assert resumed.json()["status"] == "queued"
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel", headers={"X-CSRF-Token": token})
    assert cancelled.json()["status"] == "cancelled"
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["status"] == "cancelled"
    assert client.post(f"/v1/jobs/{job_id}/explode", headers={"X-CSRF-Token": token}).status_code == 404

    assert client.delete("/ui/session").status_code == 403  # signing out needs the token too
    out = client.delete("/ui/session", headers={"X-CSRF-Token": token})
    assert out.status_code == 200 and 'stare_session=""' in out.headers["set-cookie"]
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_forged_expired_and_revoked_sessions_are_signed_out(
    client: TestClient, db: Database, tenant: TenantKey
) -> None:
    _signed_in(client, tenant.key)
    cookie = client.cookies.get(COOKIE_NAME)
    assert cookie is not None
    payload, signature = cookie.split(".")
    for forged in (payload + "." + signature[:-2] + "AA", payload[:-1] + "." + signature, "junk", "a.b.c"):
        client.cookies.clear()
        client.cookies.set(COOKIE_NAME, forged, path="/")
        assert client.get("/ui/jobs", follow_redirects=False).status_code == 303, forged

    signer = SessionSigner(b"k" * 32, ttl_s=60)
    issued, session = signer.issue("key_1", "ten_1", now=1000.0)
    assert signer.verify(issued, now=1059.0) == session
    assert signer.verify(issued, now=1061.0) is None  # expired
    assert SessionSigner(b"other" * 8, ttl_s=60).verify(issued, now=1000.0) is None  # another secret

    with db.transaction() as s:  # a second key, so the first one may be revoked
        _, spare = repository.create_api_key(s, tenant.tenant_id, "spare")
    client.cookies.clear()
    _signed_in(client, tenant.key)
    assert client.get("/ui/jobs").status_code == 200
    # Revoked through the API: at once (the key's cache entry, which its sessions share, is forgotten).
    # Revoked behind the API's back: within the cache's time (test_a_key_revoked_elsewhere_ends_...).
    revoked = client.delete(f"/v1/api-keys/{tenant.key_id}", headers={"Authorization": f"Bearer {spare}"})
    assert revoked.status_code == 200, revoked.text
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303
    assert client.get("/v1/me").json()["error"]["code"] == "api_key_revoked"
    assert client.post("/ui/session", json={"api_key": tenant.key}, headers=SIGN_IN).status_code == 401


def test_live_stream_downloads_and_report_through_the_cookie(
    client: TestClient, db: Database, tenant: TenantKey, artifact_root: Path
) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 3)
    checkpoint_id = worker.checkpoint(artifact_root, 3)
    worker.finish("succeeded")
    _signed_in(client, tenant.key)

    stream = client.get(f"/v1/jobs/{job_id}/live")
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    events = re.findall(r"^event: (\w+)$", stream.text, re.M)
    assert events[-1] == "end" and "metrics" in events and "job" in events and "lifecycle" in events
    assert stream.text.count('"step":') >= 3 and '"entropy/mean":0.5' in stream.text
    again = client.get(f"/v1/jobs/{job_id}/live", headers={"Last-Event-ID": "999.3"})
    metrics_lines = [line for line in again.text.splitlines() if line.startswith('data: {"data"')]
    assert len(metrics_lines) == 1 and '"step":3' in metrics_lines[0] and '"step":2' not in again.text
    bad = client.get(f"/v1/jobs/{job_id}/live", headers={"Last-Event-ID": "12"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"

    listing = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["data"]
    assert [c["id"] for c in listing] == [checkpoint_id]
    url = listing[0]["download_url"]
    assert url == f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download"
    page_tar = client.get(url)  # the cookie's download, as the page's link fetches it
    api_tar = client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download", headers=tenant.headers)
    assert (
        page_tar.status_code == 200 and page_tar.content == api_tar.content and len(page_tar.content) > 1024
    )
    assert page_tar.headers["x-content-sha256"] == api_tar.headers["x-content-sha256"]
    assert client.get(f"/v1/jobs/{job_id}/checkpoints/ckpt_nope/download").status_code == 404
    metrics = client.get(f"/v1/jobs/{job_id}/metrics").json()
    assert [p["step"] for p in metrics["data"]] == [1, 2, 3]
    report = client.get(f"/ui/jobs/{job_id}/report")
    assert report.status_code == 200 and "<svg" in report.text


def test_without_the_charting_library_the_pages_work_and_say_charts_need_make_web(
    settings: Settings, tmp_path: Path, tenant: TenantKey
) -> None:
    app = create_app(settings)
    app.state.web_root = tmp_path  # no node_modules here: `make web` (npm ci) never ran
    with TestClient(app, raise_server_exceptions=False) as client:
        job_id = create_job(client, tenant.headers)
        assert client.get("/ui/sign-in").status_code == 200
        _signed_in(client, tenant.key)
        assert client.get("/ui/jobs").status_code == 200
        page = client.get(f"/ui/jobs/{job_id}")
        assert page.status_code == 200, page.text
        assert 'id="charts-missing"' in page.text and "make web" in page.text
        assert "npm ci --prefix service/web" in page.text and "a table of its latest steps" in page.text
        assert "/ui/vendor/" not in page.text  # nothing the page loads would fail
        assert '<script src="/ui/static/job.js" defer></script>' in page.text
        vendor = client.get("/ui/vendor/uPlot.iife.min.js")  # asked for directly: not there, and why
        assert vendor.status_code == 503 and "make web" in vendor.text
    with TestClient(create_app(settings)) as client:  # the installed one
        job_id = create_job(client, tenant.headers)
        _signed_in(client, tenant.key)
        page = client.get(f"/ui/jobs/{job_id}").text
        assert "charts-missing" not in page
        assert '<script src="/ui/vendor/uPlot.iife.min.js" defer></script>' in page
        assert '<link rel="stylesheet" href="/ui/vendor/uPlot.min.css">' in page
        assert "uPlot" in client.get("/ui/vendor/uPlot.iife.min.js").text
        assert client.get("/ui/vendor/../app.py").status_code == 404
        assert client.get("/ui/static/nope.js").status_code == 404
        assert client.get("/ui/sign-in").status_code == 200


def test_chart_groups_cover_the_report_charts_and_every_tool_metric() -> None:
    groups = {group["id"]: group for group in chart_groups()}
    assert {"entropy", "gate", "quadrants", "reward", "length", "throughput", "tool"} <= set(groups)
    tool_keys = {m.key for m in catalogue.CATALOGUE if m.key.startswith("tool/")}
    assert tool_keys and {s["key"] for s in groups["tool"]["series"]} == tool_keys
    assert groups["entropy"]["band"] == ["entropy/band_low", "entropy/band_high"]
    every_key = {s["key"] for group in groups.values() for s in group["series"]}
    assert every_key <= set(catalogue.METRICS)


@pytest.mark.parametrize("next_path", ["https://evil.example/", "//evil.example", "/ui/jobs/../x"])
def test_sign_in_page_never_redirects_off_site(client: TestClient, next_path: str) -> None:
    page = client.get("/ui/sign-in", params={"next": next_path})
    assert page.status_code == 200 and 'data-next="/ui/jobs"' in page.text
    assert 'method="post"' in page.text  # a browser without scripts POSTs the key; never a GET query


def test_hostile_page_requests_get_a_clear_4xx(client: TestClient, tenant: TenantKey) -> None:
    """The page routes are outside the schema the fuzzers read, so their bad inputs are listed here."""
    job_id = create_job(client, tenant.headers)
    _signed_in(client, tenant.key)
    token = _csrf(client, job_id)
    cases = [
        ("GET", "/ui/jobs/job_%00x", {}, None, 422),
        ("GET", "/ui/jobs/" + "j" * 65, {}, None, 422),
        ("GET", f"/v1/jobs/{job_id}/live", {"Last-Event-ID": "1" * 30}, None, 422),
        ("GET", f"/v1/jobs/{job_id}/live", {"Last-Event-ID": "1.x"}, None, 400),
        ("GET", f"/v1/jobs/{job_id}/metrics?since_step=-1", {}, None, 422),
        ("GET", f"/v1/jobs/{job_id}/metrics?limt=5", {}, None, 422),
        ("GET", "/ui/sign-in?next=" + "x" * 200, {}, None, 422),
        ("POST", "/ui/session", SIGN_IN, b"{not json", 422),
        ("POST", "/ui/session", SIGN_IN, b'{"api_key": 5}', 422),
        ("POST", "/ui/session", SIGN_IN, b'{"api_key": "a\\u0000b"}', 422),
        ("POST", "/ui/session", SIGN_IN, b'{"api_key": "k", "extra": 1}', 422),
        ("POST", "/ui/session", SIGN_IN, b'{"api_key": "' + b"k" * 300 + b'"}', 422),
        ("POST", f"/v1/jobs/{job_id}/pause", {"X-CSRF-Token": "t" * 300}, None, 422),
        ("POST", "/v1/jobs/job_nope/pause", {"X-CSRF-Token": token}, None, 404),
    ]
    for method, path, headers, body, expected in cases:
        response = client.request(
            method, path, headers={"Content-Type": "application/json", **headers}, content=body
        )
        assert response.status_code == expected, (method, path, response.status_code, response.text)
        if "json" in response.headers.get("content-type", ""):
            assert response.json()["error"]["message"]
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["status"] == "queued"


# ------------------------------------------------------------------------------ every page response's headers


def _app_routes(routes: list[Any], prefix: str = "") -> list[tuple[str, APIRoute]]:
    """(path, route) of every route in the app's table, included routers flattened."""
    found = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append((prefix + route.path, route))
        elif hasattr(route, "original_router"):  # an included router (FastAPI keeps it whole)
            found.extend(_app_routes(route.original_router.routes, prefix + route.include_context.prefix))
    return found


def _page_requests(app: Any, job_id: str) -> list[tuple[str, str]]:
    """(METHOD, URL) for every /ui route of the app's route table, path parameters filled in."""
    fill = {"job_id": job_id, "name": "page.js"}
    found = []
    for path, route in _app_routes(app.routes):
        if not (path == "/ui" or path.startswith("/ui/")):
            continue
        url = path
        for name in re.findall(r"{(\w+)}", url):
            url = url.replace("{" + name + "}", fill[name])
        found.extend((method, url) for method in sorted(route.methods))
    return found


def _assert_secured(response: Any, what: object) -> None:
    headers = response.headers
    assert "frame-ancestors 'none'" in headers.get("content-security-policy", ""), what
    assert "script-src 'self'" in headers["content-security-policy"], what
    assert headers.get("x-frame-options") == "DENY", what
    assert headers.get("x-content-type-options") == "nosniff", what
    assert headers.get("referrer-policy") == "no-referrer", what
    assert "cache-control" in headers, what


def test_every_page_response_carries_the_security_headers(
    client: TestClient, tenant: TenantKey, make_tenant: Callable[[], TenantKey]
) -> None:
    """Walks the route table: every /ui route, signed in and out, and its errors and redirects (the report
    page was once served without them)."""
    job_id = create_job(client, tenant.headers)
    theirs = create_job(client, make_tenant().headers)
    requests = _page_requests(client.app, job_id)
    assert ("GET", f"/ui/jobs/{job_id}/report") in requests and ("DELETE", "/ui/session") in requests
    for signed_in in (False, True):
        client.cookies.clear()
        if signed_in:
            _signed_in(client, tenant.key)
        for method, url in requests:
            body = {"api_key": tenant.key} if url == "/ui/session" and method == "POST" else None
            response = client.request(method, url, json=body, headers=SIGN_IN, follow_redirects=False)
            assert response.status_code < 500, (method, url, response.text)
            _assert_secured(response, (signed_in, method, url, response.status_code))
    errors = [
        ("GET", f"/ui/jobs/{theirs}/report"),  # another tenant's: the 404 page
        ("GET", f"/ui/jobs/{theirs}"),
        ("GET", "/ui/jobs/job_%00x"),  # refused by the request boundary
        ("GET", "/ui/jobs/" + "j" * 65),
        ("GET", "/ui/nope"),
        ("PUT", "/ui/jobs"),
        ("GET", "/ui/static/nope.js"),
        ("GET", "/ui/sign-in?limt=1"),
        ("DELETE", "/ui/session"),  # no CSRF token: 403
    ]
    for method, url in errors:
        response = client.request(method, url, follow_redirects=False)
        assert 400 <= response.status_code < 500, (method, url, response.status_code)
        _assert_secured(response, (method, url, response.status_code))
    client.cookies.clear()
    assert client.get(f"/ui/jobs/{job_id}/report", follow_redirects=False).status_code == 303
    static = client.get("/ui/static/page.js")
    assert static.headers["cache-control"] == "no-cache"  # a route's own Cache-Control is kept
    assert "content-security-policy" not in client.get("/healthz").headers  # pages only


# ------------------------------------------------------------------------------------------ Last-Event-ID


def test_last_event_id_has_one_bounded_parser() -> None:
    assert parse_last_event_id(None, 2) == (0, 0) and parse_last_event_id(" ", 1) == (0,)
    assert parse_last_event_id("2147483647.2147483647", 2) == (2**31 - 1, 2**31 - 1)
    assert parse_last_event_id(" 12 ", 1) == (12,)
    for value, fields in [
        ("2147483648.0", 2),
        ("0.2147483648", 2),
        ("2147483648", 1),
        ("12", 2),
        ("1.2", 1),
        ("1.2.3", 2),
        ("\u0663.1", 2),
        ("-1.0", 2),
        ("1e3.0", 2),
        ("0x10", 1),
    ]:
        with pytest.raises(BadRequest) as refused:
            parse_last_event_id(value, fields)
        assert refused.value.param == "Last-Event-ID", value


@pytest.mark.parametrize(
    "value",
    ["2147483648.0", "0.2147483648", "99999999999.1", "2147483647.2147483647", "0.0", "1.", ".1", "1..2"],
)
def test_no_last_event_id_breaks_a_stream(
    client: TestClient, db: Database, tenant: TenantKey, value: str
) -> None:
    """Out of the 32-bit range was once a 200 that died on the database's error mid-stream; now every
    value is a 400 or a whole stream (its `end` frame included), on both streams."""
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 2)
    worker.finish("succeeded")
    for url in (f"/v1/jobs/{job_id}/live", f"/v1/jobs/{job_id}/events?stream=true"):
        response = client.get(url, headers={**tenant.headers, "Last-Event-ID": value})
        assert response.status_code in (200, 400), (url, value, response.status_code, response.text)
        if response.status_code == 200:
            assert response.text.endswith('"status": "succeeded"}\n\n'), (url, value, response.text[-300:])
        else:
            assert response.json()["error"]["param"] == "Last-Event-ID"
