"""The doorbell: tell the workers a job id is ready, by Celery task name (the service never imports worker).

Enqueue only after the job row is committed. A failed send is logged and counted, not raised: the job is
safe in the database and the worker's sweeper re-sends queued jobs nobody claimed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)


def broker_transport_options(broker_url: str, broker_folder: str | None, timeout_s: float) -> dict[str, Any]:
    """Transport options shared by the API (producer) and the workers (consumers): socket timeouts for
    Redis, or the message folders of Celery's filesystem transport (the embedded mode, no Redis)."""
    if broker_url.startswith("filesystem://"):
        if not broker_folder:
            raise ValueError("broker_url filesystem:// needs broker_folder (STARE_BROKER_FOLDER)")
        root = Path(broker_folder)
        for sub in ("queue", "processed", "control"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(root / "queue"),
            "data_folder_out": str(root / "queue"),
            "processed_folder": str(root / "processed"),
            "store_processed": False,
            "control_folder": str(root / "control"),
        }
    return {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}


class JobQueue(Protocol):
    def enqueue(self, job_id: str, queue: str) -> bool: ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


class CeleryJobQueue:
    """Sends `task_name(job_id)` to a queue on the broker. The Celery app is built on first use."""

    def __init__(
        self, broker_url: str, task_name: str, *, timeout_s: float = 2.0, broker_folder: str | None = None
    ) -> None:
        self.broker_url = broker_url
        self.broker_folder = broker_folder
        self.task_name = task_name
        self.timeout_s = timeout_s
        self._app: Any = None
        self._lock = threading.Lock()

    def _celery(self) -> Any:
        with self._lock:
            if self._app is None:
                import celery

                app = celery.Celery("stare-service", broker=self.broker_url, set_as_current=False)
                app.conf.update(
                    broker_connection_timeout=self.timeout_s,
                    broker_connection_retry_on_startup=False,
                    broker_transport_options=broker_transport_options(
                        self.broker_url, self.broker_folder, self.timeout_s
                    ),
                    task_ignore_result=True,
                )
                self._app = app
            return self._app

    def enqueue(self, job_id: str, queue: str) -> bool:
        try:
            self._celery().send_task(
                self.task_name,
                args=[job_id],
                queue=queue,
                retry=True,
                retry_policy={
                    "max_retries": 1,
                    "interval_start": 0,
                    "interval_step": 0.2,
                    "interval_max": 0.2,
                },
            )
        except Exception:  # the broker is a doorbell: a lost ring is repaired by the sweeper
            logger.exception("could not enqueue job %s on %s; the sweeper will re-send it", job_id, queue)
            return False
        return True

    def ping(self) -> None:
        with self._celery().connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=self.timeout_s)

    def close(self) -> None:
        with self._lock:
            if self._app is not None:
                self._app.close()
                self._app = None


@dataclass
class RecordingJobQueue:
    """Keeps (job_id, queue) in memory instead of sending: for tests about something other than the queue."""

    sent: list[tuple[str, str]] = field(default_factory=list)

    def enqueue(self, job_id: str, queue: str) -> bool:
        self.sent.append((job_id, queue))
        return True

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None
