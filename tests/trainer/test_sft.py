"""The SFT warm-start's schedule and loss (sft.schedule, warmup_steps, min_lr_ratio, label_smoothing)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

from contract.spec import SftSpec
from trainer.sft import sft_loss, sft_lr_factor


def test_cosine_schedule_warms_up_linearly_then_decays_to_the_floor_at_the_last_step() -> None:
    sft = SftSpec(steps=110, warmup_steps=10, schedule="cosine", min_lr_ratio=0.05)
    factors = [sft_lr_factor(sft, i) for i in range(sft.steps)]
    assert factors[:10] == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert factors[10] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.05)
    mid = 10 + 99 // 2
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert factors[mid] == pytest.approx(0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (mid - 10) / 99)))


def test_constant_schedule_is_flat_after_the_warm_up() -> None:
    sft = SftSpec(steps=50, warmup_steps=4)
    assert [sft_lr_factor(sft, i) for i in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert sft_lr_factor(SftSpec(steps=50), 0) == 1.0


def test_sft_label_smoothing_is_cross_entropy_against_the_smoothed_target() -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 4, 7, generator=g)
    labels = torch.tensor([[-100, -100, 3, 1], [-100, 5, 2, 0]])
    eps = 0.1
    logp = torch.log_softmax(logits, -1)
    terms = []
    for b in range(2):
        for t in range(3):  # position t predicts label t + 1
            y = int(labels[b, t + 1])
            if y == -100:
                continue
            target = torch.full((7,), eps / 7)
            target[y] += 1 - eps
            terms.append(-(target * logp[b, t]).sum())
    assert_close(sft_loss(logits, labels, eps), torch.stack(terms).mean())
    plain = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 7), labels[:, 1:].reshape(-1))
    assert_close(sft_loss(logits, labels, 0.0), plain)


def test_sft_leaves_no_gradient_for_the_first_rl_step(tmp_path) -> None:
    """The RL update accumulates into .grad; the SFT warm-start's last gradient must not be part of RL step 1's."""
    from contract.spec import TrainSpec
    from tests.trainer.test_engine import small_spec
    from trainer.engine import Engine

    engine = Engine(TrainSpec.model_validate(small_spec(sft={"steps": 2, "batch_size": 8})), tmp_path)
    engine.setup()
    before = [p.detach().clone() for p in engine.model.parameters()]
    engine._sft()
    assert any(not torch.equal(a, p) for a, p in zip(before, engine.model.parameters()))  # SFT trained
    assert [n for n, p in engine.model.named_parameters() if p.grad is not None] == []
