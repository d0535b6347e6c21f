"""A real worker's trainer sees only its own job (worker/isolation.py, docs/SECURITY.md).

The trainer child of a real worker runs a probe at its interpreter's start (tests/worker/confinement_probe:
a sitecustomize put on the worker's PYTHONPATH, so the worker, the supervisor and the engine are unchanged):
it reads its parent's and pid 1's environment and every /proc/<pid>/environ, and lists each folder from / to
its run folder. It must see neither the worker's environment (its database URL, a planted secret) nor any
process outside its own job, nor another tenant's folder in the artifact root; and the job still trains to
the end.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from tests.worker.harness import REPO_ROOT, Harness, tiny_spec

pytestmark = pytest.mark.slow  # real servers, a worker and a trainer

PROBE = REPO_ROOT / "tests" / "worker" / "confinement_probe"
CANARY = f"CANARY{uuid.uuid4().hex[:12]}"


def test_the_trainer_of_a_real_job_sees_no_worker_and_no_other_tenant(harness: Harness) -> None:
    h = harness
    root = h.infra.artifact_root
    other = root / f"other-tenant-{uuid.uuid4().hex[:8]}" / "runs" / "their-job"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text(CANARY)
    h.start_worker(
        env={
            "PYTHONPATH": os.pathsep.join([str(PROBE), str(REPO_ROOT)]),
            "AWS_SECRET_ACCESS_KEY": CANARY,
            "OMP_NUM_THREADS": "1",
        }
    )
    job_id = h.post_job(tiny_spec(4, 2))
    h.wait_status(job_id, "succeeded", timeout=180)
    context = h.diagnostics(job_id)
    run_dir = h.run_dir(job_id).resolve()
    found = json.loads((run_dir / "confinement-probe.json").read_text())
    seen = json.dumps(found)

    # Nothing of the worker's environment: not its secret, not its database or broker URL.
    database_url = h.worker_env()["STARE_DATABASE_URL"]
    for secret in (CANARY, database_url, h.infra.broker_url, "STARE_DATABASE_URL", "STARE_ARTIFACT_ROOT"):
        assert secret not in seen, (secret, context)
    # Its own PID namespace: it is pid 1 there, with no parent, and no worker process to read.
    assert (found["pid"], found["ppid"]) == (1, 0), found
    assert found["ppid_environ"].startswith("error"), found["ppid_environ"]
    assert list(found["environs"]) == ["1"], list(found["environs"])  # the only process there
    # The artifact root holds only the path to its own run folder: no other tenant, no other job.
    listings = found["listings"]
    resolved_root = root.resolve()
    for folder, entries in listings.items():
        path = Path(folder)
        if (path == resolved_root or resolved_root in path.parents) and path != run_dir:
            below = run_dir.relative_to(path).parts[0]
            assert entries == [below], (folder, entries)
    assert listings[str(resolved_root)] != sorted(os.listdir(resolved_root))  # the host's root has more
    assert other.parent.parent.name not in seen
