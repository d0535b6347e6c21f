"""Embedded mode: SQLite (WAL, busy_timeout) from the same migrations, set up with the command line
(`python -m service migrate`, `python -m service create-tenant NAME`), then the whole flow on it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.__main__ import main
from store import keys, repository
from store.database import Database
from tests.service.helpers import GOOD_JSONL, TINY_SPEC, FakeWorker, step_metrics, upload

REPO_ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STARE_DATABASE_URL": database_url, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_line_sets_up_sqlite_and_the_api_runs_on_it(
    make_client: Callable[..., TestClient],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite:///{tmp_path / 'stare.db'}"
    monkeypatch.setenv("STARE_DATABASE_URL", url)
    assert main(["migrate"]) == 0
    created = cli("create-tenant", "acme", database_url=url)  # the real entry point, in its own process
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert keys.looks_like_key(key) and "acme" in created.stderr
    capsys.readouterr()
    assert main(["create-tenant", "acme"]) == 1 and "already exists" in capsys.readouterr().err
    assert main(["create-key", "acme"]) == 0 and keys.looks_like_key(capsys.readouterr().out.strip())

    db = Database(url)
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
    client = make_client(database_url=url, artifact_root=tmp_path / "artifacts")
    headers = {"Authorization": f"Bearer {key}"}
    assert client.get("/v1/me", headers=headers).json()["tenant"]["name"] == "acme"
    assert client.get("/readyz").status_code == 200

    file_id = upload(client, headers, GOOD_JSONL).json()["id"]
    body = {"spec": {**TINY_SPEC, "task": {"params": {}}}, "training_file": file_id}
    job_id = client.post("/v1/jobs", json=body, headers={**headers, "Idempotency-Key": "k1"}).json()["id"]
    assert (
        client.post("/v1/jobs", json=body, headers={**headers, "Idempotency-Key": "k1"}).json()["id"]
        == job_id
    )

    worker = FakeWorker(db, job_id)
    # The API reads while the worker writes (two connections, WAL).
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for step in range(1, 21):
                with db.transaction() as session:
                    assert repository.record_step_metrics(
                        session, job_id, worker.token, step, step_metrics(step, 0.5)
                    )
        except BaseException as err:
            errors.append(err)

    writer = threading.Thread(target=write)
    writer.start()
    while writer.is_alive():
        assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    writer.join()
    assert errors == []
    checkpoint_id = worker.checkpoint(tmp_path / "artifacts", 20)
    worker.finish("succeeded")

    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    assert (
        job["status"] == "succeeded"
        and job["progress"]["step"] == 20
        and job["entropy"]["state"] == "in_band"
    )
    assert len(client.get(f"/v1/jobs/{job_id}/metrics", headers=headers).json()["data"]) == 20
    download = client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download", headers=headers)
    assert download.status_code == 200 and len(download.content) == int(download.headers["Content-Length"])
    stream = client.get(f"/v1/jobs/{job_id}/events?stream=true", headers=headers).text
    assert "event: job.succeeded" in stream and "event: end" in stream
    assert client.get(f"/v1/jobs/{job_id}/report?format=html", headers=headers).status_code == 200
    assert client.delete(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    with db.sessions() as session:  # cascades work on SQLite too (foreign_keys=ON)
        assert session.scalar(sa.text("SELECT count(*) FROM job_metrics")) == 0
    db.dispose()
