"""Models and verifiers offered by the server, and the verifier dry run."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from contract.catalog import BUILTIN_MODELS
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC
from tests.service.test_errors import assert_error
from trainer.tasks.verifiers import VERIFIERS


def test_models_list_builtin_and_configured_models(
    make_client: Callable[..., TestClient], tenant: TenantKey
) -> None:
    client = make_client(extra_models={"my-org/llama-1b": "Operator-provided 1B model"})
    models = {m["id"]: m for m in client.get("/v1/models", headers=tenant.headers).json()["data"]}
    assert set(models) == set(BUILTIN_MODELS) | {"my-org/llama-1b"}
    assert models["tiny-arith"]["builtin"] is True and models["my-org/llama-1b"]["builtin"] is False
    spec = {**TINY_SPEC, "model": {"name": "my-org/llama-1b"}}
    assert client.post("/v1/jobs/estimate", json={"spec": spec}, headers=tenant.headers).status_code == 200


def test_verifiers_list_the_registry_with_params(client: TestClient, tenant: TenantKey) -> None:
    data = client.get("/v1/verifiers", headers=tenant.headers).json()["data"]
    assert [v["name"] for v in data] == sorted(VERIFIERS)
    exact = next(v for v in data if v["name"] == "exact")
    assert exact["params"]["case_sensitive"]["type"] == "bool"


def test_verifier_dry_run(client: TestClient, tenant: TenantKey) -> None:
    def run(**body: object) -> dict[str, object]:
        response = client.post("/v1/verifiers/test", json=body, headers=tenant.headers)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    right = run(
        verifier={"name": "exact"}, completion="46\nbecause", example={"prompt": "12+34=", "answer": "46"}
    )
    assert right["score"] == 1.0 and right["reward"] == 1.0 and right["error"] is None
    assert right["params"] == {"extract": "first_line", "case_sensitive": False}
    wrong = run(verifier={"name": "exact"}, completion="45", example={"answer": "46"}, reward_style="pm1")
    assert wrong["score"] == 0.0 and wrong["reward"] == -1.0
    boxed = run(verifier={"name": "numeric"}, completion=r"so \boxed{1,234.0}", example={"answer": "1234"})
    assert boxed["score"] == 1.0
    unscorable = run(verifier={"name": "numeric"}, completion="12", example={"answer": "twelve"})
    assert unscorable["score"] is None and unscorable["error"]["code"] == "example_not_scorable"  # type: ignore[index]
    assert_error(
        client.post(
            "/v1/verifiers/test",
            json={"verifier": {"name": "python_exec"}, "completion": "x", "example": {"answer": "x"}},
            headers=tenant.headers,
        ),
        422,
        "unknown_verifier",
        "verifier.name",
    )
    assert_error(
        client.post(
            "/v1/verifiers/test",
            json={
                "verifier": {"name": "exact", "params": {"case_sensitive": "yes"}},
                "completion": "x",
                "example": {"answer": "x"},
            },
            headers=tenant.headers,
        ),
        422,
        param="verifier.params",
    )
