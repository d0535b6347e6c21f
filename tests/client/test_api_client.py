"""The Python client against the real service: a `python -m service serve` process and a real worker over
PostgreSQL and Redis, training the tiny model (tests/client/stack.py).

One job (STARE, full fine-tuning) carries most of it: submitted with an idempotency key, streamed while the
API process is restarted (no event lost or repeated), waited for, its metrics, report and checkpoints read,
and its best and latest checkpoints downloaded, verified and loaded with `from_pretrained`. A LoRA job's
adapter and merged model load too, and a local merge equals the server's. A download cut halfway leaves no
folder; 429s are retried after Retry-After; the API's errors arrive as typed exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stare_client import (
    AsyncClient,
    AuthError,
    Client,
    ConnectionError,
    JobPaused,
    MergeUnavailable,
    MissingDependency,
    NotFound,
    RateLimited,
    RetryInfo,
    StareError,
    ValidationError,
    WaitTimeout,
    is_terminal,
)
from stare_client import archive as client_archive
from tests.client.conftest import Submitted
from tests.client.stack import Stack, free_port, tiny_spec

pytestmark = pytest.mark.slow  # a real API process, a real worker and trainer runs


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _replay_and_states_without_a_trainer(client: Client, submitted: Submitted) -> str:
    """The idempotent replay, then a job queued behind the others paused, waited on, resumed, cancelled
    and deleted; its id."""
    spec = submitted.full_spec
    estimate = client.jobs.estimate(spec)
    assert estimate.total_steps == 4 and estimate.resolved_spec["optim"]["steps"] == 4

    # The same idempotency key and body: the job the first request created, not a second one.
    replay = client.jobs.create(spec, idempotency_key=submitted.idempotency_key, metadata={"test": "full"})
    assert replay.id == submitted.full

    # States without a trainer: a job queued behind the others is paused, waited on, resumed, cancelled.
    queued = client.jobs.create(tiny_spec(2))
    paused = client.jobs.pause(queued)
    assert paused.status == "paused" and not paused.is_terminal
    assert client.jobs.wait(queued, timeout=5, poll_s=0.1).status == "paused"  # on_paused="return"
    with pytest.raises(JobPaused):
        client.jobs.wait(queued, timeout=5, on_paused="raise")
    with pytest.raises(WaitTimeout) as waited:
        client.jobs.wait(queued, timeout=0.5, poll_s=0.1, on_paused="wait")
    assert waited.value.job.status == "paused"
    assert client.jobs.resume(queued).status == "queued"
    client.jobs.cancel(queued)
    cancelled = client.jobs.wait(queued, timeout=30, poll_s=0.2)
    assert cancelled.status == "cancelled" and is_terminal(cancelled.status)
    assert client.jobs.delete(queued).deleted is True
    with pytest.raises(NotFound) as missing:
        client.jobs.get(queued.id)
    assert missing.value.code == "not_found" and missing.value.param == "job_id"
    return queued.id


def _events_across_api_restart(stack: Stack, client: Client, job_id: str) -> list[int]:
    """The event stream, with the API process restarted once the job has started: every event once, in
    order; the events' ids."""
    seen: list[tuple[int, str, float]] = []
    restarted_at = None
    old_pid = stack.api.proc.pid if stack.api else None
    for event in client.jobs.events(job_id):
        seen.append((event.id, event.type, time.monotonic()))
        if restarted_at is None and event.type == "job.running":
            stack.restart_api()
            restarted_at = time.monotonic()
    assert restarted_at is not None and stack.api is not None and stack.api.proc.pid != old_pid
    ids = [i for i, _, _ in seen]
    assert ids == list(range(1, len(ids) + 1)), f"lost or repeated events: {ids}\n{stack.diagnostics()}"
    assert any(t > restarted_at for _, _, t in seen), "nothing arrived after the restart"
    paged = list(client.jobs.events(job_id, follow=False))
    assert [(e.id, e.type) for e in paged] == [(i, t) for i, t, _ in seen]
    assert seen[-1][1] == "job.succeeded" and "checkpoint.created" in {t for _, t, _ in seen}
    return ids


def _metrics_and_report(client: Client, job: Any, tmp_path: Path) -> Any:
    """The job's metric rows (all, filtered, as a frame) and its report; the report."""
    rows = client.jobs.metrics(job)
    assert [r.step for r in rows] == [1, 2, 3, 4]
    assert all(r.values["entropy/mean"] is not None for r in rows)
    only = client.jobs.metrics(job, names=["entropy/mean"], since_step=3)
    assert [(r.step, set(r.values)) for r in only] == [(3, {"entropy/mean"}), (4, {"entropy/mean"})]
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependency, match="pandas"):
            client.jobs.metrics_frame(job)
    else:
        frame = client.jobs.metrics_frame(job)
        assert list(frame.index) == [1, 2, 3, 4] and "entropy/mean" in frame.columns

    report = client.reports.get(job)
    assert report.job.id == job.id and report.job.algorithm == "stare"
    assert [row.step for row in report.evaluation.history] == [0, 2, 4]
    html = client.reports.save_html(job, tmp_path / "report" / "index.html")
    assert "<svg" in html.read_text()
    return report


def _best_checkpoint_downloaded_and_loaded(
    stack: Stack, client: Client, job: Any, report: Any, tmp_path: Path
) -> None:
    """The checkpoints kept, the best one downloaded (its bytes the server's), refused a second time into
    the same folder, and loaded with `from_pretrained`."""
    checkpoints = client.checkpoints.list(job)
    steps = [c.step for c in checkpoints]
    assert steps == [2, 4], steps  # keep_last 2
    assert all(c.metrics and c.metrics["entropy/mean"] is not None for c in checkpoints)
    scores = {row.step: row.avg_at_k for row in report.evaluation.history}
    best_step = max(steps, key=lambda s: (scores[s], s))

    best = client.checkpoints.download(job, "best", tmp_path / "best")
    assert best.step == best_step and best.kind == "model" and best.path == tmp_path / "best" / "model"
    assert client.checkpoints.get(job, best.step).sha256 == best.sha256  # the digest the server stored
    server_copy = (
        stack.artifact_root / stack.tenant_id / job.id / "run" / "checkpoints" / f"step-{best_step:06d}"
    )
    assert _sha256(best.path / "model.safetensors") == _sha256(server_copy / "model" / "model.safetensors")
    assert not list(tmp_path.glob(".best.partial-*"))
    with pytest.raises(StareError, match="already exists"):
        client.checkpoints.download(job, "best", tmp_path / "best")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(best.path)
    tokenizer = AutoTokenizer.from_pretrained(best.path)
    batch = tokenizer(["12+34="], return_tensors="pt")
    logits = model(**batch).logits
    assert logits.shape[-1] == model.config.vocab_size and logits.shape[1] == batch["input_ids"].shape[1]


def _model_only_download_and_disk(stack: Stack, client: Client, job: Any, tmp_path: Path) -> None:
    """Issue 46: the succeeded job's checkpoints keep model/ only on the server (the default
    checkpoint.training_state), a model-only download holds model/ alone and loads, and the job view says
    what the job's files take."""
    run_dir = stack.artifact_root / stack.tenant_id / job.id / "run"
    folders = sorted((run_dir / "checkpoints").glob("step-*"))
    assert folders and all((f / "model").is_dir() and not (f / "sharded").exists() for f in folders)
    got = client.checkpoints.download(job, "latest", tmp_path / "model-only", model_only=True)
    assert got.kind == "model" and got.path == tmp_path / "model-only" / "model"
    assert sorted(p.name for p in got.root.iterdir()) == ["model"]
    server_copy = folders[-1] / "model" / "model.safetensors"
    assert _sha256(got.path / "model.safetensors") == _sha256(server_copy)
    on_disk = sum(
        p.stat().st_size for p in (stack.artifact_root / stack.tenant_id / job.id).rglob("*") if p.is_file()
    )
    assert client.jobs.get(job).disk_bytes == on_disk


def _async_client_sees_the_same(
    stack: Stack, client: Client, job: Any, ids: list[int], tmp_path: Path
) -> None:
    """The async client sees the same job, events and bytes."""

    async def async_side() -> tuple[str, list[int], str, int]:
        async with AsyncClient(stack.url, stack.api_key) as aio:
            got = await aio.jobs.get(job.id)
            listed = [j.id async for j in aio.jobs.list(page_size=2)]
            assert job.id in listed
            events = [e.id async for e in aio.jobs.events(job.id)]  # finished: the stream ends by itself
            latest = await aio.checkpoints.download(job.id, "latest", tmp_path / "latest-async")
            rows = await aio.jobs.metrics(job.id)
            return got.status, events, latest.sha256, len(rows)

    status, async_ids, async_sha, async_rows = asyncio.run(async_side())
    assert status == "succeeded" and async_ids == ids and async_rows == 4
    assert async_sha == client.checkpoints.get(job, "latest").sha256


def test_job_lifecycle_events_across_restart_metrics_report_and_checkpoints(
    stack: Stack, client: Client, submitted: Submitted, tmp_path: Path
) -> None:
    queued = _replay_and_states_without_a_trainer(client, submitted)

    # Listing: one job per page still yields every job once; the status filter keeps only its state.
    every = [job.id for job in client.jobs.list(page_size=1)]
    assert len(every) == len(set(every)) and {submitted.full, submitted.lora, submitted.broken} <= set(every)
    assert queued not in every
    active = [j.status for j in client.jobs.list(status="queued")]
    assert all(s == "queued" for s in active)

    ids = _events_across_api_restart(stack, client, submitted.full)
    job = client.jobs.wait(submitted.full, timeout=120, poll_s=0.3)
    assert job.status == "succeeded", stack.diagnostics()
    assert job.is_terminal and job.progress.step == 4 and job.metadata == {"test": "full"}

    report = _metrics_and_report(client, job, tmp_path)
    _best_checkpoint_downloaded_and_loaded(stack, client, job, report, tmp_path)
    _model_only_download_and_disk(stack, client, job, tmp_path)
    _async_client_sees_the_same(stack, client, job, ids, tmp_path)


def test_lora_adapter_and_merged_model_load(
    client: Client, submitted: Submitted, tmp_path: Path, stack: Stack
) -> None:
    job = client.jobs.wait(submitted.lora, timeout=180, poll_s=0.3)
    assert job.status == "succeeded", stack.diagnostics()

    adapter = client.checkpoints.download(job, "latest", tmp_path / "adapter")
    assert adapter.kind == "adapter" and (adapter.path / "adapter_config.json").is_file()
    merged = client.checkpoints.download(job, "latest", tmp_path / "merged", merged=True)
    assert merged.kind == "model" and merged.path.name == "model"  # merge_on_save: the server merged it

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.models import build_tiny_arith

    base, _ = build_tiny_arith(seed=job.spec["seed"])  # the base the trainer builds in code
    with_adapter = PeftModel.from_pretrained(base, adapter.path)
    full = AutoModelForCausalLM.from_pretrained(merged.path)
    ids = torch.tensor([[1, 5, 6, 14, 7, 8, 16]])
    expected = full(input_ids=ids).logits
    torch.testing.assert_close(with_adapter(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)

    # Without merged weights: a clear refusal without a base, a local merge equal to the server's with one.
    lone = tmp_path / "lone"
    shutil.copytree(adapter.root, lone)
    shutil.rmtree(lone / "model")
    with pytest.raises(MergeUnavailable, match="merge_on_save"):
        client_archive.loadable(lone, merged=True, base_model=None)
    fresh, _ = build_tiny_arith(seed=job.spec["seed"])
    fresh.save_pretrained(tmp_path / "base")
    path, kind = client_archive.loadable(lone, merged=True, base_model=tmp_path / "base")  # a saved base
    assert kind == "merged" and path == lone / "merged" and (path / "tokenizer.json").is_file()
    local = AutoModelForCausalLM.from_pretrained(path)
    torch.testing.assert_close(local(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
    shutil.rmtree(lone / "merged")
    loaded, _ = build_tiny_arith(seed=job.spec["seed"])
    path, kind = client_archive.loadable(lone, merged=True, base_model=loaded)  # a base already loaded
    again = AutoModelForCausalLM.from_pretrained(path)
    torch.testing.assert_close(again(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)


class CuttingProxy:
    """A TCP proxy to the API that passes requests through and cuts every response after `limit` bytes: a
    connection that breaks mid-download."""

    def __init__(self, target_port: int, limit: int) -> None:
        self.target_port = target_port
        self.limit = limit
        self.port = free_port()
        self.cuts = 0
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, downstream: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))

        def forward_requests() -> None:
            try:
                while data := downstream.recv(65536):
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=forward_requests, daemon=True).start()
        sent = 0
        try:
            while sent < self.limit and (data := upstream.recv(min(65536, self.limit - sent))):
                downstream.sendall(data)
                sent += len(data)
        except OSError:
            pass
        if sent >= self.limit:
            self.cuts += 1
        for s in (downstream, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._server.close()


def test_interrupted_download_leaves_no_folder_and_retries_honour_retry_after(
    stack: Stack, client: Client, submitted: Submitted, tmp_path: Path
) -> None:
    job = client.jobs.wait(submitted.full, timeout=180, poll_s=0.3)
    latest = client.checkpoints.get(job, "latest")
    assert latest.sha256 is not None  # a download above has stored it
    # The listing answers pass through whole (they are small); the archive is cut halfway.
    half = 200_000
    proxy = CuttingProxy(stack.port, limit=half)
    try:
        via_proxy = Client(f"http://127.0.0.1:{proxy.port}", stack.api_key, max_retries=1, backoff_s=0.05)
        target = tmp_path / "cut"
        with pytest.raises(ConnectionError):
            via_proxy.checkpoints.download(job, "latest", target)
        via_proxy.close()
        assert proxy.cuts >= 2  # the first try and its one retry both broke mid-body
    finally:
        proxy.close()
    assert not target.exists(), "an interrupted download must leave no folder under the target's name"
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())  # nor its hidden partial folder
    complete = client.checkpoints.download(job, "latest", target)
    assert complete.sha256 == latest.sha256 and (target / "model" / "config.json").is_file()

    # A second API process with a tight rate limit: GETs wait out each 429 for its Retry-After and succeed;
    # a POST without an idempotency key is not retried.
    port = free_port()
    limited = stack.start_api(
        port, name="api-limited", STARE_RATE_LIMIT_PER_SECOND="1", STARE_RATE_LIMIT_BURST="1"
    )
    stack.extra.append(limited)
    retries: list[RetryInfo] = []
    with Client(f"http://127.0.0.1:{port}", stack.api_key, on_retry=retries.append) as slow:
        began = time.monotonic()
        for _ in range(3):
            assert slow.jobs.get(job.id).id == job.id
        elapsed = time.monotonic() - began
        assert [r.reason for r in retries] and all(r.reason == "HTTP 429" for r in retries), retries
        assert all(r.delay_s >= 1.0 for r in retries) and elapsed >= 1.5, (retries, elapsed)
        retries.clear()
        with pytest.raises(RateLimited) as limited_error:
            slow.keys.create("never-retried")
            slow.keys.create("never-retried")
        assert limited_error.value.retry_after_s is not None and limited_error.value.retry_after_s >= 1
        assert retries == []
    limited.stop()

    # Connection errors are retried (GET), then raised as the client's ConnectionError.
    dead: list[RetryInfo] = []
    with (
        Client(
            f"http://127.0.0.1:{free_port()}", "sk-none", max_retries=2, backoff_s=0.01, on_retry=dead.append
        ) as nowhere,
        pytest.raises(ConnectionError, match="cannot reach"),
    ):
        nowhere.jobs.get(job.id)
    assert len(dead) == 2


def test_errors_files_and_keys(stack: Stack, client: Client, tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as unknown:
        client.jobs.create({"optim": {"steps": 2, "bogus": 1}})
    assert unknown.value.status_code == 422 and unknown.value.param == "spec.optim.bogus", unknown.value
    with pytest.raises(AuthError) as denied, Client(stack.url, "sk-stare-wrong") as wrong:
        wrong.jobs.get("job_x")
    assert denied.value.status_code == 401 and denied.value.code == "invalid_api_key"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\nnot json\n')
    with pytest.raises(ValidationError) as refused:
        client.files.upload(bad)
    assert any(d.get("line") == 2 for d in refused.value.details), refused.value.details

    good = tmp_path / "good.jsonl"
    good.write_text("".join(f'{{"prompt": "{i}+{i}=", "answer": "{2 * i}"}}\n' for i in range(2000)))
    progress: list[tuple[int, int]] = []
    uploaded = client.files.upload(good, progress=lambda done, total: progress.append((done, total)))
    size = good.stat().st_size
    assert uploaded.records == 2000 and uploaded.bytes == size and uploaded.sha256 == _sha256(good)
    assert progress[0] == (0, size) and progress[-1] == (size, size) and len(progress) >= 2
    assert uploaded.id in {f.id for f in client.files.list()}
    assert client.files.delete(uploaded.id).deleted is True
    assert uploaded.id not in {f.id for f in client.files.list()}

    created = client.keys.create("client-test")
    assert created.key.startswith("sk-") and created.name == "client-test"
    with Client(stack.url, created.key) as other:
        assert other.me().api_key.id == created.id
    assert created.id in {k.id for k in client.keys.list()}
    revoked = client.keys.revoke(created.id)
    assert revoked.revoked_at is not None
    with pytest.raises(AuthError), Client(stack.url, created.key, max_retries=0) as gone:
        gone.me()
