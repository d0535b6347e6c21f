"""Shared test data and a stand-in for the worker's writes (the real repository functions, as issue 5's
worker will call them)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from store import repository
from store.database import Database

# A small, valid spec (the built-in tiny model, arithmetic task): cheap to validate.
TINY_SPEC: dict[str, Any] = {
    "name": "tiny",
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "params": {"operations": ["+"], "min_operand": 0, "max_operand": 9}},
    "algorithm": {"name": "stare"},
    "optim": {"steps": 20},
    "entropy_band": {"low": 0.1, "high": 1.0},
    "checkpoint": {"interval": 5},
}

GOOD_JSONL = b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4", "meta": {"k": 1}}\n'


def create_job(client: TestClient, headers: Mapping[str, str], spec: Mapping[str, Any] | None = None) -> str:
    response = client.post("/v1/jobs", json={"spec": dict(spec or TINY_SPEC)}, headers=dict(headers))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def upload(
    client: TestClient,
    headers: Mapping[str, str],
    content: bytes,
    *,
    filename: str = "data.jsonl",
    **data: str,
) -> Any:
    return client.post(
        "/v1/files",
        files={"file": (filename, content, "application/jsonl")},
        data=data,
        headers=dict(headers),
    )


def step_metrics(step: int, entropy: float, *, state: int = 0, out_of_band: int = 0) -> dict[str, float]:
    return {
        "entropy/mean": entropy,
        "entropy/band_low": 0.1,
        "entropy/band_high": 1.0,
        "entropy/band_state": float(state),
        "entropy/steps_out_of_band": float(out_of_band),
        "stare/gate_on": 1.0,
        "reward/accuracy": 0.25 + 0.01 * step,
        "reward/mean": 0.25 + 0.01 * step,
        "perf/step_seconds": 2.0,
    }


class FakeWorker:
    """Drives a job through the worker-side repository functions, the way the worker process will."""

    def __init__(self, db: Database, job_id: str, owner: str = "test-worker") -> None:
        self.db = db
        self.job_id = job_id
        with db.transaction() as session:
            claim = repository.claim_job(session, job_id, owner=owner, lease_s=30)
        assert claim is not None, f"could not claim {job_id}"
        self.claim = claim
        self.token = claim.lease_token

    def steps(self, first: int, last: int, entropy: float = 0.5) -> None:
        for step in range(first, last + 1):
            with self.db.transaction() as session:
                assert repository.record_step_metrics(
                    session, self.job_id, self.token, step, step_metrics(step, entropy)
                )

    def checkpoint(self, artifact_root: Path, step: int, files: Mapping[str, bytes] | None = None) -> str:
        relative = f"{self.claim.run_dir}/checkpoints/step-{step:06d}"
        folder = artifact_root / relative
        (folder / "model").mkdir(parents=True, exist_ok=True)
        for name, data in (
            files or {"model/weights.bin": b"\x00\x01" * 600, "state.json": b'{"step": 1}'}
        ).items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        with self.db.transaction() as session:
            checkpoint_id = repository.add_checkpoint(session, self.job_id, self.token, step, relative)
        assert checkpoint_id is not None
        return checkpoint_id

    def finish(self, status: str = "succeeded", error: repository.JobError | None = None) -> None:
        with self.db.transaction() as session:
            assert repository.finish_job(session, self.job_id, self.token, status, error=error)


def new_job(tenant_id: str, **overrides: Any) -> repository.NewJob:
    """A job row ready for repository.create_job, without the HTTP route: the tiny STARE spec, queue
    "training", 10 steps; keyword arguments replace any field."""
    fields: dict[str, Any] = {
        "tenant_id": tenant_id,
        "name": None,
        "spec": dict(TINY_SPEC),
        "resolved_spec": {},
        "spec_hash": "0" * 64,
        "model": "tiny-arith",
        "algorithm": "stare",
        "queue": "training",
        "training_file_id": None,
        "metadata": {},
        "total_steps": 10,
        "max_attempts": 3,
    }
    fields.update(overrides)
    return repository.NewJob(**fields)


def documented_operations() -> list[tuple[str, str, dict[str, Any]]]:
    """(path, METHOD, OpenAPI operation) for every operation the API documents, read from an app that is
    never served (the fuzzers' list of what to drive)."""
    import tempfile

    from service.app import create_app
    from service.settings import Settings

    app = create_app(
        Settings(database_url="sqlite://", queue_backend="record", artifact_root=Path(tempfile.mkdtemp()))
    )
    return [
        (path, method.upper(), spec)
        for path, item in app.openapi()["paths"].items()
        for method, spec in item.items()
    ]


def page_operations() -> list[tuple[str, str, list[dict[str, Any]], bool]]:
    """(path, METHOD, parameters as OpenAPI writes them, has a body) for every route the OpenAPI schema
    leaves out (the job page's, under /ui), read from the app's route table: the fuzzers drive them too."""
    import tempfile

    from fastapi.dependencies.models import Dependant
    from fastapi.routing import APIRoute

    from service.app import create_app
    from service.settings import Settings

    def flat(routes: list[Any], prefix: str = "") -> list[tuple[str, APIRoute]]:
        found: list[tuple[str, APIRoute]] = []
        for route in routes:
            if isinstance(route, APIRoute):
                found.append((prefix + route.path, route))
            elif hasattr(route, "original_router"):  # an included router
                found.extend(flat(route.original_router.routes, prefix + route.include_context.prefix))
        return found

    def parameters(dependant: Dependant) -> list[dict[str, Any]]:
        found = [
            {"in": where, "name": param.alias}
            for where, params in (
                ("path", dependant.path_params),
                ("query", dependant.query_params),
                ("header", dependant.header_params),
                ("cookie", dependant.cookie_params),
            )
            for param in params
        ]
        for sub in dependant.dependencies:
            found.extend(p for p in parameters(sub) if p not in found)
        return found

    app = create_app(
        Settings(database_url="sqlite://", queue_backend="record", artifact_root=Path(tempfile.mkdtemp()))
    )
    return [
        (path, method, parameters(route.dependant), bool(route.dependant.body_params))
        for path, route in flat(app.routes)
        if not route.include_in_schema
        for method in sorted(route.methods)
    ]
