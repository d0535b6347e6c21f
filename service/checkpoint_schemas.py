"""Response bodies of a job's checkpoints (service/routers/checkpoints.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from service.schemas import MetricValues


class CheckpointObject(BaseModel):
    id: str
    object: Literal["job.checkpoint"] = "job.checkpoint"
    job_id: str
    step: int
    created_at: datetime
    bytes: int | None = Field(description="Total size of the checkpoint's files, when recorded.")
    sha256: str | None = Field(description="SHA-256 of the download's tar stream, once computed.")
    metrics: MetricValues | None = Field(description="The training metrics of the checkpoint's step.")
    download_url: str


class CheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[CheckpointObject]
