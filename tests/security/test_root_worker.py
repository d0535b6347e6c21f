"""Issue 44, R2 and R6: a trainer cannot write host state whatever user the worker runs as.

Before, a root worker's trainer was uid 0 without capabilities: /proc/sys is guarded by the uid, not a
capability, so it opened /proc/sys/kernel/core_pattern for writing (and `|prog` there makes the kernel run
prog as root on the host) and rewrote vm.swappiness; and it shared uid 0's user keyring with the host.
Now a root worker's trainer switches to STARE_TRAINER_UID inside its confinement (setpriv: no groups, no
capabilities, an empty bounding set, no_new_privs) and every trainer runs under a filter that refuses the
keyring calls. A root worker in production becomes STARE_WORKER_USER or refuses to start; the compose
file and the images run every service of ours as `stare`.

This machine runs the tests as root, which is what these need (a test run as another user is skipped as a
missing real component: it cannot start a root worker).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import requires_binary, skip_missing_component
from tests.security.test_seccomp_filter import run_filter
from worker.isolation import DEFAULT_TRAINER_UID, Confinement, keyring_filter
from worker.supervisor import TrainerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
EPERM = 0x00050000 | 1
ALLOW = 0x7FFF0000

PROBE = r"""
import ctypes, json, os, sys
job = sys.argv[1]
seen = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid()}
status = open("/proc/self/status").read()
for field in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs"):
    seen[field] = status.split(field + ":")[1].split()[0]
writable = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/swappiness", "/proc/sys/kernel/hostname",
            "/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled", "/proc/self/../1/oom_score_adj"]
for path in writable:
    try:
        os.close(os.open(path, os.O_WRONLY))
        seen[path] = "opened"
    except OSError as err:
        seen[path] = err.strerror
try:
    open("/etc/shadow").read(1)
    seen["/etc/shadow"] = "read"
except OSError as err:
    seen["/etc/shadow"] = err.strerror
seen["/root"] = sorted(os.listdir("/root"))  # the worker's home: an empty tmpfs, but what is bound back
libc = ctypes.CDLL(None, use_errno=True)
seen["add_key"] = (libc.syscall(248, b"user", b"stare-probe", b"x", 1, -4), ctypes.get_errno())  # @u
seen["keyctl"] = (libc.syscall(250, 0, -4, 0, 0, 0), ctypes.get_errno())
open(os.path.join(job, "written-by-the-trainer"), "w").write("ok")
json.dump(seen, open(os.path.join(job, "seen.json"), "w"))
"""


def _as_root() -> None:
    if os.geteuid() != 0:
        skip_missing_component("a root worker: these tests run as root (this machine does)")


def _confined_probe(tmp_path: Path, run_as: int | None) -> dict[str, Any]:
    folder = tmp_path / "root-worker"
    folder.mkdir(parents=True)
    for parent in (folder, *folder.parents):  # the trainer's uid passes through them (as to a real root)
        if parent == Path("/tmp"):
            break
        parent.chmod(0o755)
    job = folder / "artifacts" / "tenant" / "runs" / "job"
    job.mkdir(parents=True)
    cache = folder / "models"
    confinement = Confinement(artifact_root=folder / "artifacts", job_dir=job, run_as=run_as)
    child = TrainerProcess(
        [sys.executable, "-c", PROBE, str(job)],
        log_path=job / "trainer.log",
        env={"STARE_MODEL_CACHE": str(cache)},
        confinement=confinement,
    )
    assert child.wait(timeout=120) == 0, child.stderr_tail.text()
    assert (job / "written-by-the-trainer").read_text() == "ok"
    return dict(json.loads((job / "seen.json").read_text()))


@requires_binary("bwrap", "setpriv")
def test_r2_a_root_workers_trainer_cannot_open_core_pattern_for_writing(tmp_path: Path) -> None:
    _as_root()
    seen = _confined_probe(tmp_path, DEFAULT_TRAINER_UID)
    assert (seen["uid"], seen["euid"], seen["gid"], seen["groups"]) == (65534, 65534, 65534, [])
    assert seen["pid"] == 1
    assert (
        seen["CapEff"] == seen["CapPrm"] == seen["CapBnd"] == "0000000000000000" and seen["NoNewPrivs"] == "1"
    )
    assert seen["/proc/sys/kernel/core_pattern"] == "Permission denied", seen
    assert seen["/proc/sys/vm/swappiness"] == "Permission denied", seen
    assert seen["/proc/sys/kernel/hostname"] == "Permission denied", seen
    assert seen["/proc/sysrq-trigger"] in ("Permission denied", "No such file or directory"), seen
    assert seen["/sys/kernel/mm/transparent_hugepage/enabled"] in (
        "Read-only file system",
        "Permission denied",
    )
    assert seen["/etc/shadow"] == "Permission denied", seen
    assert set(seen["/root"]) <= {".pyenv", ".cache"}, seen  # the worker's home: only the interpreter, caches


@requires_binary("bwrap", "setpriv")
def test_r6_no_trainer_reaches_a_keyring_root_or_not(tmp_path: Path) -> None:
    _as_root()
    for run_as in (DEFAULT_TRAINER_UID, None):  # switched to its uid; left the worker's (root's) own uid
        seen = _confined_probe(tmp_path / str(run_as), run_as)
        assert seen["add_key"] == [-1, 1] and seen["keyctl"] == [-1, 1], (
            seen
        )  # EPERM, before the kernel looks


def test_the_keyring_filter_refuses_exactly_the_keyring_calls_and_foreign_abis() -> None:
    for machine, arch, calls in (
        ("x86_64", 0xC000003E, (248, 249, 250)),
        ("aarch64", 0xC00000B7, (217, 218, 219)),
    ):
        program = keyring_filter(machine)
        for nr in range(0, 600):
            expected = EPERM if nr in calls else ALLOW
            assert run_filter(program, nr, arch) == expected, (machine, nr)
        assert run_filter(program, 288, 0x40000003) == EPERM  # i386's keyctl through int 0x80
        assert run_filter(program, 1, 0x40000003) == EPERM  # any i386 call
    assert run_filter(keyring_filter("x86_64"), 0x40000000 + 250, 0xC000003E) == EPERM  # x32
    with pytest.raises(ValueError, match="no system-call table"):
        keyring_filter("riscv64")


def test_a_root_worker_confines_its_trainer_as_the_trainer_uid(tmp_path: Path) -> None:
    """worker/launching.py: under root the confinement switches to STARE_TRAINER_UID; never uid 0."""
    from worker.launching import job_confinement
    from worker.settings import WorkerSettings

    settings = WorkerSettings(artifact_root=tmp_path, trainer_uid=4242)
    claim: Any = type("Claim", (), {"resolved_spec": {"task": {}}})()
    confinement = job_confinement(claim, settings, None, tmp_path / "run")  # type: ignore[arg-type]
    assert confinement is not None
    assert confinement.run_as == (4242 if os.geteuid() == 0 else None)
    with pytest.raises(ValueError):
        WorkerSettings(trainer_uid=0)


def _worker(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
    base.update(
        PYTHONPATH=str(REPO_ROOT),
        STARE_DATABASE_URL=f"sqlite:///{tmp_path / 'stare.db'}",
        STARE_BROKER_URL="filesystem://",
        STARE_BROKER_FOLDER=str(tmp_path / "broker"),
        STARE_ARTIFACT_ROOT=str(tmp_path / "artifacts"),
    )
    base.update(env)
    return subprocess.run(
        [sys.executable, "-m", "worker", "run"], env=base, capture_output=True, text=True, timeout=120
    )


def test_a_root_worker_in_production_refuses_to_start_naming_why(tmp_path: Path) -> None:
    _as_root()
    refused = _worker(tmp_path, STARE_ENVIRONMENT="production")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "refusing to start: the worker runs as root in production" in refused.stderr
    assert "STARE_WORKER_USER" in refused.stderr
    for user, why in (
        ("no-such-user-here", "is no user of this host"),
        ("root", "names root"),
        ("0", "names root"),
    ):
        refused = _worker(tmp_path, STARE_ENVIRONMENT="production", STARE_WORKER_USER=user)
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr[-2000:]


def test_a_root_worker_given_a_user_drops_to_it_before_anything_else() -> None:
    _as_root()
    script = (
        "import os, logging\n"
        "from worker.__main__ import drop_root\n"
        "from worker.settings import WorkerSettings\n"
        "settings = WorkerSettings(environment='development', worker_user='nobody', database_url='sqlite://')\n"
        "print(drop_root(settings), os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refusal, uid, euid, gid, *groups = done.stdout.replace("[", "").replace("]", "").replace(",", "").split()
    assert (refusal, uid, euid) == ("None", "65534", "65534")
    assert gid != "0" and "0" not in groups


def test_every_service_of_the_compose_file_runs_as_a_user_that_is_not_root() -> None:
    """Ours run as `stare` (the images end on USER stare); the third-party images used run as their own
    users (postgres and redis drop to them in their entrypoints, prometheus is `nobody`, grafana 472); the
    one exception, NVIDIA's dcgm-exporter (the gpu profile), needs root and SYS_ADMIN to read the GPUs'
    profiling counters, and is marked as such. No service is privileged or runs as user root."""
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    drops_itself = {"postgres:", "redis:", "prom/prometheus:", "grafana/grafana-oss:"}
    for name, service in compose["services"].items():
        assert not service.get("privileged"), name
        assert str(service.get("user", "")).split(":")[0] not in ("root", "0"), name
        if service.get("build"):
            assert service.get("user") == "stare", name
        elif name == "dcgm-exporter":
            assert service.get("profiles") == ["gpu"] and service.get("cap_add") == ["SYS_ADMIN"], name
        else:
            assert any(service["image"].startswith(prefix) for prefix in drops_itself), (
                name,
                service["image"],
            )
    for dockerfile in (REPO_ROOT / "deploy" / "docker").glob("Dockerfile.*"):
        lines = [line.split() for line in dockerfile.read_text().splitlines() if line.startswith("USER ")]
        assert lines and lines[-1][1] == "stare", dockerfile.name
