"""Storage faults and crash messages, without servers or workers (issue 12): the errno → code mapping, a
checkpoint write (trainer.distributed.save_sharded, as the trainer writes them) that fails (the temp folder goes, the checkpoints before stay), the supervisor's
in-memory stderr tail and its best-effort log copy, and the messages the worker builds from them."""

from __future__ import annotations

import errno
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from contract.distributed import DistributedSpec
from contract.storage import (
    STORAGE_FULL,
    STORAGE_IO_ERROR,
    STORAGE_READ_ONLY,
    StorageError,
    from_exception,
    storage_code,
    storage_writes,
)
from trainer import checkpoints
from trainer.distributed import Runtime, save_sharded
from worker import supervisor
from worker.supervisor import TAIL_BYTES, TAIL_LINES, OutputTail, TrainerProcess
from worker.training import _crash_message, _error_lines, _storage_error

MIB = 1024 * 1024


# ------------------------------------------------------------------------------------------ errno → code


@pytest.mark.parametrize(
    ("err_no", "code"),
    [
        (errno.ENOSPC, STORAGE_FULL),
        (errno.EDQUOT, STORAGE_FULL),
        (errno.EROFS, STORAGE_READ_ONLY),
        (errno.EIO, STORAGE_IO_ERROR),
        (errno.EACCES, STORAGE_IO_ERROR),
        (None, STORAGE_IO_ERROR),
    ],
)
def test_errno_maps_to_a_storage_code(err_no: int | None, code: str) -> None:
    assert storage_code(err_no) == code


def test_an_oserror_keeps_its_errno_name_and_path_in_the_message() -> None:
    err = from_exception(OSError(errno.ENOSPC, "No space left on device", "/data/run/events.jsonl"), "/data")
    assert err is not None
    assert (err.code, err.errno, err.errno_name, err.path) == (
        STORAGE_FULL,
        errno.ENOSPC,
        "ENOSPC",
        "/data/run/events.jsonl",
    )
    assert str(err) == "cannot write /data/run/events.jsonl: ENOSPC (No space left on device)"
    event = err.event(step=7)
    assert event == {
        "type": "error",
        "step": 7,
        "code": STORAGE_FULL,
        "errno": "ENOSPC",
        "path": "/data/run/events.jsonl",
        "message": str(err),
    }


def test_an_oserror_without_a_file_name_names_the_path_written() -> None:
    err = from_exception(OSError(errno.EIO, "Input/output error"), "/data/run/checkpoints/.tmp-step-000004-1")
    assert err is not None and err.code == STORAGE_IO_ERROR and err.errno_name == "EIO"
    assert "/data/run/checkpoints/.tmp-step-000004-1" in str(err)


def test_a_rust_io_error_is_read_by_its_os_error_number(tmp_path: Path) -> None:
    # safetensors raises SafetensorError("... (os error 28)"), not an OSError
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    err = from_exception(rust, tmp_path / "model")
    assert err is not None and err.code == STORAGE_FULL and err.errno_name == "ENOSPC"
    assert str(tmp_path / "model") in str(err)


def test_a_plain_bug_on_a_healthy_disk_is_not_a_storage_fault(tmp_path: Path) -> None:
    assert from_exception(RuntimeError("shape mismatch"), tmp_path) is None
    with pytest.raises(RuntimeError, match="shape mismatch"), storage_writes(tmp_path):
        raise RuntimeError("shape mismatch")
    with pytest.raises(StorageError) as caught, storage_writes(tmp_path / "x"):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "x"))
    assert caught.value.code == STORAGE_READ_ONLY


# --------------------------------------------------------------------------------------------- checkpoints


def _llama(vocab: int) -> torch.nn.Module:
    """A one-layer transformers Llama whose size the vocabulary sets (about 128 × vocab + 41k floats)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    return LlamaForCausalLM(config)


def _export(size: int = 1000, fail: BaseException | None = None) -> Callable[[Path], None]:
    """A checkpoint's before_commit: writes model/ (`size` bytes), or raises `fail` halfway (what
    safetensors or a full disk would do)."""

    def export(tmp: Path) -> None:
        folder = tmp / "model"
        folder.mkdir(parents=True, exist_ok=True)
        if fail is not None:
            (folder / "partial.bin").write_bytes(b"\1" * 100)
            raise fail
        (folder / "model.safetensors").write_bytes(b"\0" * size)

    return export


def _save(root: Path, step: int, export: Callable[[Path], None] | None = None, vocab: int = 256) -> Path:
    """The run's checkpoint writer (trainer.distributed.save_sharded, one process) after one AdamW step."""
    model = _llama(vocab)
    optimizer = torch.optim.AdamW(model.parameters())
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    optimizer.step()  # AdamW's moments: 2 × the parameters' floats in the shards
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return save_sharded(
        checkpoints.checkpoint_dir(root, step),
        model,
        optimizer,
        {"cursor": step, "step": step},
        scheduler=scheduler,
        runtime=Runtime(DistributedSpec(), torch.device("cpu")),
        before_commit=export or _export(),
    )


def _assert_only(root: Path, steps: list[int]) -> None:
    import torch.distributed.checkpoint as dcp

    assert [s for s, _ in checkpoints.list_checkpoints(root)] == steps
    assert sorted(p.name for p in root.iterdir()) == [f"step-{s:06d}" for s in steps], "no temp folder left"
    for step in steps:
        folder = checkpoints.checkpoint_dir(root, step)
        assert json.loads((folder / "state.json").read_text())["step"] == step
        saved = dcp.FileSystemReader(folder / "sharded").read_metadata().state_dict_metadata
        assert any(key.startswith("optimizer.state.") for key in saved), sorted(saved)[:5]


@pytest.mark.parametrize(
    ("fail", "code"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), STORAGE_FULL),
        (
            Exception("Error while serializing: I/O error: Read-only file system (os error 30)"),
            STORAGE_READ_ONLY,
        ),
        (OSError(errno.EIO, "Input/output error"), STORAGE_IO_ERROR),
    ],
)
def test_a_failed_checkpoint_write_removes_its_temp_and_keeps_the_last_good_one(
    tmp_path: Path, fail: BaseException, code: str
) -> None:
    root = tmp_path / "checkpoints"
    _save(root, 2)
    with pytest.raises(StorageError) as caught:
        _save(root, 4, _export(fail=fail))
    assert caught.value.code == code
    assert ".tmp-step-000004" in str(caught.value)  # the path written, in the message
    _assert_only(root, [2])


def test_a_bug_while_checkpointing_is_no_storage_fault_but_still_leaves_no_temp(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save(root, 2)
    with pytest.raises(RuntimeError, match="not serialisable"):
        _save(root, 4, _export(fail=RuntimeError("not serialisable")))
    _assert_only(root, [2])


def test_a_step_saved_again_replaces_its_folder(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save(root, 2, _export(size=10))
    _save(root, 2, _export(size=20))
    _assert_only(root, [2])
    assert (root / "step-000002" / "model" / "model.safetensors").stat().st_size == 20


def test_a_full_tmpfs_fails_the_shard_write_with_enospc(tmp_path: Path) -> None:
    """The real thing: DCP's write of the shards meets ENOSPC. DCP reports it as a CheckpointException (a
    BaseException); the writer raises the write's own OSError with its errno in its place."""
    from tests.worker.mounts import Tmpfs

    mount = Tmpfs(tmp_path / "disk", size_mib=2)
    try:
        root = mount.path / "checkpoints"
        _save(root, 2)  # ~74k parameters: under 1 MiB with AdamW's moments
        free = mount.free_bytes()
        with pytest.raises(StorageError) as caught:
            _save(root, 4, vocab=8192)  # ~1.1M parameters: ~13 MiB with the moments, on a 2 MiB disk
        assert caught.value.code == STORAGE_FULL and caught.value.errno_name == "ENOSPC"
        assert ".tmp-step-000004" in str(caught.value)
        cause = caught.value.__cause__  # the write's own OSError, not a guess from the disk's state
        assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC, repr(cause)
        _assert_only(root, [2])
        assert mount.free_bytes() == free, "the temp folder's space came back, all of it"
    finally:
        mount.unmount()


# ------------------------------------------------------------------------------------------ stderr tail


def test_the_tail_keeps_the_last_lines_within_its_limits() -> None:
    tail = OutputTail()
    for i in range(100):
        tail.add(f"line {i}\n")
    lines = tail.text().splitlines()
    assert lines == [f"line {i}" for i in range(100 - TAIL_LINES, 100)]

    tail = OutputTail(lines=1000, size=TAIL_BYTES)
    for i in range(1000):
        tail.add(f"{i:04d} " + "x" * 95)  # 100 bytes + newline
    text = tail.text()
    assert len(text.encode()) <= TAIL_BYTES
    assert text.endswith("0999 " + "x" * 95) and "0900 " not in text

    huge = OutputTail()
    huge.add("a" * 10_000 + "THE END")
    assert huge.text().endswith("THE END") and len(huge.text()) <= TAIL_BYTES


class BrokenLog:
    """A log file on a disk that fills after the first line."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, data: bytes) -> int:
        if self.lines:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.lines.append(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_stderr_is_teed_to_the_log_and_kept_when_the_log_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = (
        "import sys\n"
        "sys.stderr.write('first line\\n'); sys.stderr.flush()\n"
        "for i in range(30): sys.stderr.write(f'warning {i}\\n')\n"
        "sys.stderr.write('Traceback (most recent call last):\\nRuntimeError: boom at step 3\\n')\n"
        'print(\'@@event \' + \'{"type": "step", "step": 1}\')\n'
        "sys.exit(1)\n"
    )
    broken = BrokenLog()  # the log file's disk fills after the first line
    monkeypatch.setattr(supervisor, "open", lambda *_, **__: broken, raising=False)
    child = TrainerProcess([sys.executable, "-c", script], log_path=tmp_path / "trainer.log")
    code = child.wait(timeout=30)
    assert code == 1
    assert broken.lines == [b"first line\n"]
    assert isinstance(child.log_error, OSError) and child.log_error.errno == errno.ENOSPC
    lines = child.stderr_tail.text().splitlines()
    assert lines[-2:] == ["Traceback (most recent call last):", "RuntimeError: boom at step 3"]
    assert len(lines) == TAIL_LINES
    assert child.events.get(timeout=5) == {"type": "step", "step": 1}


def test_stderr_reaches_the_log_file(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    child = TrainerProcess(
        [sys.executable, "-c", "import sys; sys.stderr.write('oops\\n'); sys.exit(4)"], log_path=log
    )
    assert child.wait(timeout=30) == 4
    assert log.read_text() == "oops\n" and child.stderr_tail.text() == "oops"


def test_a_log_that_cannot_be_opened_is_a_storage_error_and_starts_nothing(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("a file where the run folder should be")
    with pytest.raises(StorageError) as caught:
        TrainerProcess([sys.executable, "-c", "raise SystemExit(0)"], log_path=tmp_path / "run" / "t.log")
    assert caught.value.code == STORAGE_IO_ERROR and str(tmp_path / "run") in str(caught.value)


# ------------------------------------------------------------------------------------------- messages


def test_a_crash_message_quotes_the_last_error_lines_and_is_never_empty_after_the_colon() -> None:
    tail = "warning: x\n\nTraceback (most recent call last):\n  File 'e.py'\nRuntimeError: boom at step 3\n"
    assert _crash_message("exited with code 1", tail) == (
        "trainer exited with code 1: Traceback (most recent call last):\n  File 'e.py'\nRuntimeError: boom at step 3"
    )
    assert _crash_message("exited with code 1", "") == "trainer exited with code 1 and printed no error"
    assert _crash_message("exited with code 1", " \n\n ") == "trainer exited with code 1 and printed no error"
    assert len(_error_lines("x" * 5000)) == 800


def test_the_storage_error_comes_from_the_trainers_event_else_from_its_stderr() -> None:
    event = StorageError(errno.EROFS, "/d/run/checkpoints/.tmp-step-000004-9").event(step=4)
    error = _storage_error(json.loads(json.dumps(event)), "")
    assert (error.code, error.category) == (STORAGE_READ_ONLY, "system")
    assert (
        error.message == "cannot write /d/run/checkpoints/.tmp-step-000004-9: EROFS (Read-only file system)"
    )
    lost = _storage_error(None, "error: cannot write /d/run/events.jsonl: ENOSPC (No space left on device)\n")
    assert (lost.code, lost.message) == (
        STORAGE_FULL,
        "error: cannot write /d/run/events.jsonl: ENOSPC (No space left on device)",
    )
    assert _storage_error({"type": "error", "code": "bogus"}, "").message  # never empty
    assert _storage_error({"type": "error", "code": "bogus"}, "").code == STORAGE_IO_ERROR


def test_the_tenant_sees_paths_relative_to_its_folder_and_keys_for_the_rest(tmp_path: Path) -> None:
    from store.artifacts import LocalArtifactStorage, StorageKeyError

    storage = LocalArtifactStorage(tmp_path / "artifacts")
    root = storage.root
    run = storage.local_path("ten_a/job_b/run")
    assert run == root / "ten_a/job_b/run" and storage.key_of(run / "checkpoints/step-000002") == (
        "ten_a/job_b/run/checkpoints/step-000002"
    )
    message = f"cannot write {run}/checkpoints/.tmp-step-000004-7: ENOSPC; see {root}/ten_a and {root}/.x"
    assert storage.shown_to_tenant(message, "ten_a") == (
        "cannot write job_b/run/checkpoints/.tmp-step-000004-7: ENOSPC; see . and .x"
    )
    assert storage.shown_to_tenant(f"no space under {root}", "ten_a") == "no space under the artifact root"
    other = f"{root}/ten_ab/job_c and {root}/ten_a, {root}2"  # another tenant's folder, another root
    assert storage.shown_to_tenant(other, "ten_a") == f"ten_ab/job_c and ., {root}2"
    with pytest.raises(StorageKeyError):
        storage.key_of(tmp_path / "elsewhere")
    with pytest.raises(StorageKeyError):
        storage.local_path("../escape")
