"""Placement over HTTP on a real PostgreSQL (its own database: live workers here must not route other
tests' jobs): capacity and memory refusals name the field and the largest class and create nothing, the
rest is routed to the queue of a class that can run it (a real Redis list, by Celery's queue name), live
workers count while they beat and stop counting after the stale time, and bad declarations fail at start."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.settings import Settings
from store import migrate, repository
from store.database import Database
from tests.service.conftest import Postgres, TenantKey, migrated_database
from tests.service.helpers import GOOD_JSONL, TINY_SPEC, upload
from tests.services import redis_url

GIB = 1024**3
ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    {"name": "cpu-small", "queue": "cpu", "processes_per_node": 2, "memory_per_device_bytes": 8 * GIB},
    {
        "name": "gpu-8",
        "queue": "gpu",
        "processes_per_node": 8,
        "memory_per_device_bytes": 80 * GIB,
        "device": "cuda",
        "rollout_engines": ["hf", "vllm"],
    },
    {
        "name": "ray-4x2",
        "queue": "ray",
        "nodes": 4,
        "processes_per_node": 2,
        "memory_per_device_bytes": 16 * GIB,
    },
]


@pytest.fixture(scope="module")
def fleet_url(postgres: Postgres) -> Iterator[str]:
    with migrated_database(postgres, "stare_fleet_test") as url:
        yield url


@pytest.fixture(scope="module")
def fleet_db(fleet_url: str) -> Iterator[Database]:
    database = Database(fleet_url, pool_size=2)
    yield database
    database.dispose()


@pytest.fixture
def fleet_client(make_client: Callable[..., TestClient], fleet_url: str) -> Callable[..., TestClient]:
    def build(**overrides: Any) -> TestClient:
        overrides.setdefault("worker_registry_cache_s", 0.0)
        return make_client(database_url=fleet_url, **overrides)

    return build


@pytest.fixture
def fleet_tenant(make_tenant: Callable[..., TenantKey], fleet_db: Database) -> TenantKey:
    return make_tenant(fleet_db)


def _spec(**distributed: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TINY_SPEC)
    spec["distributed"] = distributed
    return spec


def _post(client: TestClient, tenant: TenantKey, url: str, spec: dict[str, Any], **body: Any) -> Any:
    return client.post(url, json={"spec": spec, **body}, headers=tenant.headers)


def _refusal(client: TestClient, tenant: TenantKey, spec: dict[str, Any]) -> dict[str, Any]:
    """The 422 both /estimate and create give (the same error), checked to create no job."""
    db = client.app.state.services.db  # type: ignore[attr-defined]
    errors = []
    for url in ("/v1/jobs/estimate", "/v1/jobs"):
        response = _post(client, tenant, url, spec)
        assert response.status_code == 422, response.text
        errors.append(response.json()["error"])
    assert errors[0] == errors[1]
    with db.transaction() as session:
        assert repository.list_jobs(session, tenant.tenant_id, after=None, limit=5)[0] == []
    assert errors[0]["code"] == "exceeds_capacity"
    return dict(errors[0])


def test_jobs_no_declared_class_can_run_are_refused_naming_the_field(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey
) -> None:
    client = fleet_client(worker_classes=CLASSES)
    error = _refusal(client, fleet_tenant, _spec(strategy="fsdp2", nodes=8, processes_per_node=1))
    assert error["param"] == "spec.distributed.nodes"
    assert "'ray-4x2'" in error["message"] and "spans 4 nodes" in error["message"]
    error = _refusal(client, fleet_tenant, _spec(processes_per_node=9))
    assert error["param"] == "spec.distributed.processes_per_node"
    assert "'gpu-8'" in error["message"] and "has 8 processes per node" in error["message"]
    error = _refusal(client, fleet_tenant, _spec(strategy="fsdp2", nodes=2, processes_per_node=3))
    assert error["param"] == "spec.distributed.processes_per_node"  # the classes spanning 2 nodes have 2
    assert "'ray-4x2'" in error["message"] and "has 2 processes per node" in error["message"]
    vllm_on_ray = {**_spec(nodes=2, processes_per_node=2), "rollout": {"engine": "vllm"}}
    error = _refusal(client, fleet_tenant, vllm_on_ray)
    assert error["param"] == "spec.rollout.engine"
    only_fsdp2 = [{**c, "strategies": ["fsdp2"]} for c in CLASSES]
    client = fleet_client(worker_classes=only_fsdp2)
    error = _refusal(client, fleet_tenant, _spec(strategy="ddp"))
    assert error["param"] == "spec.distributed.strategy" and "fsdp2" in error["message"]


def test_a_vllm_job_on_a_cpu_class_too_small_for_the_engines_copy_is_refused_naming_the_engine(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey
) -> None:
    """SmolLM2 with vLLM on a CPU class holding its training step but not vLLM's resident float32 copy and
    1 GiB cache beside it (contract.fleet.vllm_cpu_resident_bytes): 422 naming spec.rollout.engine; the same
    job with HF generate is placed there."""
    smol = {**_spec(), "model": {"name": "smollm2-135m-instruct"}}
    estimate = _post(fleet_client(worker_classes=CLASSES), fleet_tenant, "/v1/jobs/estimate", smol)
    assert estimate.status_code == 200, estimate.text
    step = estimate.json()["memory_per_device"]["total_bytes"]
    cpu = [
        {
            "name": "cpu-vllm",
            "queue": "cpu",
            "memory_per_device_bytes": step + GIB,
            "rollout_engines": ["hf", "vllm"],
        }
    ]
    client = fleet_client(worker_classes=cpu)
    error = _refusal(client, fleet_tenant, {**smol, "rollout": {"engine": "vllm"}})
    assert error["param"] == "spec.rollout.engine", error
    assert "for vLLM's copy and cache" in error["message"] and "'cpu-vllm'" in error["message"]
    assert _post(client, fleet_tenant, "/v1/jobs/estimate", smol).status_code == 200


def test_the_one_node_spelling_is_named_as_the_request_wrote_it(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey
) -> None:
    client = fleet_client(worker_classes=CLASSES)
    error = _refusal(client, fleet_tenant, _spec(num_processes=9))
    assert error["param"] == "spec.distributed.num_processes"
    assert error["message"].startswith("distributed.num_processes is 9")


def test_jobs_are_routed_to_the_queue_of_a_class_that_can_run_them(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey
) -> None:
    tag = uuid.uuid4().hex[:8]
    classes = [{**c, "queue": f"{c['queue']}-{tag}"} for c in CLASSES]
    client = fleet_client(worker_classes=classes, queue_backend="celery", broker_url=redis_url())
    broker = redis.Redis.from_url(redis_url())
    cases = [
        (_spec(), f"cpu-{tag}", "cpu-small"),  # the smallest class that fits
        (_spec(processes_per_node=4), f"gpu-{tag}", "gpu-8"),
        (_spec(strategy="fsdp2", nodes=2, processes_per_node=2), f"ray-{tag}", "ray-4x2"),
        ({**_spec(), "rollout": {"engine": "vllm"}}, f"gpu-{tag}", "gpu-8"),
    ]
    try:
        for spec, queue, name in cases:
            estimate = _post(client, fleet_tenant, "/v1/jobs/estimate", spec)
            assert estimate.status_code == 200, estimate.text
            assert estimate.json()["queue"] == queue and f"'{name}'" in estimate.json()["worker_class"]
            before = broker.llen(queue)
            created = _post(client, fleet_tenant, "/v1/jobs", spec)
            assert created.status_code == 201, created.text
            assert created.json()["queue"] == queue
            assert broker.llen(queue) == before + 1  # the doorbell rang on that queue, not another
    finally:
        broker.delete(*{q for _, q, _ in cases})
        broker.close()


def test_memory_per_device_is_reported_and_refused_when_no_class_has_it(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey
) -> None:
    small = [
        {"name": "tiny-box", "queue": "small", "processes_per_node": 2, "memory_per_device_bytes": 32 * 2**20}
    ]
    client = fleet_client(worker_classes=small)
    # tiny-arith, operands 0-9: the longest prompt "9+9=" is 4 bytes + <bos>; 64 rows of 5 + 16 new tokens.
    error = _refusal(client, fleet_tenant, _spec())
    assert error["param"] == "spec.optim.micro_batch_size"  # activations dominate on the tiny model
    assert "'tiny-box'" in error["message"] and "has 32.0 MiB per device" in error["message"]
    fits = {**_spec(), "optim": {"steps": 20, "micro_batch_size": 8}}
    estimate = _post(client, fleet_tenant, "/v1/jobs/estimate", fits)
    assert estimate.status_code == 200, estimate.text
    memory = estimate.json()["memory_per_device"]
    assert (memory["prompt_tokens"], memory["micro_batch_tokens"]) == (5, 8 * (5 + 16))
    parts = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "gathered_bytes", "activations_bytes")
    assert (
        memory["total_bytes"] == sum(memory[p] for p in parts) - memory["not_coexisting_bytes"] <= 32 * 2**20
    )
    assert memory["parameters_bytes"] == 4 * 494_976  # tiny-arith's parameters, fp32
    sharded = _post(
        client,
        fleet_tenant,
        "/v1/jobs/estimate",
        # fsdp2 over 2 processes: 2 prompts × 8 → 8 rows each, one micro-batch of 8.
        {
            **fits,
            "optim": {**fits["optim"], "prompts_per_step": 2},
            "distributed": {"strategy": "fsdp2", "processes_per_node": 2},
        },
    )
    assert sharded.status_code == 200, sharded.text
    assert sharded.json()["memory_per_device"]["parameters_bytes"] == 2 * 494_976
    assert sharded.json()["memory_per_device"]["gathered_bytes"] > 0
    smol = {**fits, "model": {"name": "smollm2-135m-instruct"}}
    error = _refusal(client, fleet_tenant, smol)
    assert error["param"] == "spec.distributed.strategy"  # model state dominates: fsdp2 would shard it


CONFIG_MODEL = "llama-1b-random"  # an operator's extra model: bench/make_config_model.py --parameters 1.2e9


def test_a_from_config_model_ddp_cannot_fit_is_refused_and_placed_under_fsdp2(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey
) -> None:
    """The from-config model of bench/make_config_model.py (1.18e9 parameters: 24 Llama layers of width
    2048, SmolLM2's 49 152-token vocabulary; the estimate reads its declared config, never its weights)
    on a class the size of this 24 GiB machine split over 2 processes, 12 GiB each. ddp keeps the whole fp32
    model state in each process (weights 4, DDP's gradient and bucket copies 8, AdamW 8 bytes a parameter:
    23.7 GB): refused with a 422 naming spec.distributed.strategy. fsdp2 × 2 shards it (10.3 GB a training
    step; its HF rollout, with the full weights gathered beside the shards, 11.8 GB): placed.
    An extra model without a declared config is not estimated (never refused on memory)."""
    from bench.make_config_model import layers_for, shape_config

    width = {"hidden": 2048, "intermediate": 5632, "heads": 32, "kv_heads": 8}
    config = shape_config(layers=layers_for(1.2e9, **width), **width)
    box = [{"name": "cpu-24g", "queue": "cpu", "processes_per_node": 2, "memory_per_device_bytes": 12 * GIB}]
    extra = {CONFIG_MODEL: "Llama shape, random weights (bench/make_config_model.py)"}
    client = fleet_client(worker_classes=box, extra_models=extra, extra_model_configs={CONFIG_MODEL: config})

    def spec(strategy: str) -> dict[str, Any]:
        job = _spec(strategy=strategy, processes_per_node=2)
        job["model"] = {"name": CONFIG_MODEL}
        job["optim"] = {"steps": 3, "prompts_per_step": 2, "micro_batch_size": 4}
        job["sampling"] = {"group_size": 4, "max_new_tokens": 64}
        return job

    error = _refusal(client, fleet_tenant, spec("ddp"))
    assert error["param"] == "spec.distributed.strategy"
    assert "'cpu-24g'" in error["message"] and "has 12.00 GiB per device" in error["message"]
    sharded = _post(client, fleet_tenant, "/v1/jobs/estimate", spec("fsdp2"))
    assert sharded.status_code == 200, sharded.text
    memory = sharded.json()["memory_per_device"]
    assert memory["parameters_bytes"] == 4 * 1_182_894_080 // 2  # fp32, half in each process
    # HF generate gathers the full weights beside the shards: that rollout is the peak (2 + 4 + 4 bytes a
    # parameter, 11.0 GiB), above the training step.
    assert memory["rollout_gathered_bytes"] == 4 * 1_182_894_080
    rollout = memory["parameters_bytes"] + memory["optimizer_bytes"] + memory["rollout_gathered_bytes"]
    assert memory["total_bytes"] == rollout
    assert GIB < memory["total_bytes"] <= 12 * GIB
    unknown = fleet_client(worker_classes=box, extra_models=extra)  # no config: no estimate
    assert _post(unknown, fleet_tenant, "/v1/jobs/estimate", spec("ddp")).json()["memory_per_device"] is None


def test_the_longest_prompt_of_an_uploaded_file_sizes_the_activations(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey
) -> None:
    client = fleet_client(worker_classes=CLASSES)
    long_prompt = "1+" * 200 + "1="
    content = GOOD_JSONL + f'{{"prompt": "{long_prompt}", "answer": "201"}}\n'.encode()
    file_id = upload(client, fleet_tenant.headers, content, purpose="rl_train").json()["id"]
    spec = {**TINY_SPEC, "task": {"source": "jsonl", "eval_size": 1}}
    estimate = _post(client, fleet_tenant, "/v1/jobs/estimate", spec, training_file=file_id)
    assert estimate.status_code == 200, estimate.text
    line = len(f'{{"prompt": "{long_prompt}", "answer": "201"}}')
    assert estimate.json()["memory_per_device"]["prompt_tokens"] == line + 1  # the line bounds the prompt


def _worker(fleet_url: str, queue: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STARE_DATABASE_URL": fleet_url,
        "STARE_BROKER_URL": redis_url(),
        "STARE_TRAINING_QUEUE": queue,
        "STARE_ARTIFACT_ROOT": str(tmp_path / "artifacts"),
        "STARE_REGISTRY_HEARTBEAT_S": "0.5",
        "STARE_WORKER_PROCESSES_PER_NODE": "3",
        "STARE_WORKER_MEMORY_PER_DEVICE_MIB": "4096",
    }
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen([sys.executable, "-m", "worker", "run"], env=env, stdout=log, stderr=log)


def _wait_status(
    client: TestClient, tenant: TenantKey, spec: dict[str, Any], status: int, within_s: float
) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        response = _post(client, tenant, "/v1/jobs/estimate", spec)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.25)


def test_a_live_worker_counts_while_it_beats_and_not_after_the_stale_time(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey, fleet_url: str, tmp_path: Path
) -> None:
    """A real `python -m worker run` registers itself; only it offers capacity (no declared class). It keeps
    counting past the stale time while it beats; SIGKILLed, it stops counting once its beat is stale."""
    queue = f"live-{uuid.uuid4().hex[:8]}"
    client = fleet_client(worker_classes=[], worker_stale_after_s=2.0)
    spec = _spec(processes_per_node=3)
    proc = _worker(fleet_url, queue, tmp_path)
    try:
        estimate = _wait_status(client, fleet_tenant, spec, 200, within_s=90)
        assert estimate.status_code == 200, (estimate.text, (tmp_path / "worker.log").read_text()[-2000:])
        assert estimate.json()["queue"] == queue and "live worker" in estimate.json()["worker_class"]
        error = _post(client, fleet_tenant, "/v1/jobs/estimate", _spec(processes_per_node=4)).json()["error"]
        assert (
            error["param"] == "spec.distributed.processes_per_node" and "has 3 processes" in error["message"]
        )
        time.sleep(3.0)  # past the stale time: its beats (every 0.5 s) keep it live
        assert _post(client, fleet_tenant, "/v1/jobs/estimate", spec).status_code == 200
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        killed_at = time.monotonic()
        refused = _wait_status(client, fleet_tenant, spec, 422, within_s=10)
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "exceeds_capacity"
        assert time.monotonic() - killed_at >= 2.0 - 0.6  # not before its last beat went stale
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_worker_that_stops_cleanly_leaves_the_registry(
    fleet_db: Database, backend: str, tmp_path: Path
) -> None:
    """The registry's calls on both stores (SQLite: the embedded stack's worker runs the same code)."""
    from worker.registry import Registration
    from worker.settings import WorkerSettings

    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'embedded.db'}"
        migrate.upgrade(url)
        fleet_db = Database(url, pool_size=1)
    settings = WorkerSettings(
        database_url="sqlite://",
        worker_processes_per_node=2,
        vllm_python="/usr/bin/python3",
        registry_heartbeat_s=60,
    )
    registration = Registration(fleet_db, settings, f"w-{uuid.uuid4().hex[:6]}", ["a", "b"]).start()
    with fleet_db.transaction() as session:
        rows = [w for w in repository.live_workers(session, 60) if w.id == registration.worker_id]
    assert sorted(w.queue for w in rows) == ["a", "b"]
    assert rows[0].capabilities["rollout_engines"] == ["hf", "vllm"]
    assert rows[0].capabilities["processes_per_node"] == 2
    with fleet_db.transaction() as session:
        repository.remove_worker(session, registration.worker_id)
    registration.beat()  # its rows were removed: the next beat registers it again
    with fleet_db.transaction() as session:
        assert len([w for w in repository.live_workers(session, 60) if w.id == registration.worker_id]) == 2
    registration.stop()
    with fleet_db.transaction() as session:
        assert [w for w in repository.live_workers(session, 60) if w.id == registration.worker_id] == []


def test_bad_declarations_fail_at_startup_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [
        ('[{"queue": "gpu", "processes_per_node": 0}]', "worker_classes.0.processes_per_node"),
        ('[{"queue": "gpu", "strategies": ["zero3"]}]', "worker_classes.0.strategies"),
        ('[{"processes_per_node": 2}]', "worker_classes.0.queue"),
        ('[{"queue": "gpu", "gpus": 2}]', "worker_classes.0.gpus"),
        ('{"queue": "gpu"}', "worker_classes"),
        ('[{"name": "a", "queue": "x"}, {"name": "a", "queue": "y"}]', "names must be distinct"),
    ]
    for value, named in cases:
        monkeypatch.setenv("STARE_WORKER_CLASSES", value)
        with pytest.raises(ValidationError) as info:
            Settings()
        assert named in str(info.value), value
    monkeypatch.delenv("STARE_WORKER_CLASSES")
    shape = {"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1}
    model_cases = [
        ({}, {"m": {**shape, "num_attention_heads": 2}}, "'m' is not one of extra_models"),
        ({"m": "x"}, {"m": shape}, "extra_model_configs.m: num_attention_heads must be a positive integer"),
        (
            {"m": "x"},
            {"m": {**shape, "num_attention_heads": 3}},
            "extra_model_configs.m: hidden_size must divide",
        ),
    ]
    for models, configs, named in model_cases:
        with pytest.raises(ValidationError) as info:
            Settings(extra_models=models, extra_model_configs=configs)
        assert named in str(info.value), configs


# 7 processes: no other test of this module registers a worker that large (a killed one stays in the
# registry until it is forgotten), so only the row a test registers can take its jobs.
WORKER_CLASS = {"name": None, "queue": "q", "processes_per_node": 7, "memory_per_device_bytes": 8 * GIB}
SECRET_WORKER = "worker-424242@secret-host.internal"


def _register(db: Database, worker_id: str, queue: str, **when: Any) -> None:
    with db.transaction() as session:
        repository.register_worker(session, worker_id, {**WORKER_CLASS, "queue": queue}, [queue], **when)


def test_a_heartbeat_dated_in_the_future_does_not_count_and_beats_use_the_databases_clock(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey, fleet_db: Database
) -> None:
    """A row whose beat is an hour ahead (a host whose clock ran ahead) offers no capacity, however long it
    would stay "fresh" on a comparison with the API host's clock; a beat written now (the database's clock)
    counts, and is the database's time."""
    client = fleet_client(worker_classes=[], worker_stale_after_s=30.0)
    queue = f"skew-{uuid.uuid4().hex[:8]}"
    skewed = f"w-skewed-{uuid.uuid4().hex[:6]}"
    with fleet_db.transaction() as session:
        ahead = repository.db_now(session) + timedelta(hours=1)
    _register(fleet_db, skewed, queue, now=ahead)
    try:
        refused = _post(client, fleet_tenant, "/v1/jobs/estimate", _spec(processes_per_node=7))
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "exceeds_capacity", (
            refused.text
        )
        with fleet_db.transaction() as session:
            assert [w for w in repository.live_workers(session, 30.0) if w.id == skewed] == []
            repository.worker_heartbeat(session, skewed)  # the next beat: on the database's clock
        with fleet_db.transaction() as session:
            now = repository.db_now(session)
            row = next(w for w in repository.live_workers(session, 30.0) if w.id == skewed)
            assert abs((row.heartbeat_at - now).total_seconds()) < 5
        assert (
            _post(client, fleet_tenant, "/v1/jobs/estimate", _spec(processes_per_node=7)).status_code == 200
        )
    finally:
        with fleet_db.transaction() as session:
            repository.remove_worker(session, skewed)


def test_tenants_see_no_worker_host_or_pid(
    fleet_client: Callable[..., TestClient], fleet_tenant: TenantKey, fleet_db: Database
) -> None:
    """Estimates name the class a job would run on and job events say an attempt started; neither names the
    worker (its host name and pid stay in the lease owner and the worker's log)."""
    client = fleet_client(worker_classes=[])
    queue = f"private-{uuid.uuid4().hex[:8]}"
    _register(fleet_db, SECRET_WORKER, queue)
    try:
        estimate = _post(client, fleet_tenant, "/v1/jobs/estimate", _spec(processes_per_node=7))
        assert estimate.status_code == 200, estimate.text
        assert estimate.json()["worker_class"] == f"a live worker on queue {queue!r}"
        created = _post(client, fleet_tenant, "/v1/jobs", _spec(processes_per_node=7))
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        with fleet_db.transaction() as session:
            claim = repository.claim_job(session, job_id, owner="secret-host.internal:424242", lease_s=30)
            assert claim is not None
        seen = [
            client.get(path, headers=fleet_tenant.headers).text
            for path in (f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}", "/v1/jobs")
        ]
        seen.append(estimate.text)
        for text in seen:
            assert "secret-host" not in text and "424242" not in text, text
        events = client.get(f"/v1/jobs/{job_id}/events", headers=fleet_tenant.headers).json()["data"]
        assert [e["message"] for e in events if e["type"] == "job.running"] == ["Attempt 1 started"]
    finally:
        with fleet_db.transaction() as session:
            repository.remove_worker(session, SECRET_WORKER)
