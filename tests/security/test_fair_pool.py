"""Issue 44, R4: one tenant cannot hold the shared task-check pool.

Before, the pool was one semaphore: two tenants' six `puzzle24 {min_value: 1, max_value: 1}` estimates
(each killed at its budget) made a third tenant's trivial estimate wait 38.6 s behind them. Now a tenant
runs one check at a time, its further checks wait in its own bounded queue (a 429 past it), and a freed
child goes to the waiting tenant served least recently (service/fairness.py, service/offload.py).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable

import anyio
import pytest
from fastapi.testclient import TestClient

from service.fairness import FairGate, QueueFull
from service.offload import BudgetExceeded, ChildPool
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC
from tests.service.test_errors import assert_error

HANG = ("reasoning_gym", "puzzle24", 0, {"min_value": 1, "max_value": 1})  # never generates
QUICK = ("reasoning_gym", "chain_sum", 0, {})


def test_the_gate_runs_one_call_per_tenant_bounds_its_queue_and_serves_the_least_recent_first() -> None:
    async def main() -> list[str]:
        gate = FairGate(slots=2, queue=2)
        order: list[str] = []
        release = anyio.Event()

        async def call(tenant: str, name: str) -> None:
            async with gate.hold(tenant):
                order.append(name)
                await release.wait()

        async with anyio.create_task_group() as group:
            for name in ("a1", "a2", "a3", "b1", "b2"):
                group.start_soon(call, name[0], name)
                await anyio.sleep(0.01)
            assert order == ["a1", "b1"] and gate.running == 2  # one each; a2, a3 and b2 wait
            assert gate.waiting("a") == 2
            with pytest.raises(QueueFull):  # a's queue is full: refused at once, nothing queued
                async with gate.hold("a"):
                    pass
            group.start_soon(call, "c", "c1")  # a newcomer
            await anyio.sleep(0.01)
            assert order == ["a1", "b1"]
            release.set()
        return order

    order = anyio.run(main)
    # c, never served, goes before a's and b's second calls; a and b then alternate
    assert order[:3] == ["a1", "b1", "c1"] and set(order[3:5]) == {"a2", "b2"} and order[5] == "a3"


def test_a_cancelled_waiter_leaves_the_queue_and_a_granted_one_gives_its_slot_back() -> None:
    async def main() -> None:
        gate = FairGate(slots=1, queue=4)
        async with gate.hold("a"):
            with anyio.move_on_after(0.05):
                async with gate.hold("b"):
                    raise AssertionError("b cannot run while a holds the only slot")
            assert gate.waiting("b") == 0
        assert gate.running == 0
        async with gate.hold("b"):
            assert gate.running == 1

    anyio.run(main)


@pytest.mark.parametrize("workers", [2, 3])
def test_two_tenants_hanging_checks_delay_only_themselves(workers: int) -> None:
    """The finding's load on the real pool: tenants a and b queue three hanging generations each; c's
    quick one runs before any of their second ones (2 children: after the first budget; 3: at once)."""
    budget = 2.0
    pool = ChildPool(workers=workers, seconds=budget, memory_mb=1024, queue=4)
    pool.open()
    finished: dict[str, float] = {}

    async def run(tenant: str, name: str, args: tuple[object, ...], start: float) -> None:
        with contextlib.suppress(BudgetExceeded):
            await pool.run("generate", *args, phase="spec.task.params", tenant=tenant)
        finished[name] = time.monotonic() - start

    async def main() -> None:
        warm = [pool.run("generate", *QUICK, phase="p", tenant=f"w{i}") for i in range(workers)]
        async with anyio.create_task_group() as group:  # every child started and imported before timing
            for call in warm:
                group.start_soon(lambda call=call: call)
        start = time.monotonic()
        async with anyio.create_task_group() as group:
            for index in range(3):
                for tenant in ("a", "b"):
                    group.start_soon(run, tenant, f"{tenant}{index}", HANG, start)
                    await anyio.sleep(0.02)
            group.start_soon(run, "c", "c", QUICK, start)

    try:
        anyio.run(main)
    finally:
        pool.close()
    assert finished["c"] < min(finished[name] for name in ("a1", "a2", "b1", "b2")), finished
    if workers == 3:
        assert finished["c"] < budget, finished  # a free child: c never waits for a's or b's
    # one at a time per tenant: a's three hangs end a budget apart at least
    a_ends = sorted(finished[name] for name in ("a0", "a1", "a2"))
    assert all(later - earlier >= budget * 0.9 for earlier, later in itertools.pairwise(a_ends)), a_ends


def test_a_tenants_full_queue_is_a_429_naming_the_limit(
    make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    import concurrent.futures

    client = make_client(task_check_seconds=3.0, task_check_queue_per_tenant=1, task_check_processes=2)
    tenant, other = make_tenant(), make_tenant()
    spec = {
        **TINY_SPEC,
        "task": {"source": "reasoning_gym", "name": "puzzle24", "params": {"min_value": 1, "max_value": 1}},
    }

    def estimate(who: TenantKey) -> object:
        return client.post("/v1/jobs/estimate", json={"spec": spec}, headers=who.headers)

    with concurrent.futures.ThreadPoolExecutor(4) as executor:
        running = executor.submit(estimate, tenant)
        time.sleep(0.5)
        queued = executor.submit(estimate, tenant)
        time.sleep(0.5)
        refused = estimate(tenant)  # one running, one waiting: the third is refused at once
        assert_error(refused, 429, "task_checks_busy", None)
        assert refused.headers["Retry-After"] == "5"
        assert_error(estimate(other), 422, "budget_exceeded", "spec.task.params")  # another tenant runs
        for future in (running, queued):
            assert_error(future.result(timeout=60), 422, "budget_exceeded", "spec.task.params")
