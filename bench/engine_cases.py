"""The configurations bench_engine.py measures: the sides of the comparison with TRL (VARIANTS), a batch
configuration (Case) and the default and smoke ones, the targets, and the TrainSpec and prompt order both
sides of a comparison share. bench_sample_stats.py measures the same batch (default_cases, train_spec)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

TARGET_VS_TRL = {"tiny-arith": 1.5, "smollm2-135m-instruct": 1.2}
STARE_OVERHEAD_TARGET = 0.03
STARE_PARAMS = {"top_ratio": 0.1, "reweight_w": 1.1, "reweight_m": 0.9, "variant": "O1"}
STARE_GATE_TARGET = 100.0

# The sides of the comparison with TRL: (label, trainer, options). "heap": the engine's glibc heap setting
# (trainer/run/heap.py; on by default in our engine, off by default in any other process); "skip": scoring
# rows with advantage 0 without autograd (optim.skip_zero_advantage, on by default).
VARIANTS: dict[str, tuple[str, str, dict[str, bool]]] = {
    "ours": ("ours (grpo), as shipped", "ours", {"heap": True, "skip": True}),
    "ours_full": ("ours, every row forward+backward", "ours", {"heap": True, "skip": False}),
    "ours_plain": ("ours, every row, glibc default heap", "ours", {"heap": False, "skip": False}),
    "trl": ("TRL GRPOTrainer", "trl", {"heap": False}),
    "trl_heap": ("TRL GRPOTrainer, our heap setting", "trl", {"heap": True}),
}


@dataclass(frozen=True)
class Case:
    """One batch configuration, measured on both sides of a comparison."""

    model: str
    prompts: int  # P
    samples: int  # G
    new_tokens: int  # R (forced: every response is exactly this long)
    chat: bool  # render prompts with the tokenizer's chat template
    verifier: str
    lr: float
    warmup: int  # untimed steps per side
    steps: int  # timed steps per side
    seed: int = 0
    verifier_params: tuple[tuple[str, Any], ...] = ()
    variants: tuple[str, ...] = ("ours", "ours_full", "trl")  # sides of the comparison with TRL

    @property
    def responses(self) -> int:
        return self.prompts * self.samples

    def label(self) -> str:
        return f"{self.model}, {self.prompts} prompts × {self.samples} samples × {self.new_tokens} tokens"


def default_cases(quick: bool) -> tuple[list[Case], list[Case]]:
    # A numeric reward with a tolerance: an untrained model's answers then earn mixed rewards, so both
    # trainers take real gradient steps (an exact-match reward gives these models all-zero rewards, i.e.
    # all-zero advantages and gradients), and some groups still come out all-equal, as in real runs.
    loose = (("abs_tol", 60.0),)
    tiny = Case(
        "tiny-arith",
        8,
        8,
        16,
        False,
        "numeric",
        2e-4,
        warmup=3,
        steps=20,
        verifier_params=loose,
        variants=tuple(VARIANTS),
    )
    smol = Case(
        "smollm2-135m-instruct", 4, 4, 16, True, "numeric", 1e-6, warmup=1, steps=5, verifier_params=loose
    )
    if quick:
        tiny = replace(tiny, warmup=1, steps=3)
        smol = replace(smol, warmup=1, steps=1)
        return [tiny, smol], [tiny]
    # About 7 minutes on 2 loaded cores; SmolLM2 steps dominate (~25 s per pair against TRL).
    return [tiny, smol], [tiny, replace(smol, steps=4)]


def smoke_cases(trl_cases: list[Case], stare_cases: list[Case]) -> tuple[list[Case], list[Case]]:
    """--smoke: tiny-arith only, one untimed and one timed step, our shipped side against TRL's."""
    tiny = [replace(c, warmup=1, steps=1) for c in trl_cases if c.model == "tiny-arith"]
    return [replace(c, variants=("ours", "trl")) for c in tiny], [
        replace(c, warmup=1, steps=1) for c in stare_cases if c.model == "tiny-arith"
    ]


def train_spec(case: Case, algorithm: str, skip_zero_advantage: bool = True) -> Any:
    from contract.spec import TrainSpec

    algo: dict[str, Any] = {"name": algorithm}
    if algorithm == "stare":
        # The gate is forced on (H̄ < 100 always), so every step pays for the surprisal ranking: the worst
        # case for the overhead. With the demo's target (0.3) an untrained model's gate would stay off.
        algo.update(params=STARE_PARAMS, gate={"target_entropy": STARE_GATE_TARGET})
    return TrainSpec.model_validate(
        {
            "name": f"bench-{algorithm}",
            "seed": case.seed,
            "model": {"name": case.model},
            "task": {
                "source": "arithmetic",
                "params": {"operations": ["+"], "min_operand": 0, "max_operand": 99},
                "train_size": 2000,
                "eval_size": 0,
                "use_chat_template": case.chat,
            },
            "verifier": {"name": case.verifier, "params": dict(case.verifier_params)},
            "algorithm": algo,
            "sampling": {
                "group_size": case.samples,
                "temperature": 1.0,
                "top_p": 1.0,
                "max_new_tokens": case.new_tokens,
            },
            "optim": {
                "lr": case.lr,
                "steps": case.warmup + case.steps,
                "prompts_per_step": case.prompts,
                "micro_batch_size": case.responses,
                "grad_clip": 1.0,
                "ppo_epochs": 1,
                "kl_beta": 0.0,
                "skip_zero_advantage": skip_zero_advantage,
            },
        }
    )


def engine_prompt_order(spec: Any, steps: int) -> list[Any]:
    """The examples the engine takes over `steps` steps, in order, via its own data cursor."""
    from trainer.data import load_examples

    prompts, _ = load_examples(spec)  # the engine's data cursor, without an engine
    order: list[Any] = []
    for _ in range(steps):
        order.extend(prompts.take(spec.optim.prompts_per_step)[0])
    return order
