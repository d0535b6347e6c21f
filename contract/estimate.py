"""What a job costs before it runs: steps, sampled responses, tokens, passes (upper bounds; no GPU-hour
price). Written once here: the API's POST /v1/jobs/estimate answers these fields (service/schemas.py's
EstimateObject extends JobEstimate with the queue and the tenant's limits), and the client's model is held
to that schema by tests/client/test_drift.py.

`memory_per_device` is placement's figure (contract.fleet.place_job: parameters, gradients, AdamW state,
fsdp2's gather buffers and one micro-batch's activations, per device for the spec's strategy and world
size), or None for a model whose shape the service does not know (docs/SERVICE.md, "Placement").
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from contract.spec import TrainSpec


class MemoryPerDevice(BaseModel):
    model_config = ConfigDict(frozen=True)

    strategy: str
    processes: int = Field(description="World size: the processes (devices) the state is spread over.")
    prompt_tokens: int = Field(description="The longest prompt, in tokens (an upper bound).")
    micro_batch_tokens: int = Field(description="micro_batch_size × (prompt_tokens + max_new_tokens).")
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    gathered_bytes: int = Field(description="fsdp2: full copies of the layers being computed.")
    activations_bytes: int
    not_coexisting_bytes: int = Field(
        description="Gradients and activations counted above that are never live at once (subtracted)."
    )
    rollout_gathered_bytes: int = Field(
        default=0,
        description="fsdp2 with HF generate: the full parameters gathered for sampling and evaluation. The "
        "total is the larger of the training step and the rollout (parameters + optimizer + this).",
    )
    total_bytes: int


class JobEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)

    total_steps: int
    responses_per_step: int = Field(
        description="Sampled responses per RL step (upper bound with dynamic sampling)."
    )
    total_responses: int
    max_completion_tokens: int = Field(description="Upper bound on generated tokens over all RL steps.")
    forward_backward_passes: int
    sft_steps: int
    sft_examples: int
    evaluations: int
    eval_completions: int
    checkpoints: int
    num_processes: int
    memory_per_device: MemoryPerDevice | None = Field(
        description="Memory per device of one training step; null when the model's shape is unknown."
    )


def estimate(spec: TrainSpec, memory: MemoryPerDevice | None = None) -> JobEstimate:
    """The job's cost, from its validated spec (and its memory, from contract.fleet.place_job)."""
    steps = spec.optim.steps
    per_step = spec.responses_per_step
    if spec.optim.dynamic_sampling.enabled:  # DAPO may draw up to max_gen_batches batches per step
        per_step *= spec.optim.dynamic_sampling.max_gen_batches
    micro = math.ceil(spec.responses_per_step / spec.optim.micro_batch_size)
    evaluations = 2 + (steps // spec.evaluation.interval if spec.evaluation.interval else 0)
    sft = spec.sft
    turns = spec.environment.max_turns if spec.environment is not None else 1
    return JobEstimate(
        total_steps=steps,
        responses_per_step=per_step,
        total_responses=steps * per_step,
        # A tool-use episode samples up to max_turns turns of max_new_tokens each.
        max_completion_tokens=steps * per_step * spec.sampling.max_new_tokens * turns,
        forward_backward_passes=steps * spec.optim.ppo_epochs * micro,
        sft_steps=sft.steps if sft else 0,
        sft_examples=sft.steps * sft.batch_size if sft else 0,
        evaluations=evaluations,
        eval_completions=evaluations * spec.task.eval_size * spec.evaluation.k,
        checkpoints=steps // spec.checkpoint.interval,
        num_processes=spec.distributed.num_processes,
        memory_per_device=memory,
    )
