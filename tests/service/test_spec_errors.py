"""Every problem of a spec in one 422 (issue 46, item 3): each at its exact field path, in plain words, with
"did you mean" for an unknown field or name, against the app on PostgreSQL."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC
from tests.service.test_errors import assert_error

LIBRARY_WORDS = ("Value error", "Extra inputs", "Input should be", "pydantic", "Assertion failed")


def four_mistakes() -> dict[str, Any]:
    spec = copy.deepcopy(TINY_SPEC)
    spec["optim"] = {"steps": 20, "learning_rate": 1e-3}  # our name is lr
    spec["evaluation"] = {"k": 2}  # greedy is on by default
    spec["algorithm"] = {"name": "grop"}  # grpo
    spec["sampling"] = {"group_size": "eight"}  # a whole number
    return spec


@pytest.mark.parametrize("path", ["/v1/jobs/estimate", "/v1/jobs"])
def test_four_mistakes_come_back_in_one_422_with_their_exact_paths(
    client: TestClient, tenant: TenantKey, path: str
) -> None:
    error = assert_error(client.post(path, json={"spec": four_mistakes()}, headers=tenant.headers), 422)
    assert error["code"] == "invalid_spec"
    by_field = {d["field"]: d for d in error["details"]}
    assert set(by_field) == {"optim.learning_rate", "evaluation.k", "algorithm.name", "sampling.group_size"}
    assert {d["param"] for d in error["details"]} == {f"spec.{f}" for f in by_field}
    assert error["param"] in {d["param"] for d in error["details"]}

    lr = by_field["optim.learning_rate"]
    assert (lr["code"], lr["suggestion"]) == ("unknown_field", "lr")
    assert "did you mean `lr`" in lr["message"]
    algorithm = by_field["algorithm.name"]
    assert (algorithm["code"], algorithm["suggestion"]) == ("invalid_value", "grpo")
    assert "did you mean `grpo`" in algorithm["message"]
    k = by_field["evaluation.k"]
    assert "on by default" in k["message"] and "evaluation.greedy: false" in k["message"]
    assert by_field["sampling.group_size"]["code"] == "wrong_type"
    assert "whole number" in by_field["sampling.group_size"]["message"]

    assert error["message"].startswith("4 problems in the spec")
    for field in by_field:
        assert field in error["message"]
    everything = error["message"] + " ".join(d["message"] for d in error["details"])
    for words in LIBRARY_WORDS:
        assert words not in everything


def test_an_unknown_model_and_verifier_are_said_with_the_field_errors(
    client: TestClient, tenant: TenantKey
) -> None:
    spec = copy.deepcopy(TINY_SPEC)
    spec["model"] = {"name": "tiny-arth"}
    spec["verifier"] = {"name": "exactt"}
    spec["sampling"] = {"max_tokens": 8}
    response = client.post("/v1/jobs/estimate", json={"spec": spec}, headers=tenant.headers)
    error = assert_error(response, 422, "invalid_spec")
    found = [(d["field"], d["code"], d["suggestion"]) for d in error["details"]]
    assert found == [  # in the order of the spec's sections
        ("model.name", "invalid_value", "tiny-arith"),
        ("verifier.name", "invalid_value", "exact"),
        ("sampling.max_tokens", "unknown_field", "max_new_tokens"),
    ]


@pytest.mark.parametrize(
    ("changes", "field", "code", "suggestion"),
    [
        ({"model": {"name": "tiny-arth"}}, "model.name", "unknown_model", "tiny-arith"),
        ({"verifier": {"name": "numerc"}}, "verifier.name", "unknown_verifier", "numeric"),
        (
            {"verifier": {"name": "exact", "params": {"case_sensitiv": True}}},
            "verifier.params.case_sensitiv",
            "invalid_spec",
            "case_sensitive",
        ),
        ({"model": {"name": "tiny-arith", "dtype": "bfloat61"}}, "model.dtype", "invalid_spec", "bfloat16"),
        (
            {"algorithm": {"name": "grpo", "params": {"clip_hihg": 0.3}}},
            "algorithm.params.clip_hihg",
            "invalid_spec",
            "clip_high",
        ),
    ],
)
def test_a_lone_mistake_keeps_its_code_and_names_what_was_meant(
    client: TestClient, tenant: TenantKey, changes: dict[str, Any], field: str, code: str, suggestion: str
) -> None:
    spec = {**copy.deepcopy(TINY_SPEC), **changes}
    response = client.post("/v1/jobs", json={"spec": spec}, headers=tenant.headers)
    error = assert_error(response, 422, code, f"spec.{field}")
    assert [(d["field"], d["suggestion"]) for d in error["details"]] == [(field, suggestion)]
    assert f"did you mean `{suggestion}`?" in error["message"]
