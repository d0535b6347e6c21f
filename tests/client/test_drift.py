"""The client's typed models against the API's OpenAPI schema: the same field names, the same required
ones, for every object the client reads. A field added to, renamed in or dropped from service/schemas.py
fails here until stare_client/models.py follows."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from service.app import create_app
from service.settings import Settings
from stare_client import graders, models

PAIRS: dict[type[BaseModel], str] = {
    models.Tenant: "TenantObject",
    models.ApiKey: "ApiKeyObject",
    models.ApiKeyCreated: "ApiKeyCreated",
    models.ApiKeyList: "ApiKeyList",
    models.Limits: "Limits",
    models.Usage: "Usage",
    models.Me: "Me",
    models.File: "FileObject",
    models.FileList: "FileList",
    models.Deleted: "Deleted",
    models.Model: "ModelObject",
    models.ModelList: "ModelList",
    models.Estimate: "EstimateObject",
    models.MemoryPerDevice: "MemoryPerDevice",
    models.Progress: "Progress",
    models.EntropyBand: "EntropyBand",
    models.EntropyStatus: "EntropyStatus",
    models.EntropyTarget: "EntropyTarget",
    models.ControlStatus: "ControlStatus",
    models.LatestMetrics: "LatestMetrics",
    models.JobError: "JobError",
    models.JobWaiting: "JobWaiting",
    models.Job: "JobObject",
    models.JobList: "JobList",
    models.Event: "EventObject",
    models.EventList: "EventList",
    models.MetricPoint: "MetricPoint",
    models.MetricsHistory: "MetricsHistory",
    models.Checkpoint: "CheckpointObject",
    models.CheckpointList: "CheckpointList",
    models.GraderStatus: "GraderStatus",
    models.JobWarning: "JobWarning",
    models.Sample: "Sample",
    models.SampleSet: "SampleSet",
    models.JobSamples: "JobSamples",
    graders.GraderValidation: "GraderValidation",
    graders.GraderRun: "GraderRunResponse",
    graders.GraderResult: "GraderRunResult",
    graders.GraderRunError: "GraderRunError",
    graders.GraderWarning: "GraderFinding",
}


@pytest.fixture(scope="module")
def components() -> dict[str, Any]:
    settings = Settings(environment="development", database_url="sqlite:///:memory:", queue_backend="record")
    return dict(create_app(settings).openapi()["components"]["schemas"])


def _shape(schema: dict[str, Any]) -> tuple[set[str], set[str]]:
    return set(schema.get("properties", {})), set(schema.get("required", []))


@pytest.mark.parametrize("model", list(PAIRS), ids=lambda m: m.__name__)
def test_client_model_matches_the_api_schema(model: type[BaseModel], components: dict[str, Any]) -> None:
    server_fields, server_required = _shape(components[PAIRS[model]])
    client_fields, client_required = _shape(model.model_json_schema(mode="serialization"))
    assert client_fields == server_fields, (
        f"{model.__name__} vs {PAIRS[model]}: only in the client {sorted(client_fields - server_fields)}, "
        f"only in the API {sorted(server_fields - client_fields)}"
    )
    assert client_required == server_required, (
        f"{model.__name__} vs {PAIRS[model]}: required only in the client "
        f"{sorted(client_required - server_required)}, only in the API {sorted(server_required - client_required)}"
    )


def test_every_response_object_of_the_api_has_a_client_model(components: dict[str, Any]) -> None:
    mirrored = set(PAIRS.values())
    # Request bodies, the error shape (read by stare_client.errors), health and the verifier catalogue are
    # not objects the client returns; the job spec's components are the trainer's TrainSpec.
    not_returned = {
        "ApiKeyCreate",
        "JobCreate",
        "ErrorBody",
        "ErrorDetail",
        "ErrorResponse",
        "Health",
        "Readiness",
        "ExampleIn",
        "VerifierList",
        "VerifierObject",
        "VerifierParam",
        "VerifierRef",
        "VerifierTest",
        "VerifierTestError",
        "VerifierTestResult",
        "GraderValidate",
        "GraderRun",
        "GraderRow",
        "GraderSample",
        # the job spec's grader objects (contract/graders.py), parts of the TrainSpec like the *Spec ones
        "PythonGrader",
        "StringCheckGrader",
        "TextSimilarityGrader",
        "MultiGrader",
        # algorithm.control: a controller's settings (contract/control), a part of the TrainSpec
        "ControlSettings",
    }
    spec_parts = {name for name in components if name.endswith("Spec")}
    assert set(components) - mirrored - not_returned - spec_parts == set()


def test_job_statuses_match(components: dict[str, Any]) -> None:
    from stare_client.states import ALL_STATES

    assert set(components["JobObject"]["properties"]["status"]["enum"]) == ALL_STATES


def test_the_client_and_its_command_import_nothing_of_the_server_or_torch() -> None:
    """What `pip install stare-rl[client]` has is enough: importing the client and the CLI loads no torch,
    transformers, peft, pandas, server framework or package of ours beside stare_client."""
    import subprocess
    import sys

    heavy = {"torch", "transformers", "peft", "pandas", "fastapi", "starlette", "sqlalchemy", "celery"}
    ours = {"contract", "trainer", "service", "worker", "store", "experiments", "monitoring"}
    code = (
        "import sys, stare_client, stare_client.cli, stare_client.aio; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert loaded & (heavy | ours) == set(), loaded & (heavy | ours)
    assert {"httpx", "typer", "rich", "pydantic", "yaml"} <= loaded
