"""What one API process holds: settings, database, artifact storage, job queue, rate limiter, telemetry, and
the child processes that generate tasks and dry-run verifiers (service/offload.py).

Built by create_app from a Settings object (nothing is built at import time) and closed on shutdown.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.body_checks import BodyChecks
from service.fleet import Fleet
from service.grading import GraderGate
from service.job_specs import model_catalogue
from service.offload import ChildPool
from service.principals import PrincipalCache
from service.queue import CeleryJobQueue, JobQueue, RecordingJobQueue
from service.ratelimit import RateLimiter, RedisTokenBucketLimiter, TokenBucketLimiter
from service.settings import Settings
from service.telemetry import Telemetry
from store.artifacts import ArtifactStorage, open_artifact_storage
from store.database import Database


@dataclass
class Services:
    settings: Settings
    db: Database
    storage: ArtifactStorage
    queue: JobQueue
    limiter: RateLimiter  # per API key
    tenant_limiter: RateLimiter  # per tenant, over all its keys
    address_limiter: RateLimiter  # per source address, for requests that prove no key (yet)
    principals: PrincipalCache
    telemetry: Telemetry
    models: dict[str, tuple[str, bool]]
    fleet: Fleet  # the worker classes placement chooses from (service/fleet.py)
    offload: ChildPool  # task generation and verifier dry runs, off the event loop and out of this process
    body_checks: BodyChecks  # large JSON bodies' checks, in other processes (service/body_checks.py)
    graders: GraderGate  # tenant graders' runs: off the event loop, bounded per tenant (service/grading.py)

    @classmethod
    def build(cls, settings: Settings) -> Services:
        db = Database(settings.database_url, pool_size=settings.database_pool_size)
        queue: JobQueue
        if settings.queue_backend == "celery":
            queue = CeleryJobQueue(
                settings.broker_url,
                settings.train_task_name,
                timeout_s=settings.broker_timeout_s,
                broker_folder=str(settings.broker_folder) if settings.broker_folder else None,
            )
        else:
            queue = RecordingJobQueue()
        return cls(
            settings=settings,
            db=db,
            storage=open_artifact_storage(settings.artifact_root),
            queue=queue,
            limiter=_rate_limiter(settings, settings.rate_limit_per_second, settings.rate_limit_burst),
            tenant_limiter=_rate_limiter(
                settings,
                settings.tenant_rate_limit_per_second,
                settings.tenant_rate_limit_burst,
                prefix="stare:ratelimit:tenant:",
            ),
            address_limiter=_rate_limiter(
                settings,
                settings.address_rate_limit_per_second,
                settings.address_rate_limit_burst,
                prefix="stare:ratelimit:address:",
            ),
            principals=PrincipalCache(settings.auth_cache_ttl_s),
            telemetry=Telemetry(db),
            models=model_catalogue(settings.extra_models),
            fleet=Fleet(settings, db),
            offload=ChildPool(
                workers=settings.task_check_processes,
                seconds=settings.task_check_seconds,
                memory_mb=settings.task_check_memory_mb,
                queue=settings.task_check_queue_per_tenant,
                confine=settings.task_check_isolation,
            ),
            body_checks=BodyChecks(
                processes=settings.body_check_processes, max_values=settings.max_json_values
            ),
            graders=GraderGate(settings.grader_runs_per_tenant, settings.grader_runs_total),
        )

    def enqueue(self, job_id: str, queue: str) -> bool:
        """Ring the doorbell for a committed job; a failure is counted, not raised (the sweeper re-sends)."""
        sent = self.queue.enqueue(job_id, queue)
        if not sent:
            self.telemetry.enqueue_failures.inc()
        return sent

    async def enqueue_async(self, job_id: str, queue: str) -> bool:
        """`enqueue` from the event loop (POST /v1/jobs on PostgreSQL)."""
        sent = await self.queue.enqueue_async(job_id, queue)
        if not sent:
            self.telemetry.enqueue_failures.inc()
        return sent

    async def aclose(self) -> None:
        await self.limiter.aclose()
        await self.tenant_limiter.aclose()
        await self.address_limiter.aclose()
        await self.queue.aclose()
        await self.db.aclose()

    def close(self) -> None:
        self.offload.close()
        self.body_checks.close()
        self.queue.close()
        self.db.dispose()


def _rate_limiter(
    settings: Settings, rate: float, burst: int, *, prefix: str = "stare:ratelimit:"
) -> RateLimiter:
    in_process = TokenBucketLimiter(rate, burst)
    if settings.rate_limit_backend == "memory":
        return in_process
    return RedisTokenBucketLimiter(
        settings.rate_limit_redis_url or settings.broker_url,
        rate,
        burst,
        timeout_s=settings.broker_timeout_s,
        prefix=prefix,
        fallback=in_process,
    )
