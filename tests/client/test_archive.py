"""Unpacking refuses what a checkpoint archive never holds (links, devices, FIFOs, absolute paths, `..`,
several top folders), writes nothing when it refuses, and unpacks a well-formed one byte for byte; the
digest check and `wait`'s state table."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from stare_client import ChecksumMismatch, UnsafeArchive, archive, states, transport
from stare_client.models import Checkpoint, Report


def _tar(path: Path, add: Callable[[tarfile.TarFile], None]) -> Path:
    with tarfile.open(path, "w") as tar:
        top = tarfile.TarInfo("job-step-000002")
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        add(tar)
    return path


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _special(kind: bytes, name: str, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        _file(tar, "job-step-000002/state.json", b"{}")
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        tar.addfile(info)

    return add


HOSTILE = {
    "symlink": (_special(tarfile.SYMTYPE, "job-step-000002/model", "/etc"), "symbolic link"),
    "hard link": (_special(tarfile.LNKTYPE, "job-step-000002/x", "job-step-000002/state.json"), "hard link"),
    "character device": (_special(tarfile.CHRTYPE, "job-step-000002/tty"), "device"),
    "block device": (_special(tarfile.BLKTYPE, "job-step-000002/disk"), "device"),
    "fifo": (_special(tarfile.FIFOTYPE, "job-step-000002/pipe"), "FIFO"),
    "absolute path": (lambda tar: _file(tar, "/tmp/stare-client-escape"), "absolute path"),
    "dot-dot": (lambda tar: _file(tar, "job-step-000002/../../escape"), r"\.\."),
    "two top folders": (lambda tar: _file(tar, "other/file"), "top-level"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_archives_are_refused_and_write_nothing(name: str, tmp_path: Path) -> None:
    add, message = HOSTILE[name]
    tar = _tar(tmp_path / "evil.tar", add)
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(UnsafeArchive, match=message):
        archive.safe_extract(tar, into)
    assert list(into.iterdir()) == []
    assert not Path("/tmp/stare-client-escape").exists()


def test_a_checkpoint_archive_unpacks_byte_for_byte(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 4000

    def add(tar: tarfile.TarFile) -> None:
        sub = tarfile.TarInfo("job-step-000002/model")
        sub.type = tarfile.DIRTYPE
        tar.addfile(sub)
        _file(tar, "job-step-000002/model/model.safetensors", payload)
        _file(tar, "job-step-000002/state.json", b'{"step": 2}')

    tar = _tar(tmp_path / "ok.tar", add)
    root = archive.safe_extract(tar, tmp_path / "tree")
    assert root == tmp_path / "tree" / "job-step-000002"
    assert (root / "model" / "model.safetensors").read_bytes() == payload
    assert (root / "model" / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert archive.loadable(root, merged=False, base_model=None) == (root / "model", "model")


def test_digest_and_size_are_checked() -> None:
    archive.verify("ab" * 32, 10, "AB" * 32, 10)
    with pytest.raises(ChecksumMismatch, match="stopped at 5 of 10"):
        archive.verify("ab" * 32, 5, "ab" * 32, 10)
    with pytest.raises(ChecksumMismatch, match="announced"):
        archive.verify("ab" * 32, 10, "cd" * 32, 10)
    with pytest.raises(ChecksumMismatch, match="no X-Content-SHA256"):
        archive.verify("ab" * 32, 10, None, 10)


def test_best_is_the_highest_held_out_score_among_evaluated_checkpoints() -> None:
    def ckpt(step: int) -> Checkpoint:
        return Checkpoint(
            id=f"ckpt_{step}",
            job_id="job_1",
            step=step,
            created_at="2026-01-01T00:00:00Z",
            bytes=1,
            sha256=None,
            metrics=None,
            download_url="/x",
        )

    report = Report.model_validate(
        {
            "report_version": 1,
            "job": {},
            "evaluation": {
                "history": [
                    {"step": 0, "avg_at_k": 0.1},
                    {"step": 2, "avg_at_k": 0.6},
                    {"step": 4, "avg_at_k": 0.6},
                    {"step": 6, "avg_at_k": 0.4},
                    {"step": 7, "avg_at_k": 0.9},
                ]
            },
        }
    )
    found = [ckpt(2), ckpt(4), ckpt(6), ckpt(8)]  # no checkpoint at step 7, no evaluation at step 8
    assert archive.select(found, "best", report).step == 4  # the tie goes to the later step
    assert archive.select(found, "latest").step == 8
    assert archive.select(found, 6).step == 6 and archive.select(found, "ckpt_2").step == 2


def test_wait_state_table() -> None:
    for status in ("validating", "queued", "running", "pausing", "recovering", "cancelling"):
        assert states.wait_action(status, "return") == "wait"
    for status in ("succeeded", "failed", "cancelled"):
        assert states.wait_action(status, "wait") == "return" and states.is_terminal(status)
    assert [states.wait_action("paused", p) for p in ("return", "wait", "raise")] == [
        "return",
        "wait",
        "raise",
    ]
    assert states.wait_action("some-future-state", "return") == "wait"


def test_only_safe_requests_are_retried() -> None:
    assert transport.retry_safe("GET", None)
    assert transport.retry_safe("POST", {"Idempotency-Key": "k"})
    assert not transport.retry_safe("POST", {"Content-Type": "application/json"})
    assert not transport.retry_safe("DELETE", None)
    policy = transport.RetryPolicy(backoff_s=0.5, max_backoff_s=4.0)
    assert policy.delay(1, 7.0) == 7.0  # Retry-After wins
    assert all(0.25 <= policy.delay(1, None) <= 0.5 for _ in range(20))
    assert all(2.0 <= policy.delay(6, None) <= 4.0 for _ in range(20))  # capped
