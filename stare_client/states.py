"""The job state machine as the client sees it, and what `jobs.wait` does in each state.

    validating → queued → running ⇄ (pausing →) paused
                          running → recovering → running     (a lost worker or a system error; retried)
                          running → cancelling → cancelled
    terminal: succeeded | failed | cancelled

| state | kind | `wait` |
|---|---|---|
| validating, queued, running, recovering | moving | keeps waiting |
| pausing | moving (towards paused) | keeps waiting |
| cancelling | moving (towards cancelled) | keeps waiting |
| paused | resting: only a resume moves it | `on_paused`: "return" (default) the job, "wait" for a resume, "raise" JobPaused |
| succeeded, failed, cancelled | terminal | returns the job |

A `recovering` job is the service's to repair (it resumes from the latest checkpoint while its retry
budget lasts, then fails), so `wait` treats it like `running`. A job that failed on a system fault may be
resumed later (`jobs.resume`); `wait` has returned by then, since `failed` is terminal until someone acts.
"""

from __future__ import annotations

from typing import Literal

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
RESTING = frozenset({"paused"})
MOVING = frozenset({"validating", "queued", "running", "pausing", "recovering", "cancelling"})
ALL_STATES = TERMINAL | RESTING | MOVING

OnPaused = Literal["return", "wait", "raise"]


def is_terminal(status: str) -> bool:
    """succeeded, failed or cancelled: the job will not change on its own, nor by any request but delete
    (and resume, for a job that failed on a system fault)."""
    return status in TERMINAL


def wait_action(status: str, on_paused: OnPaused) -> Literal["return", "wait", "raise"]:
    """What `wait` does on seeing `status`. An unknown state (a newer server) is waited on: only states the
    client knows to be final end the wait."""
    if status in TERMINAL:
        return "return"
    if status in RESTING:
        return on_paused
    return "wait"
