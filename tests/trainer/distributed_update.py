"""Run by test_distributed.py, alone or under `accelerate launch --cpu --num_processes N`.

Builds one fixed global batch, gives each process its share (rows rank::world), runs the engine's
policy_update on it once per loss named (a comma-separated list: one launch serves every loss), and writes
(from rank 0) each loss's summed value and synchronised gradients.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from accelerate import Accelerator

from trainer.algos import compute_advantages, make_loss_params, stare_weights
from trainer.models import load_model_and_tokenizer
from trainer.policy.scoring import micro_batches
from trainer.policy.update import LossSetup, StepBatch, policy_update
from trainer.rollout.batch import Rollout


def global_batch(vocab: int) -> tuple[Rollout, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    b, p_len, r_len = 12, 5, 7
    ids = torch.randint(4, vocab, (b, p_len + r_len), generator=g)
    attn = torch.ones(b, p_len + r_len, dtype=torch.long)
    attn[: b // 2, :2] = 0  # left padding on half the prompts
    lengths = torch.randint(1, r_len + 1, (b,), generator=g)
    resp = (torch.arange(r_len).unsqueeze(0) < lengths.unsqueeze(1)).float()
    attn[:, p_len:] = resp.long()
    rewards = torch.randint(0, 2, (b,), generator=g).float()
    groups = torch.arange(b) // 4
    r = Rollout(ids, attn, resp, p_len, rewards, rewards, groups, torch.zeros(b, dtype=torch.bool), [""] * b)
    adv, _ = compute_advantages("grpo", rewards, groups)
    return r, adv


class AcceleratedRuntime:
    """What policy_update asks of the run's Runtime, answered by accelerate (an implementation of gradient
    synchronisation independent of ours): the group's size, the backward, and no_sync for all but the last
    micro-batch."""

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.world_size = accelerator.num_processes

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def no_sync(self, model: torch.nn.Module) -> Any:
        return self.accelerator.no_sync(model)


def main(out_path: str, loss_names: str, micro_batch_size: int) -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer("tiny-arith", seed=0)
    model = accelerator.prepare(model)
    results = {}
    for loss_name in loss_names.split(","):
        model.zero_grad(set_to_none=True)  # no optimizer step: the weights are the same for every loss
        results[loss_name] = _update(accelerator, model, loss_name, micro_batch_size)
    if accelerator.is_main_process:
        torch.save(results, out_path)


def _update(accelerator: Accelerator, model: torch.nn.Module, loss_name: str, micro_batch_size: int) -> dict:
    batch, adv = global_batch(
        model.module.config.vocab_size if hasattr(model, "module") else model.config.vocab_size
    )
    rank, world = accelerator.process_index, accelerator.num_processes
    rows = torch.arange(rank, batch.size, world)
    local = batch.select(rows)
    # A fixed behaviour policy for the whole batch, so ratios differ from 1 and some clip.
    old_global = -torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(1)) * 4.0
    old = old_global[rows]
    token_weights = None
    if loss_name == "stare_step":
        # STARE's step-batch scope: ω chosen over the whole global batch, then sliced per process.
        loss_name = "stare"
        weights, _ = stare_weights(
            -old_global,
            adv,
            batch.response_mask,
            top_ratio=0.25,
            reweight_w=1.5,
            reweight_m=0.9,
            variant="C2",
            gate_on=True,
        )
        token_weights = weights[rows]
    step_batch = StepBatch(
        rollout=local,
        advantages=adv[rows],
        old_logprob=old,
        ref_logprob=None,
        token_weights=token_weights,
        global_tokens=float(batch.response_mask.sum()),
        global_sequences=float(batch.size),
        # What the ddp strategy's plan gives above one process (Strategy.prompt_sharing "never"): DDP syncs
        # in every forward call, so every call is the full forward on every process.
        share_prompts=False if world > 1 else None,
    )
    n_micro = len(micro_batches(local.size, micro_batch_size))
    n_micro = int(accelerator.reduce(torch.tensor(n_micro), reduction="max"))
    params = make_loss_params(loss_name)
    metrics, *_ = policy_update(
        model,
        AcceleratedRuntime(accelerator),  # type: ignore[arg-type]
        step_batch,
        LossSetup(loss_name, params),
        temperature=0.9,
        micro_batch_size=micro_batch_size,
        max_response_length=7,
        num_micro_batches=n_micro,
    )
    loss = accelerator.reduce(torch.tensor(metrics["loss/policy"], dtype=torch.float64), reduction="sum")
    grads = {n: p.grad.detach().clone() for n, p in accelerator.unwrap_model(model).named_parameters()}
    return {"loss": float(loss), "grads": grads}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
