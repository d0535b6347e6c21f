"""The warnings a job earns before it runs (contract.warnings.spec_warnings), for POST /v1/jobs/estimate
and POST /v1/jobs: the spec, and for a model whose alphabet is known, the uploaded file's prompts and
answers, read line by line in the thread pool (the file passed the upload's checks, so each line is an
object; a line that no longer parses is skipped)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from starlette.concurrency import run_in_threadpool

from contract.catalog import MODEL_ALPHABETS
from contract.spec import TrainSpec
from contract.warnings import spec_warnings
from store.artifacts import ArtifactStorage


def _records(storage: ArtifactStorage, key: str) -> Iterator[dict[str, Any]]:
    with storage.open(key) as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def _warnings(spec: TrainSpec, storage: ArtifactStorage) -> list[dict[str, Any]]:
    reads_file = spec.task.source == "jsonl" and spec.task.path and spec.model.name in MODEL_ALPHABETS
    records = _records(storage, spec.task.path or "") if reads_file else iter(())
    return spec_warnings(spec, records)


async def job_warnings(spec: TrainSpec, storage: ArtifactStorage) -> list[dict[str, Any]]:
    """The spec's warnings (the file read off the event loop)."""
    if spec.task.source == "jsonl" and spec.model.name in MODEL_ALPHABETS:
        return await run_in_threadpool(_warnings, spec, storage)
    return _warnings(spec, storage)
