"""The asyncio client: `AsyncClient` has the same namespaces and methods as `stare_client.Client`, each a
coroutine (or an async iterator for lists and event streams).

    async with AsyncClient() as stare:
        job = await stare.jobs.create(spec)
        async for event in stare.jobs.events(job):
            ...
        job = await stare.jobs.wait(job, timeout=600)
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from stare_client import archive, errors, models, states, transport
from stare_client.client import DEFAULT_TIMEOUT_S, RECONNECT_FOR_S, STREAM_READ_TIMEOUT_S, RetryInfo
from stare_client.client import metrics_frame as _frame
from stare_client.config import resolve
from stare_client.transport import ProgressCallback, RetryPolicy

if TYPE_CHECKING:
    import pandas

JobRef = str | models.Job


class AsyncClient:
    """See `stare_client.Client`; the same arguments."""

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
        self.http = httpx.AsyncClient(
            base_url=conn.base_url,
            headers={"Authorization": f"Bearer {conn.api_key}", "User-Agent": transport.USER_AGENT},
            timeout=timeout_s,
        )
        self.jobs = AsyncJobs(self)
        self.files = AsyncFiles(self)
        self.checkpoints = AsyncCheckpoints(self)
        self.reports = AsyncReports(self)
        self.keys = AsyncKeys(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def send(
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
        safe = transport.retry_safe(method, headers)
        attempt = 0
        while True:
            request = self.http.build_request(
                method, path, params=params, json=json, headers=headers, content=content
            )
            try:
                response = await self.http.send(request, stream=stream)
            except transport.RETRYABLE_ERRORS as err:
                if not safe or attempt >= self.retry.max_retries:
                    raise transport.connection_error(err, self.base_url) from err
                attempt += 1
                await self._wait(method, request, attempt, None, type(err).__name__)
                continue
            if response.status_code in transport.RETRY_STATUSES and safe and attempt < self.retry.max_retries:
                await response.aclose()
                attempt += 1
                await self._wait(
                    method, request, attempt, transport.retry_after(response), f"HTTP {response.status_code}"
                )
                continue
            if response.status_code >= 400:
                if stream:
                    await response.aread()
                    await response.aclose()
                transport.raise_for_error(response)
            return response

    async def _wait(
        self, method: str, request: httpx.Request, attempt: int, retry_after_s: float | None, reason: str
    ) -> None:
        delay = self.retry.delay(attempt, retry_after_s)
        if self.on_retry is not None:
            self.on_retry(RetryInfo(method, str(request.url), attempt, delay, reason))
        await asyncio.sleep(delay)

    async def get(self, model: type[transport.T], path: str, **params: Any) -> transport.T:
        query = {k: v for k, v in params.items() if v is not None}
        return transport.parse(model, await self.send("GET", path, params=query or None))

    async def me(self) -> models.Me:
        return await self.get(models.Me, "/v1/me")

    async def models(self) -> list[models.Model]:
        return (await self.get(models.ModelList, "/v1/models")).data


class AsyncJobs:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def estimate(
        self,
        spec: dict[str, Any],
        *,
        training_file: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> models.Estimate:
        body = transport.spec_body(spec, training_file, metadata)
        return transport.parse(models.Estimate, await self._c.send("POST", "/v1/jobs/estimate", json=body))

    async def create(
        self,
        spec: dict[str, Any],
        *,
        training_file: str | None = None,
        metadata: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> models.Job:
        key = idempotency_key or transport.new_idempotency_key()
        body = transport.spec_body(spec, training_file, metadata)
        response = await self._c.send("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        return transport.parse(models.Job, response)

    async def list_page(
        self, *, status: str | None = None, after: str | None = None, limit: int = 20
    ) -> models.JobList:
        return await self._c.get(models.JobList, "/v1/jobs", status=status, after=after, limit=limit)

    async def list(self, *, status: str | None = None, page_size: int = 20) -> AsyncIterator[models.Job]:
        after: str | None = None
        while True:
            page = await self.list_page(status=status, after=after, limit=page_size)
            for job in page.data:
                yield job
            if not page.has_more or page.last_id is None:
                return
            after = page.last_id

    async def get(self, job: JobRef) -> models.Job:
        return await self._c.get(models.Job, f"/v1/jobs/{transport.job_id_of(job)}")

    async def _action(self, job: JobRef, action: str) -> models.Job:
        response = await self._c.send("POST", f"/v1/jobs/{transport.job_id_of(job)}/{action}")
        return transport.parse(models.Job, response)

    async def cancel(self, job: JobRef) -> models.Job:
        return await self._action(job, "cancel")

    async def pause(self, job: JobRef) -> models.Job:
        return await self._action(job, "pause")

    async def resume(self, job: JobRef) -> models.Job:
        return await self._action(job, "resume")

    async def delete(self, job: JobRef) -> models.Deleted:
        response = await self._c.send("DELETE", f"/v1/jobs/{transport.job_id_of(job)}")
        return transport.parse(models.Deleted, response)

    async def wait(
        self,
        job: JobRef,
        timeout: float | None = None,
        *,
        poll_s: float = 1.0,
        on_paused: states.OnPaused = "return",
        on_update: Callable[[models.Job], None] | None = None,
    ) -> models.Job:
        """See `Client.jobs.wait`."""
        job_id = transport.job_id_of(job)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = await self.get(job_id)
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
            await asyncio.sleep(pause)

    async def events(
        self, job: JobRef, *, after: int = 0, follow: bool = True, reconnect_for_s: float = RECONNECT_FOR_S
    ) -> AsyncIterator[models.Event]:
        """See `Client.jobs.events`."""
        job_id = transport.job_id_of(job)
        path = f"/v1/jobs/{job_id}/events"
        last = after
        if not follow:
            while True:
                page = await self._c.get(models.EventList, path, after=last, limit=1000)
                for event in page.data:
                    yield event
                if not page.has_more or page.last_id is None:
                    return
                last = page.last_id
        failing_since: float | None = None
        attempt = 0
        while True:
            try:
                async with contextlib.aclosing(self._stream_once(path, last)) as stream:
                    async for item in stream:
                        if item is None:
                            return
                        failing_since, attempt = None, 0
                        if item.id > last + 1:  # ids are contiguous per job: fill a gap from the pages
                            async for missing in self._between(path, last, item.id):
                                last = missing.id
                                yield missing
                        if item.id > last:
                            last = item.id
                            yield item
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
            await asyncio.sleep(self._c.retry.delay(attempt, None))

    async def _between(self, path: str, after: int, before: int) -> AsyncIterator[models.Event]:
        page = await self._c.get(models.EventList, path, after=after, limit=min(before - after - 1, 1000))
        for event in page.data:
            if event.id < before:
                yield event

    async def _stream_once(self, path: str, last: int) -> AsyncGenerator[models.Event | None, None]:
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
            response = await self._c.http.send(request, stream=True)
        except transport.RETRYABLE_ERRORS as err:
            raise transport.connection_error(err, self._c.base_url) from err
        try:
            if response.status_code >= 400:
                await response.aread()
                transport.raise_for_error(response)
            parser = transport.SSEParser()
            async for line in response.aiter_lines():
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
            await response.aclose()

    async def metrics(
        self,
        job: JobRef,
        *,
        names: builtins.list[str] | None = None,
        since_step: int = 0,
        until_step: int | None = None,
    ) -> builtins.list[models.MetricPoint]:
        path = f"/v1/jobs/{transport.job_id_of(job)}/metrics"
        rows: builtins.list[models.MetricPoint] = []
        while True:
            page = await self._c.get(
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

    async def metrics_frame(
        self, job: JobRef, *, names: builtins.list[str] | None = None
    ) -> pandas.DataFrame:
        return _frame(await self.metrics(job, names=names))


class AsyncFiles:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def upload(
        self,
        path: str | os.PathLike[str],
        *,
        purpose: str = "rl_train",
        progress: ProgressCallback | None = None,
    ) -> models.File:
        source = Path(path)
        try:
            fh = source.open("rb")
        except OSError as err:
            raise errors.StareError(f"cannot read {source}: {err.strerror}", code="file_unreadable") from err
        with fh:
            body = transport.MultipartUpload(fh, source.name, purpose, progress)
            response = await self._c.send("POST", "/v1/files", content=body.achunks(), headers=body.headers)
        return transport.parse(models.File, response)

    async def list(self, *, purpose: str | None = None, page_size: int = 20) -> AsyncIterator[models.File]:
        after: str | None = None
        while True:
            page = await self._c.get(
                models.FileList, "/v1/files", purpose=purpose, after=after, limit=page_size
            )
            for item in page.data:
                yield item
            if not page.has_more or page.last_id is None:
                return
            after = page.last_id

    async def get(self, file_id: str) -> models.File:
        return await self._c.get(models.File, f"/v1/files/{file_id}")

    async def delete(self, file_id: str) -> models.Deleted:
        return transport.parse(models.Deleted, await self._c.send("DELETE", f"/v1/files/{file_id}"))


class AsyncCheckpoints:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self, job: JobRef) -> list[models.Checkpoint]:
        path = f"/v1/jobs/{transport.job_id_of(job)}/checkpoints"
        return (await self._c.get(models.CheckpointList, path)).data

    async def get(self, job: JobRef, which: archive.Selector = "latest") -> models.Checkpoint:
        job_id = transport.job_id_of(job)
        report = await self._c.reports.get(job_id) if which == "best" else None
        return archive.select(await self.list(job_id), which, report)

    async def download(
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
        """See `Client.checkpoints.download`. Unpacking and a local merge run in a thread."""
        ckpt = await self.get(job, which)
        target = archive.target_folder(to, ckpt.job_id, ckpt.step)
        archive.check_target(target, overwrite)
        staging = archive.staging_folder(target)
        try:
            tar_path = staging / "checkpoint.tar"
            sha256 = await self._fetch(ckpt, tar_path, progress)
            root = await asyncio.to_thread(archive.safe_extract, tar_path, staging / "tree")
            tar_path.unlink()
            path, kind = await asyncio.to_thread(archive.loadable, root, merged, base_model)
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

    async def _fetch(self, ckpt: models.Checkpoint, tar_path: Path, progress: ProgressCallback | None) -> str:
        attempt = 0
        while True:
            try:
                return await self._fetch_once(ckpt, tar_path, progress)
            except errors.ConnectionError:
                if attempt >= self._c.retry.max_retries:
                    raise
                attempt += 1
                await asyncio.sleep(self._c.retry.delay(attempt, None))

    async def _fetch_once(
        self, ckpt: models.Checkpoint, tar_path: Path, progress: ProgressCallback | None
    ) -> str:
        digest = hashlib.sha256()
        done = 0
        response = await self._c.send("GET", ckpt.download_url, stream=True)
        expected_bytes: int | None = None
        with contextlib.suppress(TypeError, ValueError):
            expected_bytes = int(response.headers.get("content-length"))
        try:
            with tar_path.open("wb") as out:
                async for chunk in response.aiter_bytes(1024 * 1024):
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
            await response.aclose()
        sha256 = digest.hexdigest()
        archive.verify(sha256, done, response.headers.get("x-content-sha256"), expected_bytes)
        return sha256


class AsyncReports:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def get(self, job: JobRef) -> models.Report:
        return await self._c.get(models.Report, f"/v1/jobs/{transport.job_id_of(job)}/report")

    async def html(self, job: JobRef) -> str:
        path = f"/v1/jobs/{transport.job_id_of(job)}/report"
        return (await self._c.send("GET", path, params={"format": "html"})).text

    async def save_html(self, job: JobRef, path: str | os.PathLike[str]) -> Path:
        target = Path(path)
        text = await self.html(job)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return target


class AsyncKeys:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, name: str = "default") -> models.ApiKeyCreated:
        response = await self._c.send("POST", "/v1/api-keys", json={"name": name})
        return transport.parse(models.ApiKeyCreated, response)

    async def list(self) -> list[models.ApiKey]:
        return (await self._c.get(models.ApiKeyList, "/v1/api-keys")).data

    async def revoke(self, key_id: str) -> models.ApiKey:
        return transport.parse(models.ApiKey, await self._c.send("DELETE", f"/v1/api-keys/{key_id}"))
