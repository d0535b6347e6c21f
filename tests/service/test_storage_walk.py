"""store/artifacts.py: a file removed while a folder is walked or sized (the worker pruning a checkpoint's
optimizer state while GET /v1/jobs/{id} sums the job's bytes, or a download lists it) is skipped, never an
error: the walk answers for the files that are there."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.artifacts import LocalArtifactStorage


def test_a_file_that_vanishes_during_the_walk_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalArtifactStorage(tmp_path)
    run = tmp_path / "ten_a" / "job_a" / "checkpoints" / "step-000002"
    (run / "sharded").mkdir(parents=True)
    (run / "model.safetensors").write_bytes(b"m" * 100)
    (run / "sharded" / "optim.distcp").write_bytes(b"o" * 1000)
    assert storage.size("ten_a/job_a") == 1100
    lstat = Path.lstat

    def pruned(self: Path) -> object:  # the worker removed it after os.walk listed it
        if self.name == "optim.distcp":
            self.unlink(missing_ok=True)
        return lstat(self)

    monkeypatch.setattr(Path, "lstat", pruned)
    assert [f.relative for f in storage.walk("ten_a/job_a")] == ["checkpoints/step-000002/model.safetensors"]
    assert storage.size("ten_a/job_a") == 100
