"""Property-based testing of the whole API against its own OpenAPI schema (Schemathesis, in-process ASGI,
authenticated with a real key on the real PostgreSQL database, or half the time with the job page's session
cookie and its CSRF token, the schema's other security scheme): no 5xx for any generated input, and every
response matches the documented status codes, content types, headers and body schemas. Negative cases
(schema-violating inputs) must be rejected with a 4xx.

Schemathesis's pytest plugin does not run under pytest 9 (its lazy fixture loader reads a removed
attribute), so each operation's strategy is driven with Hypothesis directly. In positive cases, path ids
are half the time replaced by the tenant's real objects, so state changes (cancel, pause, resume, delete)
and downloads run against real rows, not only 404s. The number of generated cases is printed at the end of
the session (see conftest.pytest_terminal_summary).
"""

from __future__ import annotations

import os
import random
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.service import conftest
from tests.service.helpers import documented_operations

# Cases per operation and mode; `make fuzz` raises it (STARE_SCHEMATHESIS_EXAMPLES).
MAX_EXAMPLES = int(os.environ.get("STARE_SCHEMATHESIS_EXAMPLES", "40"))


@schemathesis.check
def negative_data_rejected(ctx: Any, response: Any, case: Any) -> bool | None:
    """Schemathesis's negative_data_rejection, with 413 counted as a rejection too: a schema-violating body
    over the request-size limit (1 MiB) is refused by the size check before validation sees it.

    Not judged: a case whose only violation is an extra query parameter with an empty name. The HTTP client
    drops such a pair (`?after=&=x` goes out as `?after=`), so the server receives a valid request; unknown
    parameters that do arrive are refused (test_boundary.test_unknown_query_parameters_are_refused...)."""
    if response.status_code == 413:
        return None
    sent = parse_qsl(urlsplit(str(response.request.url)).query, keep_blank_values=True)
    if "" in (case.query or {}) and all(name for name, _ in sent):
        return None
    return negative_data_rejection(ctx, response, case)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejected,
]


def _operations() -> list[tuple[str, str, GenerationMode]]:
    """(path, method, mode) for every documented operation; negative cases only where there is an input to
    break (parameters or a body)."""
    found = []
    for path, method, spec in documented_operations():
        found.append((path, method, GenerationMode.POSITIVE))
        if spec.get("parameters") or spec.get("requestBody"):
            found.append((path, method, GenerationMode.NEGATIVE))
    return found


OPERATIONS = _operations()


@pytest.fixture(scope="module")
def api_schema(fuzz_world: dict[str, Any]) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_world["app"])


@pytest.mark.parametrize(
    ("path", "method", "mode"), OPERATIONS, ids=[f"{m} {p} {g.value}" for p, m, g in OPERATIONS]
)
def test_the_api_conforms_to_its_schema(
    api_schema: Any, fuzz_world: dict[str, Any], path: str, method: str, mode: GenerationMode
) -> None:
    operation = api_schema[path][method]
    ids: dict[str, list[str]] = fuzz_world["ids"]
    credentials = {"bearer": fuzz_world["tenant"].headers, "cookie": fuzz_world["page_headers"]}
    label = f"{method} {path} ({mode.value})"

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=operation.as_strategy(generation_mode=mode),
        use_real_ids=st.booleans(),
        pick=st.randoms(use_true_random=False),
        credential=st.sampled_from(sorted(credentials)),
    )
    def run(case: Any, use_real_ids: bool, pick: random.Random, credential: str) -> None:
        if use_real_ids and mode is GenerationMode.POSITIVE and case.path_parameters:
            for name, known in ids.items():
                if name in case.path_parameters:
                    case.path_parameters[name] = pick.choice(known)
        conftest.SCHEMATHESIS_CASES[label] = conftest.SCHEMATHESIS_CASES.get(label, 0) + 1
        headers = dict(credentials[credential])
        for name in case.headers or {}:  # a generated header (X-CSRF-Token is one) is the case's to send
            headers.pop(name, None)
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()
