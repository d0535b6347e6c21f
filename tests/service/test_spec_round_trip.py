"""One body, one answer: what the API accepts, the trainer accepts, number for number (issue 32, N8 and N9).

Each edge value goes through the real path on PostgreSQL and on SQLite: POST /v1/jobs (validated by
contract.spec.TrainSpec), the job row, the worker's claim and the spec file it writes for the trainer
(worker.launching.prepare_run), and the trainer's own loader (contract.spec.load_spec). A value the API
refuses is a 422 naming the field (the numeric bounds of contract/spec.py); a value it accepts comes back to
the trainer exactly as validated (the spec is stored as written: PostgreSQL `json`, not `jsonb`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contract.spec import MIN_TEMPERATURE, TrainSpec, load_spec
from store import migrate, repository
from store.artifacts import open_artifact_storage
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC
from worker.launching import prepare_run

EDGE_FLOATS = [1e70, 1e-300, 5e-324, 1.7976931348623157e308, 2.0**-1074 * 3]
BIG_INTS = [2**53 + 1, 2**63 + 1, 10**60 + 7]


def with_value(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TINY_SPEC)
    node = spec
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return spec


ACCEPTED = [
    *[("algorithm.params.clip_high", v) for v in [*EDGE_FLOATS, *BIG_INTS]],
    *[("algorithm.params.dual_clip_c", v) for v in [1e70, 1.7976931348623157e308, 2**53 + 1]],
    *[("verifier.params.abs_tol", v) for v in [*EDGE_FLOATS, 2**53 + 1]],
    ("optim.grad_clip", 1e6),
    ("optim.grad_clip", 5e-324),
    ("sampling.temperature", MIN_TEMPERATURE),
]
REFUSED = [
    ("optim.grad_clip", 1e70),
    ("optim.grad_clip", 1.7976931348623157e308),
    ("optim.grad_clip", 2**53 + 1),
    ("sft.grad_clip", 1e70),
    ("optim.warmup_steps", 2**53 + 1),
    ("checkpoint.interval", 10**60),
    ("evaluation.interval", 2**63 + 1),
    ("entropy_band.high", 1e70),
    ("model.lora.alpha", 2**53 + 1),
    ("sampling.temperature", 1e-300),
    ("sampling.temperature", 5e-324),
    ("sampling.temperature", 1e-4),
    ("evaluation.temperature", 1e-300),
]


@pytest.fixture(params=["postgresql", "sqlite"])
def backend(
    request: pytest.FixtureRequest,
    pg_url: str,
    db: Database,
    tmp_path: Path,
    make_client: Callable[..., TestClient],
    make_tenant: Callable[..., TenantKey],
) -> Iterator[tuple[TestClient, Database, TenantKey, Path]]:
    artifacts = tmp_path / "artifacts"
    if request.param == "postgresql":
        yield make_client(artifact_root=artifacts), db, make_tenant(), artifacts
        return
    url = f"sqlite:///{tmp_path / 'embedded.db'}"
    migrate.upgrade(url)
    sqlite = Database(url, pool_size=1)
    try:
        yield make_client(database_url=url, artifact_root=artifacts), sqlite, make_tenant(sqlite), artifacts
    finally:
        sqlite.dispose()


def trainer_reads(db: Database, job_id: str, artifacts: Path) -> TrainSpec:
    """The spec as the trainer loads it: claimed as a worker claims it, written where the worker writes it."""
    with db.transaction() as session:
        claim = repository.claim_job(session, job_id, owner="round-trip-test", lease_s=30)
    assert claim is not None
    spec_path, _, _ = prepare_run(claim, open_artifact_storage(artifacts))
    return load_spec(spec_path)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same type (an int is not a float here), NaN-free."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


def test_what_the_api_accepts_the_trainer_reads_unchanged(
    backend: tuple[TestClient, Database, TenantKey, Path],
) -> None:
    client, db, tenant, artifacts = backend
    for path, value in ACCEPTED:
        body = with_value(path, value)
        if path.startswith("verifier."):
            body["verifier"]["name"] = "numeric"
        created = client.post("/v1/jobs", json={"spec": body}, headers=tenant.headers)
        assert created.status_code == 201, (path, value, created.text)
        validated = TrainSpec.model_validate(body).resolved()  # what the API validated
        loaded = trainer_reads(db, created.json()["id"], artifacts)
        assert same(loaded.model_dump(mode="json"), validated), (path, value, loaded.resolved(), validated)
        assert same(loaded.resolved(), validated), (path, value)


def test_a_number_out_of_bounds_is_a_422_naming_the_field(
    backend: tuple[TestClient, Database, TenantKey, Path],
) -> None:
    client, _, tenant, _ = backend
    for path, value in REFUSED:
        body = with_value(path, value)
        if path.startswith("sft."):
            body["sft"]["steps"] = 0
        if path.startswith("model.lora"):
            body["model"]["lora"].setdefault("r", 4)
        for url in ("/v1/jobs/estimate", "/v1/jobs"):
            response = client.post(url, json={"spec": body}, headers=tenant.headers)
            assert response.status_code == 422, (path, value, url, response.text)
            error = response.json()["error"]
            assert error["param"] == f"spec.{path}", (value, error)
        with pytest.raises(ValueError, match=path.split(".")[-1]):
            TrainSpec.model_validate(body)  # the trainer's model says the same
