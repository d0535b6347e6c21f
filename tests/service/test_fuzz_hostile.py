"""Hostile-value fuzzing of every operation, the documented ones and the job page's routes the schema leaves
out (Hypothesis, real app, real PostgreSQL): the inputs an attacker or a careless client sends that a
schema-driven generator rarely reaches. Each case takes a valid request, authenticated by the Bearer key or
by the page's session cookie (with its CSRF token), and makes one part of it hostile (a path id, a query
value, one of the headers the service reads, one leaf of the JSON body, a line of an uploaded file) with:
- strings holding NUL, lone surrogates, control characters, non-ASCII digits, very long runs;
- numbers that are NaN, ±Infinity, overflowing literals (1e999), 5,000-digit integers, past 64-bit range;
- structures nested 100,000 deep, or swapped in where a scalar belongs.
No answer may be a 5xx; every refusal is in the error shape; every event stream that starts ends whole (its
`end` frame: the fuzzed job has finished). Cases per operation: STARE_FUZZ_EXAMPLES (default
25 in the test suite; `make fuzz` raises it). The count is printed at the end of the session.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.service import conftest
from tests.service.helpers import GOOD_JSONL, TINY_SPEC, documented_operations, page_operations

EXAMPLES = int(os.environ.get("STARE_FUZZ_EXAMPLES", "25"))

# Raw JSON text that json.dumps cannot write: a placeholder string is swapped for it after serialising.
RAW_LITERALS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000, "-" + "9" * 80, "1" * 4301]
DEEP = "[" * 100_000 + "]" * 100_000
PAST_DEPTH = '{"a": ' * 40 + "1" + "}" * 40

hostile_text = st.one_of(
    st.text(min_size=0, max_size=20).map(lambda s: s + "\x00"),
    st.text(min_size=0, max_size=20).map(lambda s: "\x00" + s),
    st.sampled_from(["\ud800", "a\udfffb", "\u0663", "\u00b2", "\u2167", "\uff11", "\u202e", "\ufeff"]),
    st.text(alphabet=st.characters(max_codepoint=0x1F), min_size=1, max_size=10),
    st.sampled_from(["9" * 40, "-1", "2147483648", "9223372036854775808", "1e999", "NaN", "inf", "-0"]),
    st.sampled_from(["2147483648.0", "0.2147483648", "2147483647.2147483647", "1.", ".1", "1..2"]),
    st.sampled_from(["x" * 5000, "../../etc/passwd", "%00", "'; DROP TABLE jobs;--", "{{7*7}}"]),
)
hostile_number = st.one_of(
    st.sampled_from(RAW_LITERALS).map(lambda raw: f"@@raw:{raw}"),
    st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**30, -1, 0, -0.0, 1e308, 5e-324]),
)
hostile_structure = st.one_of(
    st.just(f"@@raw:{DEEP}"),
    st.just(f"@@raw:{PAST_DEPTH}"),
    st.sampled_from([[], {}, [None], {"\x00": 1}, None, True, [[[[["x"]]]]]]),
)
hostile_value = st.one_of(hostile_text, hostile_number, hostile_structure)


def _serialise(body: Any) -> bytes:
    text = json.dumps(body)  # NaN/Infinity allowed: json.dumps writes them
    for raw in set(_raw_placeholders(body)):
        text = text.replace(json.dumps(f"@@raw:{raw}"), raw)
    return text.encode("utf-8", "surrogatepass")


def _raw_placeholders(node: Any) -> Iterator[str]:
    if isinstance(node, str) and node.startswith("@@raw:"):
        yield node[len("@@raw:") :]
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _raw_placeholders(key)
            yield from _raw_placeholders(value)
    elif isinstance(node, list):
        for value in node:
            yield from _raw_placeholders(value)


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node:
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    else:
        yield path


def _set(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node[path[0]] = _set(node[path[0]], path[1:], value)
    return node


# Every request header the service reads (authentication, the page's CSRF token and sign-in marker,
# idempotency, stream resumption, content negotiation, and what the static files' FileResponse reads for
# conditional and range requests): each one gets hostile values on every operation.
READ_HEADERS = [
    "Authorization",
    "Cookie",
    "X-CSRF-Token",
    "X-Stare-Sign-In",
    "Idempotency-Key",
    "Last-Event-ID",
    "Accept",
    "Content-Type",
    "Origin",
    "Range",
    "If-Range",
    "If-None-Match",
    "If-Modified-Since",
]
KNOWN_NAMES = {"/ui/static/{name}": "page.js", "/ui/vendor/{name}": "uPlot.min.css"}

BASE_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/ui/session"): {"api_key": "@@key"},
    ("POST", "/v1/jobs"): {"spec": TINY_SPEC, "metadata": {"team": "ml"}},
    ("POST", "/v1/jobs/estimate"): {"spec": TINY_SPEC, "metadata": {"team": "ml"}},
    ("POST", "/v1/api-keys"): {"name": "ci"},
    ("POST", "/v1/verifiers/test"): {
        "verifier": {"name": "exact_match", "params": {}},
        "completion": "4",
        "example": {"prompt": "2+2=", "answer": "4", "meta": {}},
        "reward_style": "binary",
    },
}


def _operations() -> list[tuple[str, str, list[dict[str, Any]], bool]]:
    documented = [
        (path, method, spec.get("parameters", []), "requestBody" in spec)
        for path, method, spec in documented_operations()
    ]
    return documented + page_operations()


OPERATIONS = _operations()


@pytest.fixture(scope="module")
def world(fuzz_world: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The fuzzers' shared world (conftest.fuzz_world), one real object of each kind for the path ids."""
    with TestClient(fuzz_world["app"], raise_server_exceptions=False) as client:
        ids = {name: known[0] for name, known in fuzz_world["ids"].items()}
        yield {
            "client": client,
            "headers": fuzz_world["tenant"].headers,
            "page_headers": fuzz_world["page_headers"],
            "key": fuzz_world["tenant"].key,
            "ids": ids,
        }


@pytest.mark.parametrize(
    ("path", "method", "parameters", "has_body"), OPERATIONS, ids=[f"{m} {p}" for p, m, _, _ in OPERATIONS]
)
def test_hostile_values_never_get_a_server_error(
    world: dict[str, Any], path: str, method: str, parameters: list[dict[str, Any]], has_body: bool
) -> None:
    client: TestClient = world["client"]
    targets = [f"{p['in']}:{p['name']}" for p in parameters]
    if has_body:
        targets.append("body")
    if not targets:
        targets = ["query:unexpected"]
    targets += [f"header:{name}" for name in READ_HEADERS if f"header:{name}" not in targets]
    label = f"hostile {method} {path}"

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        target=st.sampled_from(targets),
        value=hostile_value,
        pick=st.randoms(use_true_random=False),
        as_page=st.booleans(),
    )
    def run(target: str, value: Any, pick: random.Random, as_page: bool) -> None:
        url, query, headers, content, files = _request(world, path, method, target, value, pick, as_page)
        conftest.SCHEMATHESIS_CASES[label] = conftest.SCHEMATHESIS_CASES.get(label, 0) + 1
        client.cookies.clear()  # only the case's own Cookie header (sign-in and sign-out set the jar's)
        response = client.request(method, url, params=query, headers=headers, content=content, files=files)
        assert response.status_code < 500, (
            target,
            repr(value)[:200],
            response.status_code,
            response.text[:500],
        )
        if response.status_code >= 400 and response.headers.get("content-type", "").startswith(
            "application/json"
        ):
            error = response.json()["error"]
            assert set(error) >= {"code", "message", "param"}, response.text[:500]
            # The database's own refusal is only a fallback: the boundary must have stopped the value first.
            assert error["code"] != "invalid_value", (target, repr(value)[:200], response.text[:500])
        if response.status_code == 200 and response.headers.get("content-type", "").startswith(
            "text/event-stream"
        ):  # not cut: the stream of a finished job ends with its `end` frame
            last = response.text.rstrip("\n").rsplit("\n\n", 1)[-1]
            assert last.startswith("event: end\n"), (target, repr(value)[:200], response.text[-500:])

    run()


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value.removeprefix("@@raw:")[:6000]
    return json.dumps(value) if not isinstance(value, float) else repr(value)


def _request(
    world: dict[str, Any],
    path: str,
    method: str,
    target: str,
    value: Any,
    pick: random.Random,
    as_page: bool,
) -> tuple[str, list[tuple[str, str]], dict[str, Any], bytes | None, Any]:
    ids = {**world["ids"], "name": KNOWN_NAMES.get(path, "page.js")}
    where, _, name = target.partition(":")
    url = path
    for param, known in ids.items():
        if "{" + param + "}" in url:
            text = _text(value) if where == "path" and name == param else known
            url = url.replace("{" + param + "}", quote(text.encode("utf-8", "surrogatepass"), safe=""))
    query: list[tuple[str, str]] = []
    headers: dict[str, Any] = {"X-Stare-Sign-In": "1", **world["page_headers" if as_page else "headers"]}
    if where == "query":
        query.append((name, _text(value).encode("utf-8", "surrogatepass").decode("latin-1")))
    elif where == "header":
        raw = _text(value).encode("utf-8", "surrogatepass").replace(b"\r", b"").replace(b"\n", b"")
        if name == "Cookie" and pick.random() < 0.5:  # a hostile session cookie, not only a hostile header
            raw = b"stare_session=" + raw
        headers[name] = raw
    content: bytes | None = None
    files = None
    if (method, path) in BASE_BODIES:
        body = copy.deepcopy(BASE_BODIES[(method, path)])
        if body.get("api_key") == "@@key":
            body["api_key"] = world["key"]
        if where == "body":
            leaves = list(_leaves(body))
            if pick.random() < 0.2:  # a hostile key instead of a hostile value
                body[_text(value)[:50] if isinstance(value, str) else "x\x00"] = 1
            else:
                body = _set(body, pick.choice(leaves), value)
        content = _serialise(body)
        headers.setdefault("Content-Type", "application/json")
    elif path == "/v1/files" and method == "POST":
        line = {"prompt": "1+1=", "answer": "2", "meta": {"k": value}} if where == "body" else None
        data = GOOD_JSONL + (_serialise(line) + b"\n" if line else b"")
        files = {"file": ("data.jsonl", data, "application/jsonl")}
    elif where == "body":
        content = (
            _serialise(value) if not isinstance(value, str) else _text(value).encode("utf-8", "surrogatepass")
        )
        headers.setdefault("Content-Type", "application/json")
    return url, query, headers, content, files
