"""The synchronous client: `Client(base_url, api_key)` with one namespace per resource (jobs, files,
checkpoints, reports, keys). `stare_client.aio.AsyncClient` is the same API with `await`.

    from stare_client import Client

    with Client() as stare:                      # STARE_API_URL / STARE_API_KEY, or a local stack
        job = stare.jobs.create(spec)            # an Idempotency-Key is generated (and retried safely)
        for event in stare.jobs.events(job):     # survives disconnects: no event lost or repeated
            print(event.type, event.message)
        job = stare.jobs.wait(job, timeout=600)
        ckpt = stare.checkpoints.download(job, "best", "out/best")
        model = AutoModelForCausalLM.from_pretrained(ckpt.path)
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from stare_client import archive, errors, models, states, transport
from stare_client.config import resolve
from stare_client.transport import ProgressCallback, RetryPolicy

if TYPE_CHECKING:
    import pandas

JobRef = str | models.Job
DEFAULT_TIMEOUT_S = 30.0
STREAM_READ_TIMEOUT_S = 60.0  # the server sends a keep-alive every 15 s; silence for longer is a dead link
RECONNECT_FOR_S = 120.0  # an event stream gives up after this long without getting through


@dataclass(frozen=True)
class RetryInfo:
    """Passed to `on_retry` before each retry's wait."""

    method: str
    url: str
    attempt: int
    delay_s: float
    reason: str  # "HTTP 429", "HTTP 503", or the connection error


class Client:
    """A connection to the STARE API. `base_url` and `api_key` default to STARE_API_URL and STARE_API_KEY,
    then to a local stack's `.stare/embedded.json` and `.stare/api-key` (stare_client.config)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        on_retry: Callable[[RetryInfo], None] | None = None,
        home: str | os.PathLike[str] | None = None,
    ) -> None:
        conn = resolve(base_url, api_key, home=home)
        self.base_url = conn.base_url
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s)
        self.on_retry = on_retry
        self.http = httpx.Client(
            base_url=conn.base_url,
            headers={"Authorization": f"Bearer {conn.api_key}", "User-Agent": transport.USER_AGENT},
            timeout=timeout_s,
        )
        self.jobs = Jobs(self)
        self.files = Files(self)
        self.checkpoints = Checkpoints(self)
        self.reports = Reports(self)
        self.keys = Keys(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # ------------------------------------------------------------------------------------------ requests

    def send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        content: Any = None,
        stream: bool = False,
    ) -> httpx.Response:
        """One request with the retry policy; an APIError for an error status. With `stream`, the body is
        not read (the caller closes the response)."""
        safe = transport.retry_safe(method, headers)
        attempt = 0
        while True:
            request = self.http.build_request(
                method, path, params=params, json=json, headers=headers, content=content
            )
            try:
                response = self.http.send(request, stream=stream)
            except transport.RETRYABLE_ERRORS as err:
                if not safe or attempt >= self.retry.max_retries:
                    raise transport.connection_error(err, self.base_url) from err
                attempt += 1
                self._wait(method, request, attempt, None, type(err).__name__)
                continue
            if response.status_code in transport.RETRY_STATUSES and safe and attempt < self.retry.max_retries:
                response.close()
                attempt += 1
                self._wait(
                    method, request, attempt, transport.retry_after(response), f"HTTP {response.status_code}"
                )
                continue
            if response.status_code >= 400:
                if stream:
                    response.read()
                    response.close()
                transport.raise_for_error(response)
            return response

    def _wait(
        self, method: str, request: httpx.Request, attempt: int, retry_after_s: float | None, reason: str
    ) -> None:
        delay = self.retry.delay(attempt, retry_after_s)
        if self.on_retry is not None:
            self.on_retry(RetryInfo(method, str(request.url), attempt, delay, reason))
        time.sleep(delay)

    def get(self, model: type[transport.T], path: str, **params: Any) -> transport.T:
        query = {k: v for k, v in params.items() if v is not None}
        return transport.parse(model, self.send("GET", path, params=query or None))

    def me(self) -> models.Me:
        """The tenant and key behind this client, the tenant's limits and usage."""
        return self.get(models.Me, "/v1/me")

    def models(self) -> list[models.Model]:
        """Base models a job may name in spec.model.name."""
        return self.get(models.ModelList, "/v1/models").data


class Jobs:
    def __init__(self, client: Client) -> None:
        self._c = client

    def estimate(
        self,
        spec: dict[str, Any],
        *,
        training_file: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> models.Estimate:
        """Validate a spec and estimate its cost, without creating the job."""
        body = transport.spec_body(spec, training_file, metadata)
        return transport.parse(models.Estimate, self._c.send("POST", "/v1/jobs/estimate", json=body))

    def create(
        self,
        spec: dict[str, Any],
        *,
        training_file: str | None = None,
        metadata: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> models.Job:
        """Submit a job. The Idempotency-Key (generated when not given) makes the request safe to retry: a
        repeat returns the job the first one created, never a second job."""
        key = idempotency_key or transport.new_idempotency_key()
        body = transport.spec_body(spec, training_file, metadata)
        response = self._c.send("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        return transport.parse(models.Job, response)

    def list_page(
        self, *, status: str | None = None, after: str | None = None, limit: int = 20
    ) -> models.JobList:
        return self._c.get(models.JobList, "/v1/jobs", status=status, after=after, limit=limit)

    def list(self, *, status: str | None = None, page_size: int = 20) -> Iterator[models.Job]:
        """Every job of the tenant, newest first (optionally only those in `status`), page by page."""
        after: str | None = None
        while True:
            page = self.list_page(status=status, after=after, limit=page_size)
            yield from page.data
            if not page.has_more or page.last_id is None:
                return
            after = page.last_id

    def get(self, job: JobRef) -> models.Job:
        return self._c.get(models.Job, f"/v1/jobs/{transport.job_id_of(job)}")

    def _action(self, job: JobRef, action: str) -> models.Job:
        response = self._c.send("POST", f"/v1/jobs/{transport.job_id_of(job)}/{action}")
        return transport.parse(models.Job, response)

    def cancel(self, job: JobRef) -> models.Job:
        """Cancel at once (not running) or at the next step (running: `cancelling`, then `cancelled`)."""
        return self._action(job, "cancel")

    def pause(self, job: JobRef) -> models.Job:
        """Pause: at once when queued; a running job checkpoints first (`pausing`, then `paused`)."""
        return self._action(job, "pause")

    def resume(self, job: JobRef) -> models.Job:
        """Queue a paused job (or one that failed on a system fault) again, from its latest checkpoint."""
        return self._action(job, "resume")

    def delete(self, job: JobRef) -> models.Deleted:
        """Delete a finished job with its events, metrics, checkpoints and files (409 before it finished)."""
        response = self._c.send("DELETE", f"/v1/jobs/{transport.job_id_of(job)}")
        return transport.parse(models.Deleted, response)

    def wait(
        self,
        job: JobRef,
        timeout: float | None = None,
        *,
        poll_s: float = 1.0,
        on_paused: states.OnPaused = "return",
        on_update: Callable[[models.Job], None] | None = None,
    ) -> models.Job:
        """Poll the job until it is terminal (succeeded, failed, cancelled) and return it; the states and
        what wait does in each are in stare_client.states. `paused` returns it (default), waits for a
        resume, or raises JobPaused (`on_paused`). WaitTimeout after `timeout` seconds (None: no limit).
        `on_update(job)` sees every poll's answer."""
        job_id = transport.job_id_of(job)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = self.get(job_id)
            if on_update is not None:
                on_update(current)
            action = states.wait_action(current.status, on_paused)
            if action == "return":
                return current
            if action == "raise":
                raise errors.JobPaused(f"job {job_id} is paused (resume it to continue)", current)
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.WaitTimeout(
                    f"job {job_id} is still {current.status} after {timeout:g} s", current
                )
            pause = poll_s if deadline is None else min(poll_s, max(deadline - time.monotonic(), 0.0))
            time.sleep(pause)

    def events(
        self, job: JobRef, *, after: int = 0, follow: bool = True, reconnect_for_s: float = RECONNECT_FOR_S
    ) -> Iterator[models.Event]:
        """The job's events, oldest first, each once. `follow` (default): a live stream (SSE) that ends when
        the job has finished; a dropped connection or a restarted server is reconnected with Last-Event-ID,
        so no event is lost or repeated (the ids ascend strictly). Gives up (ConnectionError) after
        `reconnect_for_s` seconds without getting through. `follow=False`: the events so far, page by page."""
        job_id = transport.job_id_of(job)
        path = f"/v1/jobs/{job_id}/events"
        last = after
        if not follow:
            while True:
                page = self._c.get(models.EventList, path, after=last, limit=1000)
                yield from page.data
                if not page.has_more or page.last_id is None:
                    return
                last = page.last_id
        failing_since: float | None = None
        attempt = 0
        while True:
            try:
                with contextlib.closing(self._stream_once(path, last)) as stream:
                    for event in stream:
                        if event is None:  # the `end` message: every event was sent
                            return
                        failing_since, attempt = None, 0
                        if event.id > last + 1:  # ids are contiguous per job: fill a gap from the pages
                            for missing in self._between(path, last, event.id):
                                last = missing.id
                                yield missing
                        if event.id > last:  # a reconnect never repeats one
                            last = event.id
                            yield event
                reason = "the stream closed before its end"
            except errors.ConnectionError as err:
                reason = err.message
            except (errors.ServerUnavailable, errors.RateLimited) as err:
                reason = str(err)
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > reconnect_for_s:
                raise errors.ConnectionError(
                    f"event stream of {job_id} lost for {reconnect_for_s:g} s: {reason}", code="stream_lost"
                )
            attempt += 1
            time.sleep(self._c.retry.delay(attempt, None))

    def _between(self, path: str, after: int, before: int) -> builtins.list[models.Event]:
        page = self._c.get(models.EventList, path, after=after, limit=min(before - after - 1, 1000))
        return [event for event in page.data if event.id < before]

    def _stream_once(self, path: str, last: int) -> Generator[models.Event | None, None, None]:
        headers = {"Accept": "text/event-stream"}
        if last:
            headers["Last-Event-ID"] = str(last)
        request = self._c.http.build_request(
            "GET",
            path,
            params={"stream": "true"},
            headers=headers,
            timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S),
        )
        try:
            response = self._c.http.send(request, stream=True)
        except transport.RETRYABLE_ERRORS as err:
            raise transport.connection_error(err, self._c.base_url) from err
        try:
            if response.status_code >= 400:
                response.read()
                transport.raise_for_error(response)
            parser = transport.SSEParser()
            for line in response.iter_lines():
                message = parser.feed_line(line)
                if message is None:
                    continue
                if message.event == "end":
                    yield None
                    return
                data = transport.decode_event(message)
                if data is not None:
                    yield models.Event.model_validate(data)
        except transport.RETRYABLE_ERRORS as err:
            raise transport.connection_error(err, self._c.base_url) from err
        finally:
            response.close()

    def metrics(
        self,
        job: JobRef,
        *,
        names: builtins.list[str] | None = None,
        since_step: int = 0,
        until_step: int | None = None,
    ) -> builtins.list[models.MetricPoint]:
        """Per-step metrics, oldest first (every page), optionally only `names`."""
        path = f"/v1/jobs/{transport.job_id_of(job)}/metrics"
        rows: builtins.list[models.MetricPoint] = []
        while True:
            page = self._c.get(
                models.MetricsHistory,
                path,
                since_step=since_step,
                until_step=until_step,
                names=",".join(names) if names else None,
            )
            rows.extend(page.data)
            if not page.has_more or not page.data:
                return rows
            since_step = page.data[-1].step + 1

    def metrics_frame(self, job: JobRef, *, names: builtins.list[str] | None = None) -> pandas.DataFrame:
        """The metrics as a pandas DataFrame indexed by step, one column per metric (needs pandas)."""
        return metrics_frame(self.metrics(job, names=names))


def metrics_frame(rows: list[models.MetricPoint]) -> pandas.DataFrame:
    try:
        import pandas
    except ImportError as err:
        raise errors.MissingDependency(
            "metrics as a DataFrame need pandas, which is not installed: pip install pandas "
            "(or use jobs.metrics() for plain rows)",
            code="missing_dependency",
            param="pandas",
        ) from err
    frame = pandas.DataFrame([{"step": r.step, **r.values} for r in rows])
    return frame.set_index("step") if not frame.empty else frame


class Files:
    def __init__(self, client: Client) -> None:
        self._c = client

    def upload(
        self,
        path: str | os.PathLike[str],
        *,
        purpose: str = "rl_train",
        progress: ProgressCallback | None = None,
    ) -> models.File:
        """Upload a JSONL dataset (`{"prompt", "answer"[, "meta"]}` per line). `progress(sent, total)` after
        each chunk. Not retried (an upload carries no idempotency key)."""
        source = Path(path)
        try:
            fh = source.open("rb")
        except OSError as err:
            raise errors.StareError(f"cannot read {source}: {err.strerror}", code="file_unreadable") from err
        with fh:
            body = transport.MultipartUpload(fh, source.name, purpose, progress)
            response = self._c.send("POST", "/v1/files", content=body.chunks(), headers=body.headers)
        return transport.parse(models.File, response)

    def list(self, *, purpose: str | None = None, page_size: int = 20) -> Iterator[models.File]:
        after: str | None = None
        while True:
            page = self._c.get(models.FileList, "/v1/files", purpose=purpose, after=after, limit=page_size)
            yield from page.data
            if not page.has_more or page.last_id is None:
                return
            after = page.last_id

    def get(self, file_id: str) -> models.File:
        return self._c.get(models.File, f"/v1/files/{file_id}")

    def delete(self, file_id: str) -> models.Deleted:
        return transport.parse(models.Deleted, self._c.send("DELETE", f"/v1/files/{file_id}"))


class Checkpoints:
    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self, job: JobRef) -> list[models.Checkpoint]:
        """The job's checkpoints, oldest first, each with the training metrics of its step."""
        return self._c.get(models.CheckpointList, f"/v1/jobs/{transport.job_id_of(job)}/checkpoints").data

    def get(self, job: JobRef, which: archive.Selector = "latest") -> models.Checkpoint:
        """`which`: "latest", "best" (highest held-out avg@k), a step, or a checkpoint id."""
        job_id = transport.job_id_of(job)
        report = self._c.reports.get(job_id) if which == "best" else None
        return archive.select(self.list(job_id), which, report)

    def download(
        self,
        job: JobRef,
        which: archive.Selector = "latest",
        to: str | os.PathLike[str] | None = None,
        *,
        merged: bool = False,
        base_model: object = None,
        overwrite: bool = False,
        progress: ProgressCallback | None = None,
    ) -> archive.DownloadedCheckpoint:
        """Download, verify (SHA-256 and size) and unpack a checkpoint into `to` (default
        ./<job>-step-NNNNNN); returns where `from_pretrained` loads it (`.path`). For a LoRA job that is the
        adapter, or with `merged=True` the merged model (stare_client.archive says how). The folder appears
        under its name only once complete; an interrupted download leaves none."""
        ckpt = self.get(job, which)
        target = archive.target_folder(to, ckpt.job_id, ckpt.step)
        archive.check_target(target, overwrite)
        staging = archive.staging_folder(target)
        try:
            tar_path = staging / "checkpoint.tar"
            sha256 = self._fetch(ckpt, tar_path, progress)
            root = archive.safe_extract(tar_path, staging / "tree")
            tar_path.unlink()
            path, kind = archive.loadable(root, merged, base_model)
            archive.publish(root, target, overwrite)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return archive.DownloadedCheckpoint(
            root=target,
            path=target / path.relative_to(root),
            kind=kind,  # type: ignore[arg-type]
            job_id=ckpt.job_id,
            checkpoint_id=ckpt.id,
            step=ckpt.step,
            sha256=sha256,
        )

    def _fetch(self, ckpt: models.Checkpoint, tar_path: Path, progress: ProgressCallback | None) -> str:
        """Stream the archive to `tar_path`; a broken connection starts the download again (it is a GET)
        while the retry budget lasts. Returns the verified SHA-256."""
        attempt = 0
        while True:
            try:
                return self._fetch_once(ckpt, tar_path, progress)
            except errors.ConnectionError:
                if attempt >= self._c.retry.max_retries:
                    raise
                attempt += 1
                time.sleep(self._c.retry.delay(attempt, None))

    def _fetch_once(self, ckpt: models.Checkpoint, tar_path: Path, progress: ProgressCallback | None) -> str:
        digest = hashlib.sha256()
        done = 0
        response = self._c.send("GET", ckpt.download_url, stream=True)
        try:
            expected_bytes = _int_header(response, "content-length")
            with tar_path.open("wb") as out:
                for chunk in response.iter_bytes(1024 * 1024):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done, expected_bytes or 0)
                out.flush()
                os.fsync(out.fileno())
        except transport.RETRYABLE_ERRORS as err:
            raise transport.connection_error(err, self._c.base_url) from err
        finally:
            response.close()
        sha256 = digest.hexdigest()
        archive.verify(sha256, done, response.headers.get("x-content-sha256"), expected_bytes)
        return sha256


def _int_header(response: httpx.Response, name: str) -> int | None:
    with contextlib.suppress(TypeError, ValueError):
        return int(response.headers.get(name))
    return None


class Reports:
    def __init__(self, client: Client) -> None:
        self._c = client

    def get(self, job: JobRef) -> models.Report:
        """The evaluation report (avg@k and pass@k before and after, entropy against its band, gate,
        quadrants, per-step series); partial while the job runs."""
        return self._c.get(models.Report, f"/v1/jobs/{transport.job_id_of(job)}/report")

    def html(self, job: JobRef) -> str:
        response = self._c.send(
            "GET", f"/v1/jobs/{transport.job_id_of(job)}/report", params={"format": "html"}
        )
        return response.text

    def save_html(self, job: JobRef, path: str | os.PathLike[str]) -> Path:
        """Write the self-contained HTML report to `path` (written to a temp file, then renamed)."""
        target = Path(path)
        text = self.html(job)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return target


class Keys:
    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, name: str = "default") -> models.ApiKeyCreated:
        """A new key for this tenant; `.key` is the secret, shown only now."""
        response = self._c.send("POST", "/v1/api-keys", json={"name": name})
        return transport.parse(models.ApiKeyCreated, response)

    def list(self) -> list[models.ApiKey]:
        return self._c.get(models.ApiKeyList, "/v1/api-keys").data

    def revoke(self, key_id: str) -> models.ApiKey:
        """Revoke at once (409 for the tenant's last active key)."""
        return transport.parse(models.ApiKey, self._c.send("DELETE", f"/v1/api-keys/{key_id}"))
