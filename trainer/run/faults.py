"""Fault injection for the worker's, CLI's and launcher's tests, from environment variables the engine reads
at fixed points of a step (the worker passes them through to the trainer: worker/supervisor.py):

- STARE_INJECT_NAN_STEP=k: the loss at step k becomes NaN (the engine's non-finite exit);
- STARE_INJECT_CRASH_STEP=k: step k raises (every attempt that reaches it: a crash loop);
- STARE_STEP_DELAY_S=s: sleep s seconds after each step (a slow model, for stop and lease tests);
- STARE_LOAD_DELAY_S=s: sleep s seconds before the model loads (a slow load, for a cancel while loading).

Unset, each is a no-op. Nothing else in the trainer reads them.
"""

from __future__ import annotations

import os
import time

NAN_STEP_ENV = "STARE_INJECT_NAN_STEP"
CRASH_STEP_ENV = "STARE_INJECT_CRASH_STEP"
STEP_DELAY_ENV = "STARE_STEP_DELAY_S"
LOAD_DELAY_ENV = "STARE_LOAD_DELAY_S"


def nan_loss_at(step: int) -> bool:
    """Whether the loss of `step` is to be made NaN."""
    value = os.environ.get(NAN_STEP_ENV)
    return value is not None and int(value) == step


def crash_at(step: int) -> None:
    """Raises at `step` where STARE_INJECT_CRASH_STEP names it."""
    value = os.environ.get(CRASH_STEP_ENV)
    if value is not None and int(value) == step:
        raise RuntimeError(f"injected crash at step {step} ({CRASH_STEP_ENV})")


def after_step() -> None:
    """The slow-model delay after each step, where STARE_STEP_DELAY_S sets one."""
    delay = os.environ.get(STEP_DELAY_ENV)
    if delay:
        time.sleep(float(delay))


def before_load() -> None:
    """The slow-load delay before the model loads, where STARE_LOAD_DELAY_S sets one."""
    delay = os.environ.get(LOAD_DELAY_ENV)
    if delay:
        time.sleep(float(delay))
