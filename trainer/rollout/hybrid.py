"""The policy's two modes: training (sharded under fsdp2, in train mode) and sampling (a rollout engine
ready, the policy in eval mode). `rollout_mode` switches to sampling for one block and back:

- an engine that samples from the policy itself (HF generate): the block runs inside the strategy's
  `full_weights` (under fsdp2 every unit gathered once, not per generated token; processes make different
  numbers of generate calls, which then meet in no collective);
- an engine with its own copy of the weights (vLLM): woken, fed the strategy's `full_state` where the
  policy changed since it was last fed (one full tensor at a time: no gathered copy of the model beside
  vLLM's), and put back to sleep after the block, so the update has the device memory.

The engine's rollouts and evaluations are each one `with rollout_mode(...)` block; an optimiser step or a
restore marks the engine's copy stale (`Rollouts.policy_changed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from trainer.distributed.strategy import Strategy
from trainer.rollout.generation import RolloutEngine


class Rollouts:
    """The rollout engine of a run, and whether its copy of the weights (where it has one) is the policy's."""

    def __init__(self, strategy: Strategy, model: Any, engine: RolloutEngine) -> None:
        self.strategy, self.model, self.engine = strategy, model, engine
        self.stale = False  # an engine with its own copy builds it from the policy when it first samples

    def policy_changed(self) -> None:
        """The policy's weights changed (an optimiser step, a restore): feed them before the next rollout."""
        self.stale = True

    @contextlib.contextmanager
    def rollout_mode(self) -> Iterator[tuple[Any, RolloutEngine]]:
        """(the module to sample or score with, the engine) with the policy in sampling mode; training mode
        again after the block (see the module docstring)."""
        policy = self.strategy.policy(self.model)
        policy.eval()
        try:
            if self.engine.owns_weights:
                if self.stale:
                    self.engine.load_weights(self.strategy.full_state(self.model))
                    self.stale = False
                self.engine.wake()
                try:
                    yield policy, self.engine
                finally:
                    self.engine.sleep()
            else:
                with self.strategy.full_weights(self.model) as full:
                    yield full, self.engine
        finally:
            policy.train()
