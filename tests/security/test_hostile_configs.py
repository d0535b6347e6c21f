"""Issue 44, R1: no tenant-chosen path, URL or file name reaches reasoning-gym, through any route.

A planted file outside the package holds a token; every config field of every reasoning-gym task is set to
its path (absolute and through `..`), a URL, huge numbers and a code string, and sent through the verifier
dry run, the estimate, a job and an upload. Every answer is a 4xx naming the field within the budget, no
answer holds the token, no process opens the planted file (an inotify watch), and no code runs (the marker
file the code string would create never exists). Before the fix, `spell_backward.data_file` read any file
(its score an oracle of the file's bytes), and errors named what the file system said.

The task-check children themselves are confined (service/offload_confine.py): a child sees no host file, no
/proc, no network, no keyring, whatever reaches it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service import offload_confine
from tests.conftest import requires_binary
from tests.security.file_watch import FileWatch
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC, upload
from trainer.tasks import rg_config, rg_safety

BUDGET_S = 10.0  # the service's task_check_seconds (the session client's default)


@pytest.fixture
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, Path]]:
    """(a file outside the package, the token it holds, where the code string would write)."""
    folder = tmp_path_factory.mktemp("planted")
    token = "TOKEN" + secrets.token_hex(16)
    secret = folder / "secret.txt"
    secret.write_text(f"{token}\n" * 50)
    secret.chmod(0o600)
    yield secret, token, folder / "ran"


def hostile_values(secret: Path, marker: Path) -> list[Any]:
    return [
        str(secret),
        "../" * 12 + str(secret).lstrip("/"),
        f"file://{secret}",
        "http://127.0.0.1:9/words.txt",
        10**30,
        -1e300,
        f"__import__('pathlib').Path({str(marker)!r}).touch()",
    ]


def _fields(task: str) -> list[str]:
    return sorted(rg_config.field_kinds(task)) + ["data_file"] * (task == "chain_sum")  # an unknown one too


def _meta(task: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"task": task, "config": config, "seed": 0, "size": 1, "index": 0}


def _timed(send: Any) -> Any:
    start = time.monotonic()
    response = send()
    assert time.monotonic() - start < BUDGET_S, "an answer took longer than the task-check budget"
    return response


def _assert_refused(response: Any, param: str, token: str) -> None:
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["param"] == param, response.text
    assert token not in response.text


def _through_the_api(
    client: TestClient, tenant: TenantKey, task: str, field: str, value: Any, token: str
) -> None:
    config = {field: value}
    unsafe = task in rg_safety.REFUSED_SCORERS  # the dry run refuses the task before its config
    test = {
        "verifier": {"name": "exact"},
        "completion": "x",
        "example": {"answer": "x", "meta": {"reasoning_gym": _meta(task, config)}},
    }
    response = _timed(lambda: client.post("/v1/verifiers/test", json=test, headers=tenant.headers))
    where = "example.meta.reasoning_gym"
    _assert_refused(response, f"{where}.task" if unsafe else f"{where}.config.{field}", token)
    spec = {**TINY_SPEC, "task": {"source": "reasoning_gym", "name": task, "params": config}}
    for route in ("/v1/jobs/estimate", "/v1/jobs"):
        response = _timed(lambda route=route: client.post(route, json={"spec": spec}, headers=tenant.headers))
        _assert_refused(response, f"spec.task.params.{field}", token)


def _upload(
    client: TestClient, tenant: TenantKey, task: str, field: str, values: list[Any], token: str
) -> None:
    lines = [
        {"prompt": "p", "answer": "a", "meta": {"reasoning_gym": _meta(task, {field: v})}} for v in values
    ]
    content = "\n".join(json.dumps(line) for line in lines).encode()
    response = _timed(lambda: upload(client, tenant.headers, content))
    assert response.status_code == 422 and token not in response.text, response.text
    unsafe = task in rg_safety.REFUSED_SCORERS
    param = "meta.reasoning_gym.task" if unsafe else f"meta.reasoning_gym.config.{field}"
    details = response.json()["error"]["details"]
    assert [(d["line"], d["param"]) for d in details] == [(n, param) for n in range(1, len(values) + 1)]


@pytest.mark.parametrize("task", sorted(rg_config.task_names()))
def test_hostile_config_values_reach_no_generator_through_any_route(
    client: TestClient, tenant: TenantKey, planted: tuple[Path, str, Path], task: str
) -> None:
    secret, token, marker = planted
    values = hostile_values(secret, marker)
    with FileWatch(secret) as watch:
        for field in _fields(task):
            for value in values:
                _through_the_api(client, tenant, task, field, value, token)
            _upload(client, tenant, task, field, values, token)
        assert watch.events() == [], "a process opened the planted file"
    assert not marker.exists()


def test_r1_the_probe_of_the_finding_is_refused_naming_data_file(
    client: TestClient, tenant: TenantKey, planted: tuple[Path, str, Path]
) -> None:
    """The finding's own requests: spell_backward with data_file through the dry run (its score was an
    oracle of the file's bytes), the estimate (its error told whether the path existed) and an upload."""
    secret, token, _ = planted
    with FileWatch(secret) as watch:
        for path in (str(secret), str(secret) + ".missing", "/etc/machine-id"):
            config = {"data_file": path, "min_word_len": 1, "max_word_len": 100}
            test = {
                "verifier": {"name": "reasoning_gym"},
                "completion": token[::-1],
                "example": {"answer": "x", "meta": {"reasoning_gym": _meta("spell_backward", config)}},
            }
            response = client.post("/v1/verifiers/test", json=test, headers=tenant.headers)
            _assert_refused(response, "example.meta.reasoning_gym.config.data_file", token)
            assert response.json()["error"]["code"] == "forbidden_field"
            spec = {
                **TINY_SPEC,
                "task": {"source": "reasoning_gym", "name": "spell_backward", "params": config},
            }
            response = client.post("/v1/jobs/estimate", json={"spec": spec}, headers=tenant.headers)
            _assert_refused(response, "spec.task.params.data_file", token)
            assert "No such file" not in response.text and "Permission" not in response.text
        _upload(client, tenant, "spell_backward", "data_file", [str(secret)], token)
        assert watch.events() == []


# --- the children's confinement ------------------------------------------------------------------------

PROBE = r"""
import ctypes, json, os, socket, sys
out = {}
for path in sys.argv[1:]:
    try:
        open(path).read(1)
        out[path] = "read"
    except OSError as err:
        out[path] = err.errno
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    out["socket"] = "made"
except OSError as err:
    out["socket"] = err.errno
libc = ctypes.CDLL(None, use_errno=True)
out["keyctl"] = (libc.syscall(250, 0, -4, 0, 0, 0), ctypes.get_errno())  # KEYCTL_GET_KEYRING_ID of @u
out["root"] = sorted(os.listdir("/"))
print(json.dumps(out))
"""


@requires_binary("bwrap")
def test_a_task_check_child_sees_no_host_file_no_proc_no_network_and_no_keyring(
    planted: tuple[Path, str, Path], artifact_root: Path
) -> None:
    secret, token, _ = planted
    (artifact_root / "tenant-file").write_text(token)
    paths = [
        str(secret),
        str(artifact_root / "tenant-file"),
        "/etc/passwd",
        "/proc/sys/kernel/core_pattern",
        "/proc/self/environ",
    ]
    read_fd, write_fd = os.pipe()
    os.write(write_fd, offload_confine.seccomp_program())
    os.close(write_fd)
    argv = offload_confine.confined_argv([sys.executable, "-c", PROBE, *paths], read_fd)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, pass_fds=(read_fd,), check=False)
    os.close(read_fd)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert all(seen[path] == 2 for path in paths), seen  # ENOENT: none of them exists in there
    assert seen["socket"] == 1 and seen["keyctl"] == [-1, 1], seen  # EPERM (the seccomp filter)
    assert not {"etc", "home", "proc", "sys", "var", "run"} & set(seen["root"]), seen["root"]
    assert token not in done.stdout + done.stderr


@requires_binary("bwrap")
def test_the_pool_starts_its_children_under_bubblewrap() -> None:
    from service.offload import ChildPool, _Child

    child = _Child(1024 * 2**20, confine=True)
    try:
        child.wait_ready(120)
        assert Path(child.process.args[0]).name == "bwrap" and "--unshare-all" in child.process.args
        assert child.call("generate", ("reasoning_gym", "chain_sum", 0, {}), "p", 30, 1024) == 1
    finally:
        child.kill()
    assert ChildPool(workers=1, seconds=1, memory_mb=256).confine  # the default
