"""The switch between training and sampling (trainer.rollout.hybrid.rollout_mode), on a recording engine: an engine
with its own weights is woken, fed the policy's full state only when the policy changed, and put back to
sleep even when the block fails; an engine on the policy samples inside the strategy's full weights. And
vLLM's device share (trainer.rollout.vllm_engine.memory_fraction, rollout.gpu_memory_fraction). No vLLM needed.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch
from pydantic import ValidationError

from contract.distributed import DistributedSpec
from contract.spec import TrainSpec
from trainer.distributed.strategy import make_strategy
from trainer.models import build_tiny_arith
from trainer.rollout.generation import HFGenerate
from trainer.rollout.hybrid import Rollouts
from trainer.rollout.vllm_engine import MEMORY_FRACTION_BOUNDS, MEMORY_MARGIN, memory_fraction


class Recording:
    """A rollout engine with its own copy of the weights that records what it is asked to do."""

    gives_pi_old = False
    owns_weights = True

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.loaded: dict[str, torch.Tensor] = {}

    def wake(self) -> None:
        self.calls.append("wake")

    def sleep(self) -> None:
        self.calls.append("sleep")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.calls.append("load")
        self.loaded = {name: tensor.clone() for name, tensor in weights}


def _rollouts(engine):  # type: ignore[no-untyped-def]
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() != 1:
        pytest.skip("needs a lone process")
    model, tokenizer = build_tiny_arith(seed=0)
    strategy = make_strategy(DistributedSpec(), torch.device("cpu"), 1)
    prepared = strategy.prepare(model)
    return Rollouts(strategy, prepared, engine(prepared, tokenizer)), prepared


def test_an_engine_with_its_own_weights_is_fed_only_after_the_policy_changed():
    engine = Recording()
    rollouts, model = _rollouts(lambda *_: engine)
    with rollouts.rollout_mode() as (_, got):
        assert got is engine and not model.training  # sampling mode inside
        assert engine.calls == ["wake"]  # nothing changed since it was built: no load
    assert model.training and engine.calls == ["wake", "sleep"]
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # an optimiser step, as far as the engine can tell
    rollouts.policy_changed()
    with rollouts.rollout_mode():
        pass
    assert engine.calls[2:] == ["load", "wake", "sleep"]  # weights first, then the rest of its memory
    assert torch.equal(engine.loaded["model.norm.weight"], model.model.norm.weight)
    with rollouts.rollout_mode():
        pass
    assert engine.calls[5:] == ["wake", "sleep"]  # fed once per change
    with pytest.raises(RuntimeError, match="in the rollout"), rollouts.rollout_mode():
        raise RuntimeError("in the rollout")
    assert engine.calls[-1] == "sleep" and model.training  # back to training even after a failure


def test_hf_generate_samples_from_the_policy_in_eval_mode():
    rollouts, model = _rollouts(HFGenerate)
    with rollouts.rollout_mode() as (module, engine):
        assert module is model and engine.model is model and not model.training
    assert model.training


def test_vllm_memory_share_is_what_the_training_state_leaves():
    gib = 2**30
    low, high = MEMORY_FRACTION_BOUNDS
    assert memory_fraction(30 * gib, 100 * gib) == pytest.approx(1 - 0.3 - MEMORY_MARGIN)
    assert memory_fraction(0, 100 * gib) == high  # an idle device: at most the upper bound
    assert memory_fraction(99 * gib, 100 * gib) == low  # nothing left: the least vLLM can run in


def test_the_spec_takes_a_memory_share_between_0_and_1():
    data = {"rollout": {"engine": "vllm", "gpu_memory_fraction": 0.5}}
    assert TrainSpec.model_validate(data).rollout.gpu_memory_fraction == 0.5
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValidationError, match="gpu_memory_fraction"):
            TrainSpec.model_validate({"rollout": {"engine": "vllm", "gpu_memory_fraction": bad}})
