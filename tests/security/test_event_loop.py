"""Issue 44, R3: no request holds the event loop, authenticated or not.

Before, the request boundary parsed and walked every JSON body on the event loop before authentication: one
unauthenticated 1 MiB body with a `\\ud83d` escape and 16-deep arrays cost the loop 0.4-1.4 s (/healthz
waited that long; 8 at once, 3.1 s), and 400 pipelined requests with a wrong key got 400 401s, no 429. Now
authentication and the rate limits (per key, per tenant, and per source address for whatever proves no key)
run from the headers before a byte of the body is read, and the body check is linear and mostly in C
(contract.safejson).

The latency test runs the real API (`python -m service serve`, production rate limits) on PostgreSQL with
8 clients sending the worst bodies (bench/event_loop_load.py), half with valid keys and half with a wrong
one, while a probe times GET /healthz: p99 at most 100 ms.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.event_loop_load import run as run_bench
from bench.event_loop_load import worst_bodies
from contract import safejson
from tests.service.conftest import TenantKey

REPO_ROOT = Path(__file__).resolve().parents[2]
P99_S = 0.100


def _count_reads(client: TestClient) -> list[int]:
    """How many body chunks the app read, per request (the boundary wraps `receive`)."""
    reads: list[int] = []
    app = client.app
    original = app.middleware_stack  # type: ignore[attr-defined]

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        count = 0

        async def counted() -> Any:
            nonlocal count
            message = await receive()
            if message.get("type") == "http.request":
                count += 1
            return message

        try:
            await original(scope, counted, send)
        finally:
            reads.append(count)

    app.middleware_stack = counting  # type: ignore[attr-defined]
    return reads


def test_a_request_without_a_valid_key_is_refused_before_its_body_is_read(
    make_client: Any, tenant: TenantKey
) -> None:
    client = make_client()
    client.get("/healthz")  # the middleware stack is built
    reads = _count_reads(client)
    body = worst_bodies()["deep"]
    for headers in ({}, {"Authorization": "Bearer sk-stare-wrong"}, {"Authorization": "Basic x"}):
        response = client.post(
            "/v1/jobs/estimate", content=body, headers={**headers, "Content-Type": "application/json"}
        )
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")
    assert reads == [0, 0, 0], "the body was read before authentication"
    # with a key, the same body is read and refused by its size in values (before it is parsed)
    response = client.post(
        "/v1/jobs/estimate", content=body, headers={**tenant.headers, "Content-Type": "application/json"}
    )
    assert response.status_code == 422 and response.json()["error"]["code"] == "too_many_values", (
        response.text
    )
    assert reads[-1] > 0


def test_wrong_keys_from_one_address_meet_a_429_after_the_burst(make_client: Any) -> None:
    client = make_client(address_rate_limit_per_second=0.001, address_rate_limit_burst=20)
    statuses = [
        client.get("/v1/jobs", headers={"Authorization": f"Bearer sk-stare-wrong{n}"}).status_code
        for n in range(400)
    ]
    assert statuses[:20] == [401] * 20
    assert statuses[20:] == [429] * 380
    refused = client.get("/v1/jobs", headers={"Authorization": "Bearer sk-stare-wrong"})
    assert (
        refused.json()["error"]["code"] == "address_rate_limit_exceeded" and "Retry-After" in refused.headers
    )
    assert client.get("/healthz").status_code == 200  # liveness is never limited


def test_a_cached_key_spends_no_address_token(make_client: Any, tenant: TenantKey) -> None:
    client = make_client(address_rate_limit_per_second=0.001, address_rate_limit_burst=2)
    for _ in range(50):  # its first use looks it up (one token); then the principal cache answers
        assert client.get("/v1/jobs", headers=tenant.headers).status_code == 200
    assert client.get("/v1/jobs").status_code == 401  # the last token
    assert client.get("/v1/jobs").status_code == 429


def test_a_sign_in_spends_an_address_token_before_its_body_and_takes_a_small_body(make_client: Any) -> None:
    client = make_client(address_rate_limit_per_second=0.001, address_rate_limit_burst=3)
    headers = {"X-Stare-Sign-In": "1", "Content-Type": "application/json"}
    big = json.dumps({"api_key": "k" * 5000})
    assert client.post("/ui/session", content=big, headers=headers).status_code == 413
    for expected in (401, 401, 429):
        response = client.post("/ui/session", json={"api_key": "sk-stare-wrong"}, headers=headers)
        assert response.status_code == expected, response.text


# --- the body check ---------------------------------------------------------------------------------------

_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**70), max_value=10**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(
        alphabet=st.characters(codec="utf-8") | st.sampled_from(["\x00", '"', "\\", "[", "{", "\ud83d"])
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(
    value=_VALUES, nan=st.booleans(), ascii_only=st.booleans(), depth=st.integers(min_value=0, max_value=40)
)
def test_the_linear_check_refuses_exactly_what_the_full_walk_refuses(
    value: Any, nan: bool, ascii_only: bool, depth: int
) -> None:
    """contract.safejson.loads skips the walk when nothing is suspect: it must refuse exactly the documents
    the full walk (`_checked`, the old way) refuses, with the same problem."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    text = "[" * depth + text + "]" * depth
    if nan:
        text = text.replace("0", "NaN", 1)
    results = []
    for check in (
        lambda t: safejson.loads(t, max_values=10**9),
        lambda t: safejson._checked(t, safejson.MAX_DEPTH),
    ):
        try:
            check(text)
            results.append(None)
        except safejson.UnsafeDocument as err:
            results.append((err.problem.code, err.problem.path))
        except ValueError:
            results.append("not json")
    assert results[0] == results[1], text[:200]


def test_the_worst_bodies_cost_little_and_linear_time() -> None:
    """The check of each worst 1 MiB body, repeated; the cost reported (not asserted: the machine is shared).
    Each must be refused or accepted the same way as by the full walk."""
    for name, body in worst_bodies().items():
        start = time.perf_counter()
        try:
            safejson.loads(body, max_values=10_000)
            outcome = "accepted"
        except safejson.UnsafeDocument as err:
            outcome = err.problem.code
        elapsed = time.perf_counter() - start
        print(f"{name}: {outcome} in {1000 * elapsed:.1f} ms")
        assert outcome in ("too_many_values", "invalid_unicode", "accepted"), (name, outcome)


# --- the latency test -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_healthz_p99_stays_under_100ms_while_8_clients_send_the_worst_bodies() -> None:
    # dedicated: the API runs ahead of the machine's other work (this suite's other worker, other users of
    # a shared machine), not of its attackers; as root only, otherwise as it is.
    result = run_bench(REPO_ROOT, clients=8, seconds=15.0, dedicated=True)
    latency = result["healthz_ms"]
    print(json.dumps(result, indent=2))
    assert latency["count"] >= 100, result
    answers = result["answers"]
    assert int(answers.get("401", 0)) + int(answers.get("429", 0)) > 0, answers  # the unauthenticated ones
    assert int(answers.get("422", 0)) > 0, answers  # the authenticated ones, refused for their bodies
    assert latency["p99"] <= 1000 * P99_S, result


def test_large_bodies_are_read_a_few_at_a_time_one_per_tenant() -> None:
    """service/boundary.py: a JSON body over 64 KiB waits for one of 2 slots, one per tenant, and a
    tenant's 8 waiting ones are the most (429 too_many_large_bodies past them); small bodies never wait."""
    import anyio
    import httpx

    from service.boundary import LARGE_BODY_QUEUE, RequestBoundary

    release = anyio.Event()
    inside: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        inside.append(dict(scope["headers"])[b"x-tenant"].decode())
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def authenticate(scope: Any) -> None:
        tenant = dict(scope["headers"])[b"x-tenant"].decode()
        principal = type("P", (), {"tenant": type("T", (), {"id": tenant})()})()
        scope.setdefault("state", {})["stare_caller"] = type("C", (), {"principal": principal})()

    boundary = RequestBoundary(
        app,
        path_templates=list,
        max_bytes=2**20,
        upload_path="/v1/files",
        max_upload_bytes=2**20,
        authenticate=authenticate,
    )
    large = b'{"x": "' + b"y" * 70_000 + b'"}'

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=boundary)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            async def post(tenant: str, body: bytes) -> int:
                headers = {"x-tenant": tenant, "content-type": "application/json"}
                return (await client.post("/v1/x", content=body, headers=headers)).status_code

            results: dict[str, int] = {}
            async with anyio.create_task_group() as group:

                async def keep(name: str, tenant: str, body: bytes) -> None:
                    results[name] = await post(tenant, body)

                for n in range(1 + LARGE_BODY_QUEUE):
                    group.start_soon(keep, f"a{n}", "a", large)
                await anyio.sleep(0.2)
                assert inside == ["a"], inside  # one of tenant a's at a time
                assert await post("a", large) == 429  # its queue is full
                group.start_soon(keep, "b0", "b", large)
                group.start_soon(keep, "a-small", "a", b"{}")
                await anyio.sleep(0.2)
                assert sorted(inside) == ["a", "a", "b"], inside  # b's takes the second slot; small ones pass
                release.set()
            assert set(results.values()) == {200}, results
            return list(results.values())

    assert len(anyio.run(main)) == LARGE_BODY_QUEUE + 3
