"""The Celery app of the training workers.

Choices for long jobs (see SERVICE.md, "Queue rules"):
- Early ack (Celery's default) with a database lease, not late ack: with Redis, an unacknowledged task is
  re-delivered after visibility_timeout even while it still runs, which would start a second copy of an
  hours-long job. The database row is the truth; the broker only rings the doorbell. A message lost
  after the early ack (worker killed) is repaired by the sweeper: the job's heartbeat goes stale and it is
  moved to recovering and re-sent.
- worker_prefetch_multiplier = 1 and the solo pool: one job per worker process, no message waiting behind a
  running job on a busy worker. Run one worker process per GPU (CUDA_VISIBLE_DEVICES), more on more hosts.
- The worker never touches CUDA: the trainer runs as a supervised child process.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery

from store.database import Database
from store.settings import broker_transport_options
from worker.broker import queue_depth_reader
from worker.settings import WorkerSettings
from worker.training import run_job

SWEEP_TASK = "worker.sweep"


def create_celery(settings: WorkerSettings) -> Celery:
    app = Celery("stare-worker", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_ignore_result=True,
        task_default_queue=settings.training_queue,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    if settings.broker_url.startswith("filesystem://"):  # the embedded mode: messages are files
        app.conf.broker_transport_options = broker_transport_options(
            settings.broker_url,
            str(settings.broker_folder) if settings.broker_folder else None,
            settings.broker_timeout_s,
        )
    state: dict[str, Any] = {}
    lock = threading.Lock()

    def database() -> Database:
        with lock:
            if "db" not in state:
                state["db"] = Database(settings.database_url, pool_size=4)
            db: Database = state["db"]
            return db

    def resend(job_id: str, queue: str) -> None:
        app.send_task(settings.train_task_name, args=[job_id], queue=queue)

    @app.task(name=settings.train_task_name)
    def train_job(job_id: str) -> str:
        return run_job(job_id, settings, database(), resend)

    app.conf.stare_resend = resend
    app.conf.stare_queue_depth = queue_depth_reader(settings.broker_url)
    app.conf.stare_database = database
    return app
