"""Placement on the API side: which worker classes exist now, and the one call that places a job.

`Fleet.offers` is the declared classes (Settings.declared_offers) plus every live worker of the registry
(store.repository.workers: rows that beat within worker_stale_after_s), read at most every
worker_registry_cache_s; `Fleet.served_queues` is the queues of those live workers, from the same read
(the job view's "waiting: no live worker serves queue X"). `place_job` asks contract.fleet.place_job (memory per device, the class, why not)
once, with the offers and the longest prompt's bound (`prompt_tokens`, read off the task: its JSONL file or
generated examples); a CapacityError becomes a 422 `exceeds_capacity` naming the field. A registry row
whose capabilities no longer validate (a worker of another version) is skipped and logged, never a 500.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from contract import fleet as placement
from contract.catalog import PROMPT_OVERHEAD_TOKENS
from contract.fleet import CapacityError, JobPlacement, Offer, WorkerClass
from contract.spec import TrainSpec
from service.errors import Unprocessable
from service.settings import Settings
from service.storage import stored_bytes
from store import repository
from store.artifacts import ArtifactStorage
from store.database import Database
from trainer.tasks import sources

logger = logging.getLogger(__name__)

# Generated tasks: the longest prompt of this many examples (one seeded distribution; docs/SERVICE.md).
PROMPT_SAMPLE = 64
PROMPT_CACHE = 1024  # tasks whose longest prompt is remembered (the same task and seed give the same)


class Fleet:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self._lock = threading.Lock()
        # (when read, the live workers' offers, the queues some live worker serves)
        self._live: tuple[float, list[Offer], frozenset[str]] | None = None

    def offers(self) -> list[Offer]:
        return self.settings.declared_offers() + self.live_offers()

    def fresh(self) -> bool:
        """Whether live_offers and served_queues would answer from the cache (no database read)."""
        with self._lock:
            return (
                self._live is not None
                and time.monotonic() - self._live[0] < self.settings.worker_registry_cache_s
            )

    def live_offers(self) -> list[Offer]:
        return self._registry()[1]

    def served_queues(self) -> frozenset[str]:
        """The queues at least one live worker consumes (whether or not this service can read its
        capabilities): a waiting job in any other queue waits for a worker that is not there."""
        return self._registry()[2]

    def _registry(self) -> tuple[float, list[Offer], frozenset[str]]:
        ttl = self.settings.worker_registry_cache_s
        with self._lock:
            if self._live is not None and time.monotonic() - self._live[0] < ttl:
                return self._live
        stale_after_s = self.settings.worker_stale_after_s
        with self.db.transaction() as session:  # compared on the database's clock (store.repository.workers)
            rows = [(w.id, w.queue, w.capabilities) for w in repository.live_workers(session, stale_after_s)]
        live = []
        for worker_id, _queue, capabilities in rows:
            try:
                worker_class = WorkerClass.model_validate(capabilities)
            except ValidationError as err:
                logger.warning(
                    "worker %s advertises capabilities this service cannot read: %s", worker_id, err
                )
                continue
            # The label reaches tenants (estimates, capacity errors): no worker id, host name or pid.
            live.append(Offer(f"a live worker on queue {worker_class.queue!r}", worker_class, True))
        read = (time.monotonic(), live, frozenset(queue for _, queue, _ in rows))
        with self._lock:
            self._live = read
        return read


async def served_queues(fleet: Fleet) -> frozenset[str]:
    """Fleet.served_queues for an async route: from the cache inline, else the registry read in a thread."""
    return fleet.served_queues() if fleet.fresh() else await run_in_threadpool(fleet.served_queues)


def blocks(spec: TrainSpec, fleet: Fleet) -> bool:
    """Whether place_job would do I/O or real work (a registry read, a JSONL file, generating a task's
    examples): then the event loop hands it to a thread; otherwise it is arithmetic, done inline."""
    return spec.task.source == "jsonl" or not fleet.fresh() or _prompt_key(spec) not in _longest_prompts


def place_job(
    spec: TrainSpec, raw: Mapping[str, Any], fleet: Fleet, storage: ArtifactStorage
) -> JobPlacement:
    """The class and queue the job goes to, with its memory per device; else Unprocessable
    (exceeds_capacity, the field named). May block (see `blocks`)."""
    raw_dist = raw.get("distributed")
    spelled_num_processes = isinstance(raw_dist, Mapping) and "num_processes" in raw_dist
    try:
        return placement.place_job(
            spec,
            fleet.offers(),
            prompt_tokens=lambda: prompt_tokens(spec, storage),
            configs=fleet.settings.extra_model_configs,
            processes_param="spec.distributed."
            + ("num_processes" if spelled_num_processes else "processes_per_node"),
            prefer_queue=fleet.settings.training_queue,
        )
    except CapacityError as err:
        raise Unprocessable(err.message, param=err.param, code="exceeds_capacity") from None


def prompt_tokens(spec: TrainSpec, storage: ArtifactStorage) -> int:
    """An upper bound on the longest prompt in tokens: its UTF-8 bytes (each built-in tokenizer gives at most
    one token a byte) plus what the model's rendering adds (contract.catalog.PROMPT_OVERHEAD_TOKENS)."""
    task = spec.task
    template_bytes = len(task.prompt_template.replace("{prompt}", "").encode("utf-8"))
    if task.source == "jsonl":
        longest = _longest_line_bytes(storage, task.path or "")  # a prompt is inside its JSON line
    else:
        longest = _longest_generated_prompt(spec)
    plain, chat = PROMPT_OVERHEAD_TOKENS.get(spec.model.name, (0, 0))
    return longest + template_bytes + (chat if task.use_chat_template else plain)


_longest_prompts: dict[str, int] = {}
_prompts_lock = threading.Lock()


def _prompt_key(spec: TrainSpec) -> str:
    task = spec.task
    return json.dumps(
        [task.source, task.name, task.params, task.train_size, task.eval_size, spec.seed], default=str
    )


def _longest_generated_prompt(spec: TrainSpec) -> int:
    key = _prompt_key(spec)
    with _prompts_lock:
        if key in _longest_prompts:
            return _longest_prompts[key]
    task = spec.task
    size = min(PROMPT_SAMPLE, task.train_size + task.eval_size)
    try:
        examples = sources.make_examples(
            task.source, name=task.name, size=size, seed=spec.seed, params=dict(task.params)
        )
    except (ValueError, TypeError) as err:  # one example generated (job_specs); this many did not
        raise Unprocessable(str(err), param="spec.task.params", code="invalid_spec") from None
    longest = max((len(e.prompt.encode("utf-8")) for e in examples), default=0)
    with _prompts_lock:
        if len(_longest_prompts) >= PROMPT_CACHE:
            _longest_prompts.pop(next(iter(_longest_prompts)))
        _longest_prompts[key] = longest
    return longest


def _longest_line_bytes(storage: ArtifactStorage, key: str) -> int:
    longest = current = 0
    for chunk in stored_bytes(storage, key):
        *complete, rest = chunk.split(b"\n")
        for piece in complete:
            longest = max(longest, current + len(piece))
            current = 0
        current += len(rest)
    return max(longest, current)
