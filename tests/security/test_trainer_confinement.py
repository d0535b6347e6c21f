"""The supervisor's confinement of the trainer child (worker/isolation.py) in the real bubblewrap: the exit
codes that map to job states come back unchanged, the cooperative SIGTERM reaches the trainer and its own
processes, a SIGKILL ends every process of the job whatever they did to their parent-death signal or
session, and the child sees only its own run folder. A worker without bwrap refuses to run jobs unless the
operator turned the confinement off."""

from __future__ import annotations

import glob
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import requires_binary
from worker.isolation import Confinement, confined_command
from worker.supervisor import TrainerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]


def _confinement(tmp_path: Path) -> Confinement:
    job = tmp_path / "artifacts" / "tenant-a" / "runs" / "job-1"
    job.mkdir(parents=True)
    other = tmp_path / "artifacts" / "tenant-b" / "runs" / "job-2"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("theirs")
    return Confinement(artifact_root=tmp_path / "artifacts", job_dir=job)


def _start(tmp_path: Path, confinement: Confinement, script: str) -> TrainerProcess:
    return TrainerProcess(
        [sys.executable, "-c", script], log_path=confinement.job_dir / "trainer.log", confinement=confinement
    )


@requires_binary("bwrap")
@pytest.mark.parametrize("code", [0, 1, 2, 3, 69, 74, 75, 76])
def test_the_trainers_exit_code_comes_back_unchanged(tmp_path: Path, code: int) -> None:
    child = _start(tmp_path, _confinement(tmp_path), f"raise SystemExit({code})")
    assert child.wait(timeout=60) == code, child.stderr_tail.text()


_STOPPABLE = """import os, signal, sys, time
job = sys.argv[1]
rank = os.fork()  # one of its own processes (a torchrun rank): the stop reaches it too
def stopped(signum, frame):
    with open(os.path.join(job, f"stopped-{os.getpid()}"), "w") as f:
        f.write(str(signum))
    if rank:  # the trainer waits for its rank, as torchrun does: pid 1's exit would kill it mid-write
        os.waitpid(rank, 0)
    os._exit(75)
signal.signal(signal.SIGTERM, stopped)
open(os.path.join(job, f"ready-{os.getpid()}"), "w").close()
time.sleep(60)
"""


def _wait_files(folder: Path, pattern: str, count: int, timeout: float = 30.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while len(found := sorted(folder.glob(pattern))) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@requires_binary("bwrap")
def test_a_cooperative_stop_reaches_the_trainer_and_its_processes(tmp_path: Path) -> None:
    confinement = _confinement(tmp_path)
    child = TrainerProcess(
        [sys.executable, "-c", _STOPPABLE, str(confinement.job_dir)],
        log_path=confinement.job_dir / "trainer.log",
        confinement=confinement,
    )
    assert len(_wait_files(confinement.job_dir, "ready-*", 2)) == 2, child.stderr_tail.text()
    child.request_stop()
    assert child.wait(timeout=30) == 75, child.stderr_tail.text()
    stopped = _wait_files(confinement.job_dir, "stopped-*", 2)
    assert [path.read_text() for path in stopped] == [str(int(signal.SIGTERM))] * 2


_SLOW_START = """import os, signal, sys, time
job = sys.argv[1]
open(os.path.join(job, "started"), "w").close()
time.sleep(1.5)  # a trainer still importing torch: no SIGTERM handler yet (pid 1 drops the signal)
signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(75))
open(os.path.join(job, "handler"), "w").close()
time.sleep(60)
os._exit(0)
"""


@requires_binary("bwrap")
def test_a_stop_requested_while_the_trainer_starts_is_not_lost(tmp_path: Path) -> None:
    """Pid 1 of a PID namespace ignores a signal it has no handler for: the supervisor holds the SIGTERM
    back until the trainer catches it (the worker calls request_stop until the child exits)."""
    confinement = _confinement(tmp_path)
    child = TrainerProcess(
        [sys.executable, "-c", _SLOW_START, str(confinement.job_dir)],
        log_path=confinement.job_dir / "trainer.log",
        confinement=confinement,
    )
    assert _wait_files(confinement.job_dir, "started", 1), child.stderr_tail.text()
    child.request_stop()
    assert not (confinement.job_dir / "handler").exists()  # asked before the handler was there
    deadline = time.monotonic() + 30
    while child.poll() is None and time.monotonic() < deadline:
        child.request_stop()  # what the worker's loop does
        time.sleep(0.1)
    assert child.wait(timeout=5) == 75, child.stderr_tail.text()
    assert (confinement.job_dir / "handler").exists()


_ESCAPES = """import ctypes, os, sys, time
libc = ctypes.CDLL(None)
libc.prctl(15, sys.argv[1].encode(), 0, 0, 0)  # PR_SET_NAME: found by the test on the host
for _ in range(2):
    if os.fork() == 0:
        libc.prctl(1, 0, 0, 0, 0)  # no parent-death signal
        os.setsid()  # nor the trainer's process group
        break
open(os.path.join(sys.argv[2], f"ready-{os.getpid()}"), "w").close()
time.sleep(600)
"""


def _named(marker: str) -> list[str]:
    found = []
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            if Path(comm).read_text().strip() == marker:
                found.append(comm)
        except OSError:
            continue
    return found


@requires_binary("bwrap")
def test_a_kill_ends_every_process_of_the_job(tmp_path: Path) -> None:
    confinement = _confinement(tmp_path)
    marker = f"stare{uuid.uuid4().hex[:10]}"
    child = TrainerProcess(
        [sys.executable, "-c", _ESCAPES, marker, str(confinement.job_dir)],
        log_path=confinement.job_dir / "trainer.log",
        confinement=confinement,
    )
    assert len(_wait_files(confinement.job_dir, "ready-*", 3)) == 3, child.stderr_tail.text()
    assert len(_named(marker)) == 3
    child.kill()
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert _named(marker) == []


_LOOKS_AROUND = """import json, os, sys
job = sys.argv[1]
root = os.path.dirname(os.path.dirname(os.path.dirname(job)))
seen = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "root": sorted(os.listdir(root))}
seen["tenant"] = sorted(os.listdir(os.path.dirname(os.path.dirname(job))))
for path in ("/proc/1/environ", f"/proc/{os.getppid()}/environ"):
    try:
        seen[path] = open(path, "rb").read().decode()
    except OSError as err:
        seen[path] = err.strerror
open(os.path.join(job, "seen.json"), "w").write(json.dumps(seen))
"""


@requires_binary("bwrap")
def test_the_child_sees_only_its_own_run_folder_and_no_other_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = f"CANARY{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("STARE_DATABASE_URL", f"postgresql://stare:{canary}@db/stare")
    confinement = _confinement(tmp_path)
    child = _start(
        tmp_path, confinement, _LOOKS_AROUND.replace("sys.argv[1]", repr(str(confinement.job_dir)))
    )
    assert child.wait(timeout=60) == 0, child.stderr_tail.text()
    seen = json.loads((confinement.job_dir / "seen.json").read_text())
    assert seen["pids"] == [1]  # its own PID namespace: the worker and the API are not there
    assert seen["root"] == ["tenant-a"] and seen["tenant"] == ["runs"]
    assert canary not in json.dumps(seen)
    assert seen[f"/proc/{0}/environ"] == "No such file or directory"


def test_the_network_and_pids_are_the_jobs_own_but_for_a_ray_driver(tmp_path: Path) -> None:
    """A one-node job: loopback only, its own PID namespace. A Ray driver: the host's network (the
    cluster) and PID namespace (Ray tells a node's drivers apart by pid); the file system confined alike."""
    one_node = confined_command(["python"], _confinement(tmp_path), {}, 3)
    ray = confined_command(["python"], Confinement(tmp_path, tmp_path, network=True, own_pids=False), {}, 3)
    assert "--unshare-net" in one_node and "--unshare-net" not in ray
    assert one_node[one_node.index("GLOO_SOCKET_IFNAME") + 1] == "lo"
    assert "--unshare-pid" in one_node and "--unshare-pid" not in ray
    for cmd, root in ((one_node, tmp_path / "artifacts"), (ray, tmp_path)):
        assert "--cap-drop" in cmd and "--new-session" in cmd and "--die-with-parent" in cmd
        pairs = list(itertools.pairwise(cmd))
        assert ("--tmpfs", str(root.resolve())) in pairs and ("--proc", "/proc") in pairs


def test_a_worker_without_bwrap_refuses_to_run_jobs_unless_told(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STARE_")},
        "PYTHONPATH": str(REPO_ROOT),
        "STARE_ENVIRONMENT": "development",
        "STARE_DATABASE_URL": f"sqlite:///{tmp_path / 'stare.db'}",
        "STARE_BROKER_URL": "filesystem://",
        "STARE_BROKER_FOLDER": str(tmp_path / "broker"),
        "STARE_ARTIFACT_ROOT": str(tmp_path / "artifacts"),
        "STARE_BWRAP": str(tmp_path / "no-such-bwrap"),
    }
    refused = subprocess.run(
        [sys.executable, "-m", "worker", "run"], env=env, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "refusing to run jobs" in refused.stderr and "STARE_TRAINER_ISOLATION=false" in refused.stderr
    # Turned off by the operator: the same worker starts (and is stopped here once ready).
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker", "run"],
            env={**env, "STARE_TRAINER_ISOLATION": "false"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while " ready." not in log.read_text(errors="replace") and time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        assert " ready." in log.read_text(errors="replace"), log.read_text(errors="replace")[-2000:]
    finally:
        worker.kill()
        worker.wait(timeout=30)


@requires_binary("bwrap", "prlimit")
def test_the_python_tools_sandbox_nests_in_the_trainer_of_a_worker_that_is_not_root() -> None:
    """The tool's own bwrap (user, PID and mount namespaces, a fresh /proc, the seccomp filter) starts
    inside a confined trainer when the worker is not root (as the images run it): run here as 65534 when
    the test runs as root."""
    from contract.spec import ToolLimitsSpec
    from trainer.envs import sandbox
    from trainer.envs.seccomp import filter_program

    uid = 65534 if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="stare-nested-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        job = folder / "artifacts" / "t" / "job"
        job.mkdir(parents=True)
        cache = folder / "cache"
        cache.mkdir()
        if uid is not None:
            for path in (job, cache):
                os.chown(path, uid, uid)
        limits = ToolLimitsSpec(cpu_seconds=2, wall_seconds=10, memory_mb=64, processes=4, output_bytes=4096)
        runtime = sandbox.python_runtime("/usr/bin/python3")
        seccomp_read, seccomp_write = os.pipe()
        os.write(seccomp_write, filter_program())
        os.close(seccomp_write)
        info_read, info_write = os.pipe()
        inner = sandbox.bwrap_command(runtime, limits, seccomp_read)
        confinement = Confinement(artifact_root=folder / "artifacts", job_dir=job)
        outer = confined_command(inner, confinement, {"STARE_MODEL_CACHE": str(cache)}, info_write)
        done = subprocess.run(
            outer,
            input="import os\nprint(6 * 7, os.getpid(), sorted(os.listdir('/proc'))[:1])",
            capture_output=True,
            text=True,
            timeout=60,
            pass_fds=(seccomp_read, info_write),
            user=uid,
            group=uid,
            extra_groups=[] if uid is not None else None,
            env={"PATH": "/usr/bin:/bin"},
        )
        for fd in (seccomp_read, info_read, info_write):
            os.close(fd)
        assert done.returncode == 0 and done.stdout.startswith("42 1 "), done.stderr[-2000:]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
