"""The client's resources, each operation written once (stare_client.driver): jobs, files, checkpoints,
reports and keys. `Client` runs them blocking, `AsyncClient` with `await`; the signatures and docstrings
here are those of both.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic

import httpx
from pydantic import BaseModel

from stare_client import archive, errors, models, states, transport
from stare_client.driver import (
    Bindable,
    Blocking,
    Close,
    Effect,
    Item,
    Lines,
    ListingOp,
    M,
    NextLine,
    Op,
    Pump,
    ReadBody,
    Send,
    Sleep,
    listing,
    operation,
)
from stare_client.transport import ProgressCallback
from stare_client.unpack import ArchiveSink

if TYPE_CHECKING:
    import pandas

    from stare_client.client import BaseClient

JobRef = str | models.Job
DEFAULT_TIMEOUT_S = 30.0
STREAM_READ_TIMEOUT_S = 60.0  # the server sends a keep-alive every 15 s; silence for longer is a dead link
RECONNECT_FOR_S = 120.0  # an event stream gives up after this long without getting through


@dataclass
class _Cursor:
    """Where an event stream stands: the last id delivered, and whether a connection delivered any."""

    last: int
    delivered: bool = False


class Resource(Bindable[M], Generic[M]):
    def __init__(self, client: BaseClient[M]) -> None:
        self._c: BaseClient[M] = client
        self._driver = client._driver

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._c.base_url}>"

    def _pages(
        self, model: type[BaseModel], path: str, *, after: Any, limit: int, **filters: Any
    ) -> ListingOp[Any]:
        """Every item of a cursor-paged list (`data`, `has_more`, `last_id`), page by page."""
        while True:
            page: Any = yield from self._c.get.op(model, path, after=after, limit=limit, **filters)
            for item in page.data:
                yield Item(item)
            if not page.has_more or page.last_id is None:
                return
            after = page.last_id


class Jobs(Resource[M]):
    @operation
    def estimate(
        self,
        spec: dict[str, Any],
        *,
        training_file: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> Op[models.Estimate]:
        """Validate a spec and estimate its cost, without creating the job."""
        body = transport.spec_body(spec, training_file, metadata)
        response = yield from self._c.send.op("POST", "/v1/jobs/estimate", json=body)
        return transport.parse(models.Estimate, response)

    @operation
    def create(
        self,
        spec: dict[str, Any],
        *,
        training_file: str | None = None,
        metadata: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Op[models.Job]:
        """Submit a job. The Idempotency-Key (generated when not given) makes the request safe to retry: a
        repeat returns the job the first one created, never a second job."""
        key = idempotency_key or transport.new_idempotency_key()
        body = transport.spec_body(spec, training_file, metadata)
        response = yield from self._c.send.op("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        return transport.parse(models.Job, response)

    @operation
    def list_page(
        self, *, status: str | None = None, after: str | None = None, limit: int = 20
    ) -> Op[models.JobList]:
        return self._c.get.op(models.JobList, "/v1/jobs", status=status, after=after, limit=limit)

    @listing
    def list(self, *, status: str | None = None, page_size: int = 20) -> ListingOp[models.Job]:
        """Every job of the tenant, newest first (optionally only those in `status`), page by page."""
        return self._pages(models.JobList, "/v1/jobs", after=None, limit=page_size, status=status)

    @operation
    def get(self, job: JobRef) -> Op[models.Job]:
        return self._c.get.op(models.Job, f"/v1/jobs/{transport.job_id_of(job)}")

    def _action(self, job: JobRef, action: str) -> Op[models.Job]:
        response = yield from self._c.send.op("POST", f"/v1/jobs/{transport.job_id_of(job)}/{action}")
        return transport.parse(models.Job, response)

    @operation
    def cancel(self, job: JobRef) -> Op[models.Job]:
        """Cancel at once (not running) or at the next step (running: `cancelling`, then `cancelled`)."""
        return self._action(job, "cancel")

    @operation
    def pause(self, job: JobRef) -> Op[models.Job]:
        """Pause: at once when queued; a running job checkpoints first (`pausing`, then `paused`)."""
        return self._action(job, "pause")

    @operation
    def resume(self, job: JobRef) -> Op[models.Job]:
        """Queue a paused job (or one that failed on a system fault) again, from its latest checkpoint."""
        return self._action(job, "resume")

    @operation
    def delete(self, job: JobRef) -> Op[models.Deleted]:
        """Delete a finished job with its events, metrics, checkpoints and files (409 before it finished)."""
        response = yield from self._c.send.op("DELETE", f"/v1/jobs/{transport.job_id_of(job)}")
        return transport.parse(models.Deleted, response)

    @operation
    def wait(
        self,
        job: JobRef,
        timeout: float | None = None,
        *,
        poll_s: float = 1.0,
        on_paused: states.OnPaused = "return",
        on_update: Callable[[models.Job], None] | None = None,
    ) -> Op[models.Job]:
        """Poll the job until it is terminal (succeeded, failed, cancelled) and return it; the states and
        what wait does in each are in stare_client.states. `paused` returns it (default), waits for a
        resume, or raises JobPaused (`on_paused`). WaitTimeout after `timeout` seconds (None: no limit).
        `on_update(job)` sees every poll's answer."""
        job_id = transport.job_id_of(job)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = yield from self.get.op(job_id)
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
            yield Sleep(poll_s if deadline is None else min(poll_s, max(deadline - time.monotonic(), 0.0)))

    @listing
    def events(
        self, job: JobRef, *, after: int = 0, follow: bool = True, reconnect_for_s: float = RECONNECT_FOR_S
    ) -> ListingOp[models.Event]:
        """The job's events, oldest first, each once. `follow` (default): a live stream (SSE) that ends when
        the job has finished; a dropped connection or a restarted server is reconnected with Last-Event-ID,
        so no event is lost or repeated (the ids ascend strictly). Gives up (ConnectionError) after
        `reconnect_for_s` seconds without getting through. `follow=False`: the events so far, page by page."""
        job_id = transport.job_id_of(job)
        path = f"/v1/jobs/{job_id}/events"
        last = after
        if not follow:
            yield from self._pages(models.EventList, path, after=last, limit=1000)
            return
        cursor = _Cursor(last)
        failing_since: float | None = None
        attempt = 0
        while True:
            try:
                if (yield from self._follow_once(path, cursor)):
                    return
                reason = "the stream closed before its end"
            except transport.RETRYABLE_ERRORS as err:
                reason = transport.connection_error(err, self._c.base_url).message
            except errors.ConnectionError as err:
                reason = err.message
            except (errors.ServerUnavailable, errors.RateLimited) as err:
                reason = str(err)
            if cursor.delivered:
                failing_since, attempt, cursor.delivered = None, 0, False
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > reconnect_for_s:
                raise errors.ConnectionError(
                    f"event stream of {job_id} lost for {reconnect_for_s:g} s: {reason}", code="stream_lost"
                )
            attempt += 1
            yield Sleep(self._c.retry.delay(attempt, None))

    def _follow_once(self, path: str, cursor: _Cursor) -> Generator[Effect | Item[models.Event], Any, bool]:
        """One connection of the stream: its events past the cursor; True once the `end` message came."""
        response = yield from self._open_stream(path, cursor.last)
        try:
            ended = yield from self._read_stream(path, cursor, response)
        except Exception:  # not GeneratorExit: a caller that stops iterating leaves closing to the driver
            yield Close(response)
            raise
        yield Close(response)
        return ended

    def _read_stream(
        self, path: str, cursor: _Cursor, response: httpx.Response
    ) -> Generator[Effect | Item[models.Event], Any, bool]:
        lines = yield Lines(response)
        parser = transport.SSEParser()
        while (line := (yield NextLine(lines))) is not None:
            message = parser.feed_line(line)
            if message is None:
                continue
            if message.event == "end":  # every event was sent
                return True
            data = transport.decode_event(message)
            if data is None:
                continue
            event = models.Event.model_validate(data)
            cursor.delivered = True
            if event.id > cursor.last + 1:  # ids are contiguous per job: fill a gap from the pages
                for missing in (yield from self._between(path, cursor.last, event.id)):
                    cursor.last = missing.id
                    yield Item(missing)
            if event.id > cursor.last:  # a reconnect never repeats one
                cursor.last = event.id
                yield Item(event)
        return False

    def _between(self, path: str, after: int, before: int) -> Op[builtins.list[models.Event]]:
        page = yield from self._c.get.op(
            models.EventList, path, after=after, limit=min(before - after - 1, 1000)
        )
        return [event for event in page.data if event.id < before]

    def _open_stream(self, path: str, last: int) -> Op[httpx.Response]:
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}  # lines bounded on the wire
        if last:
            headers["Last-Event-ID"] = str(last)
        request = self._c.http.build_request(
            "GET",
            path,
            params={"stream": "true"},
            headers=headers,
            timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S),
        )
        response: httpx.Response = yield Send(request, stream=True)
        if response.status_code >= 400:
            yield ReadBody(response)
            transport.raise_for_error(response)
        return response

    @operation
    def metrics(
        self,
        job: JobRef,
        *,
        names: builtins.list[str] | None = None,
        since_step: int = 0,
        until_step: int | None = None,
    ) -> Op[builtins.list[models.MetricPoint]]:
        """Per-step metrics, oldest first (every page), optionally only `names`."""
        path = f"/v1/jobs/{transport.job_id_of(job)}/metrics"
        rows: builtins.list[models.MetricPoint] = []
        while True:
            page = yield from self._c.get.op(
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

    @operation
    def metrics_frame(self, job: JobRef, *, names: builtins.list[str] | None = None) -> Op[pandas.DataFrame]:
        """The metrics as a pandas DataFrame indexed by step, one column per metric (needs pandas)."""
        return metrics_frame((yield from self.metrics.op(job, names=names)))


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


class Files(Resource[M]):
    @operation
    def upload(
        self,
        path: str | os.PathLike[str],
        *,
        purpose: str = "rl_train",
        progress: ProgressCallback | None = None,
    ) -> Op[models.File]:
        """Upload a JSONL dataset (`{"prompt", "answer"[, "meta"]}` per line). `progress(sent, total)` after
        each chunk. Not retried (an upload carries no idempotency key)."""
        source = Path(path)
        try:
            fh = source.open("rb")
        except OSError as err:
            raise errors.StareError(f"cannot read {source}: {err.strerror}", code="file_unreadable") from err
        with fh:
            body = transport.MultipartUpload(fh, source.name, purpose, progress)
            response = yield from self._c.send.op("POST", "/v1/files", content=body, headers=body.headers)
        return transport.parse(models.File, response)

    @listing
    def list(self, *, purpose: str | None = None, page_size: int = 20) -> ListingOp[models.File]:
        return self._pages(models.FileList, "/v1/files", after=None, limit=page_size, purpose=purpose)

    @operation
    def get(self, file_id: str) -> Op[models.File]:
        return self._c.get.op(models.File, f"/v1/files/{file_id}")

    @operation
    def delete(self, file_id: str) -> Op[models.Deleted]:
        response = yield from self._c.send.op("DELETE", f"/v1/files/{file_id}")
        return transport.parse(models.Deleted, response)


class Checkpoints(Resource[M]):
    @operation
    def list(self, job: JobRef) -> Op[builtins.list[models.Checkpoint]]:
        """The job's checkpoints, oldest first, each with the training metrics of its step."""
        path = f"/v1/jobs/{transport.job_id_of(job)}/checkpoints"
        return (yield from self._c.get.op(models.CheckpointList, path)).data

    @operation
    def get(self, job: JobRef, which: archive.Selector = "latest") -> Op[models.Checkpoint]:
        """`which`: "latest", "best" (highest held-out avg@k), a step, or a checkpoint id."""
        job_id = transport.job_id_of(job)
        report = (yield from self._c.reports.get.op(job_id)) if which == "best" else None
        return archive.select((yield from self.list.op(job_id)), which, report)

    @operation
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
        model_only: bool = False,
    ) -> Op[archive.DownloadedCheckpoint]:
        """Download, verify (SHA-256 and size) and unpack a checkpoint into `to` (default
        ./<job>-step-NNNNNN); returns where `from_pretrained` loads it (`.path`). For a LoRA job that is the
        adapter, or with `merged=True` the merged model (stare_client.archive says how). The folder appears
        under its name only once complete; an interrupted or refused download leaves none. The archive is
        held to the client's `archive_limits` (stare_client.unpack) and fetched only from the API's origin
        or one of `download_origins`. Unpacking and a local merge run in a thread on the async client.
        `model_only=True` fetches only what loads (model/, and adapter/ for LoRA): no training state, which
        the server keeps only where a resume needs it (docs/CLIENT.md, "What a checkpoint holds")."""
        ckpt = yield from self.get.op(job, which)
        target = archive.target_folder(to, ckpt.job_id, ckpt.step)
        archive.check_target(target, overwrite)
        staging = archive.staging_folder(target)
        try:
            tar_path = staging / "checkpoint.tar"
            sha256 = yield from self._fetch(ckpt, tar_path, progress, model_only)
            limits, announced = self._c.archive_limits, ckpt.bytes
            root: Path = yield Blocking(
                lambda: archive.safe_extract(
                    tar_path, staging / "tree", limits=limits, announced_bytes=announced
                )
            )
            tar_path.unlink()
            path, kind = yield Blocking(lambda: archive.loadable(root, merged, base_model))
            archive.publish(root, target, overwrite)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return archive.DownloadedCheckpoint(
            root=target,
            path=target / path.relative_to(root),
            kind=kind,
            job_id=ckpt.job_id,
            checkpoint_id=ckpt.id,
            step=ckpt.step,
            sha256=sha256,
        )

    def _fetch(
        self, ckpt: models.Checkpoint, tar_path: Path, progress: ProgressCallback | None, model_only: bool
    ) -> Op[str]:
        """Stream the archive to `tar_path`; a broken connection starts the download again (it is a GET)
        while the retry budget lasts. Returns the verified SHA-256."""
        attempt = 0
        while True:
            try:
                return (yield from self._fetch_once(ckpt, tar_path, progress, model_only))
            except errors.ConnectionError:
                if attempt >= self._c.retry.max_retries:
                    raise
                attempt += 1
                yield Sleep(self._c.retry.delay(attempt, None))

    def _fetch_once(
        self, ckpt: models.Checkpoint, tar_path: Path, progress: ProgressCallback | None, model_only: bool
    ) -> Op[str]:
        policy = self._c.download_policy
        url = policy.resolve(ckpt.download_url)
        params = {"model_only": "true"} if model_only else None
        for _ in range(transport.MAX_REDIRECTS + 1):
            response = yield from self._c.send.op("GET", url, stream=True, params=params)
            location = transport.redirect_target(response)
            if location is None:
                break
            yield Close(response)
            url, params = policy.resolve(location, via=response.url), None  # the redirect names its own query
        else:
            raise errors.UntrustedOrigin(
                f"the download redirected more than {transport.MAX_REDIRECTS} times",
                code="too_many_redirects",
            )
        expected_bytes = _int_header(response, "content-length")
        try:
            sink = ArchiveSink(tar_path, expected_bytes, self._c.archive_limits, progress)
        except errors.StareError:
            yield Close(response)
            raise
        try:
            yield Pump(response, sink.write)
            sha256 = sink.finish()
        except transport.RETRYABLE_ERRORS as err:
            raise transport.connection_error(err, self._c.base_url) from err
        finally:
            sink.close()
        archive.verify(sha256, sink.done_bytes, response.headers.get("x-content-sha256"), expected_bytes)
        # The listing's digest is the whole folder's; a model-only archive is checked against its header.
        if not model_only and ckpt.sha256 is not None and ckpt.sha256.lower() != sha256:
            raise errors.ChecksumMismatch(
                f"SHA-256 of the download is {sha256}, the checkpoint listing says {ckpt.sha256}",
                code="checksum_mismatch",
            )
        return sha256


def _int_header(response: httpx.Response, name: str) -> int | None:
    with contextlib.suppress(TypeError, ValueError):
        return int(response.headers.get(name))
    return None


class Reports(Resource[M]):
    @operation
    def get(self, job: JobRef) -> Op[models.Report]:
        """The evaluation report (avg@k and pass@k before and after, entropy against its band, gate,
        quadrants, per-step series); partial while the job runs."""
        return self._c.get.op(models.Report, f"/v1/jobs/{transport.job_id_of(job)}/report")

    @operation
    def html(self, job: JobRef) -> Op[str]:
        path = f"/v1/jobs/{transport.job_id_of(job)}/report"
        return (yield from self._c.send.op("GET", path, params={"format": "html"})).text

    @operation
    def save_html(self, job: JobRef, path: str | os.PathLike[str]) -> Op[Path]:
        """Write the self-contained HTML report to `path` (written to a temp file, then renamed)."""
        target = Path(path)
        text = yield from self.html.op(job)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return target


class Keys(Resource[M]):
    @operation
    def create(self, name: str = "default") -> Op[models.ApiKeyCreated]:
        """A new key for this tenant; `.key` is the secret, shown only now."""
        response = yield from self._c.send.op("POST", "/v1/api-keys", json={"name": name})
        return transport.parse(models.ApiKeyCreated, response)

    @operation
    def list(self) -> Op[builtins.list[models.ApiKey]]:
        return (yield from self._c.get.op(models.ApiKeyList, "/v1/api-keys")).data

    @operation
    def revoke(self, key_id: str) -> Op[models.ApiKey]:
        """Revoke at once (409 for the tenant's last active key)."""
        response = yield from self._c.send.op("DELETE", f"/v1/api-keys/{key_id}")
        return transport.parse(models.ApiKey, response)
