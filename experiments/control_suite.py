"""The entropy-control suite: the PI laws (docs/ALGORITHMS.md §11) on tuning and held-out cells.

Cells (each a suite of the plan, runnable and resumable on its own:
`python -m experiments run --suite control-tune --root runs/control`; `list` shows what is left):

- control-tune (tuning): SmolLM2-135M-Instruct, a+b with a, b in 0..20 (experiments/smollm2.py's task),
  lr 2e-5, target 0.7 × H₀, seeds 0–2. The defaults of contract/control/pi.py were derived from the
  existing suite's runs (§11.2) and committed before any run of this plan; a change of them after this
  cell has run must say so on the page.
- held out, 3 seeds each, run only after the defaults are committed: control-lr3e-6 (a+b, lr 3e-6, 0.7 ×
  H₀); control-t0.5 and control-t0.8 (a+b, lr 2e-5, 0.5 × H₀ and 0.8 × H₀); control-abs (a+b, lr 2e-5,
  an absolute target of 0.6 nats); control-gym (SmolLM2 on reasoning-gym's chain_sum, below); control-tiny
  (the demo spec's tiny model, with its SFT); control-tool (the tool-use task).
- control-clip2 (a plant check, not a held-out cell): the tuning cell's setting at two epochs per batch
  (optim.ppo_epochs 2), with its own grpo_ds at two epochs and clip_pi, whose actuator, the ratio clip,
  binds only off-policy (§11.7). The other cells' clip_pi runs ran one epoch, where the clip binds nothing.

The gym cell's start accuracy (it may run only with one in 0.05–0.6), measured on 2026-12-03 with
`OMP_NUM_THREADS=1 nice -n 5 python scripts/start_accuracy.py --only gym/cell --k 2 --seeds 0 1 2
--eval-size 128 --no-greedy` on the 2-core AMD EPYC (AVX-512) machine, shared with two training runs:
held-out avg@2 at temperature 0.7, 24 new tokens, the cell's chat template and verifier, over 384 prompts
(128 held-out prompts per task seed 0, 1, 2; 2 samples each): **0.093, 95 % interval [0.070, 0.117]**
(per seed 0.094, 0.092, 0.095; 1354 s; experiments/start_accuracy_gym.json). GYM_TASK's settings:
chain_sum with 2 terms of 1–2 digits (+ or −), and the verifier reading the last number of the response.
Why: at chain_sum's defaults (2–6 terms of 1–4 digits) SmolLM2 scored 0.02 on 48 probe prompts even with
the last-number reading, and with the default reading (the first line) it scores about 0 on any setting
(it answers in sentences, "The answer is 14."); 2–3 terms of 1–2 digits scored 0.05 on 48 probe prompts
(at the range's edge); 2 terms of 1 digit about 0.3 on 32, but that task has only 200 distinct prompts.

Arms: `default` (a spec that sets `algorithm.control` and names no algorithm: the default law), and on the
SmolLM2 cells also `stare_pi` (O1), `stare_pi_c2` and `clip_pi`. grpo_ds runs on the cells that have no
grpo_ds run yet (gym, tiny, tool); on the a+b cells grpo_ds does not read the target, so the existing
SmolLM2 suite's grpo_ds runs (and its stare_o1, adaptive_entropy runs) at each rate are the comparison,
not rerun. Run time, measured on the 2-core AMD EPYC (AVX-512) machine at two jobs (2026-12-03/04, shared
with tests): a SmolLM2 run 2,000–5,000 s (about 22 min alone on an idle machine), a tiny-cell run 250–450 s,
a tool-use run 130–230 s; so an a+b cell's 12 runs take about 3.5–8 h at two jobs, the gym cell's 15 about
4–10 h, the whole plan (75 SmolLM2 runs plus the tiny and tool-use cells) about 21–52 h.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from experiments.smollm2 import base_spec
from experiments.suites import TOOL_USE_SPEC, Run, Suite, demo_spec, merge

CELLS = (
    "control-tune",
    "control-lr3e-6",
    "control-t0.5",
    "control-t0.8",
    "control-abs",
    "control-gym",
    "control-tiny",
    "control-tool",
    "control-clip2",
)
SEEDS = 3
LAW_ARMS: dict[str, dict[str, Any]] = {
    "default": {},  # no name: the default law
    "stare_pi": {"name": "stare_pi", "params": {"variant": "O1"}},
    "stare_pi_c2": {"name": "stare_pi", "params": {"variant": "C2"}},
    "clip_pi": {"name": "clip_pi"},
}
SMOLLM2_LAWS = tuple(LAW_ARMS)
# What an arm changes outside its algorithm section. clip_pi's actuator, the ratio clip, binds only on an
# off-policy update, so the arm takes a second epoch (a spec with clip_pi and one epoch is refused). The
# committed clip_pi runs (results/control) predate this: they ran one epoch, the clip bound no token, and
# they are grpo_ds's runs (the page says so, measured from clip/fraction).
ARM_OPTIM: dict[str, dict[str, Any]] = {"clip_pi": {"ppo_epochs": 2}}
ABSOLUTE_TARGET = 0.6  # nats: about 0.65 × the a+b task's H₀ at temperature 0.7 (0.94 nats on seed 0)


def arm_algorithm(arm: str, target: Any) -> dict[str, Any]:
    """The algorithm section of an arm at the cell's target (grpo_ds: the shared target in the gate
    section, which it does not read, for the holding statistics)."""
    if arm == "grpo_ds":
        return {"name": "grpo_ds", "gate": {"target_entropy": target}}
    return {**LAW_ARMS[arm], "control": {"target_entropy": target}}


def _smollm2_base(lr: float, task: dict[str, Any] | None = None) -> dict[str, Any]:
    base = base_spec(lr)
    base.pop("algorithm", None)
    return merge(base, task or {})


GYM_TASK: dict[str, Any] = {
    "task": {
        "source": "reasoning_gym",
        "name": "chain_sum",
        "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
        "prompt_template": "{prompt}",
    },
    # The answer is the last number of the response (the a+b suite's numeric verifier reads it so too);
    # the default (the first line) scores SmolLM2's sentences ("The answer is 14.") 0.
    "verifier": {"name": "reasoning_gym", "params": {"extract": "last_number"}},
    "sampling": {"max_new_tokens": 24},  # as the chain_sum suite of experiments/plan.py
}


def _cell(name: str) -> tuple[str, dict[str, Any], Any, tuple[str, ...]]:
    """(title, base spec without its algorithm, target, arms) of a cell."""
    rel = {"relative": 0.7}
    if name == "control-tune":
        return "SmolLM2 a+b, lr 2e-5, target 0.7 × H₀ (tuning)", _smollm2_base(2e-5), rel, SMOLLM2_LAWS
    if name == "control-lr3e-6":
        return "SmolLM2 a+b, lr 3e-6, target 0.7 × H₀", _smollm2_base(3e-6), rel, SMOLLM2_LAWS
    if name in ("control-t0.5", "control-t0.8"):
        r = float(name.removeprefix("control-t"))
        return f"SmolLM2 a+b, lr 2e-5, target {r} × H₀", _smollm2_base(2e-5), {"relative": r}, SMOLLM2_LAWS
    if name == "control-abs":
        title = f"SmolLM2 a+b, lr 2e-5, target {ABSOLUTE_TARGET} nats"
        return title, _smollm2_base(2e-5), ABSOLUTE_TARGET, SMOLLM2_LAWS
    if name == "control-gym":
        base = _smollm2_base(2e-5, GYM_TASK)
        base["task"]["params"] = dict(
            GYM_TASK["task"]["params"]
        )  # the task's own, not a+b's (merge keeps keys)
        return (
            "SmolLM2 on reasoning-gym chain_sum, lr 2e-5, target 0.7 × H₀",
            base,
            rel,
            ("grpo_ds", *SMOLLM2_LAWS),
        )
    if name == "control-clip2":
        title = "SmolLM2 a+b, lr 2e-5, target 0.7 × H₀, two epochs per batch (clip_pi's plant check)"
        return title, merge(_smollm2_base(2e-5), {"optim": {"ppo_epochs": 2}}), rel, ("grpo_ds", "clip_pi")
    if name == "control-tiny":
        base = demo_spec()
        base.pop("algorithm", None)
        return "The tiny model (demo spec), target 0.7 × H₀", base, rel, ("grpo_ds", "default")
    if name == "control-tool":
        import yaml

        base = yaml.safe_load(TOOL_USE_SPEC.read_text())
        base.pop("algorithm", None)
        base = merge(base, {})
        return "The tool-use task, target 0.7 × H₀", base, rel, ("grpo_ds", "default")
    raise ValueError(f"unknown cell {name!r}; valid: {', '.join(CELLS)}")


def cell_target(name: str) -> Any:
    """The cell's target setting (nats, or {relative: r})."""
    return _cell(name)[2]


# The SmolLM2 suite's arms reused on an a+b cell: grpo_ds always (it does not read the target); stare_o1
# and adaptive_entropy only where their own target was the cell's (0.7 × H₀).
REUSED_AT_SUITE_TARGET = ("grpo_ds", "stare_o1", "adaptive_entropy")


def reused_baseline(name: str) -> tuple[Any, tuple[str, ...]] | None:
    """(the SmolLM2 suite at the cell's learning rate, the arms reused from it) for an a+b cell; None for a
    cell that runs its own grpo_ds."""
    from experiments.smollm2 import TARGET, smollm2_suites

    _title, base, target, arms = _cell(name)
    if "grpo_ds" in arms or base.get("task", {}).get("source") != "arithmetic":
        return None
    lr = base["optim"]["lr"]
    suite = next(s for s in smollm2_suites(lrs=(lr,)))
    return suite, REUSED_AT_SUITE_TARGET if target == TARGET else ("grpo_ds",)


def control_suite(name: str, *, seeds: int = SEEDS, steps: int | None = None) -> Any:
    """One cell as a suite of the plan: the default law over every seed, then the other arms seed by seed."""
    title, base, target, arms = _cell(name)
    if steps is not None:
        base = merge(base, {"optim": {"steps": steps}})
    smollm2 = base.get("model", {}).get("name") == "smollm2-135m-instruct"
    order = sorted(arms, key=lambda a: a != "default")
    # The default law over every seed first (the acceptance's arm), then the other arms seed by seed.
    pairs = [("default", s) for s in range(seeds) if "default" in order]
    pairs += [(a, s) for s in range(seeds) for a in order if a != "default"]
    runs = []
    for arm, seed in pairs:
        spec = merge(base, {"name": f"{name}-{arm}-seed{seed}", "seed": seed})
        spec["algorithm"] = arm_algorithm(arm, target)
        if arm in ARM_OPTIM:
            spec = merge(spec, {"optim": ARM_OPTIM[arm]})
        runs.append(Run(name, f"{arm}/seed{seed}", spec, arm=arm, seed=seed, keep_checkpoints=not smollm2))
    description = (
        f"{title}. Arms: {', '.join(order)} (docs/ALGORITHMS.md §11; experiments/control_suite.py). "
        "Holding: the 5-step moving average within ±25 % of the target from the settling step, the mean "
        "|H − H*|/H*, the per-step share beside them (contract/stability.py)."
    )
    return Suite(
        name,
        title,
        description,
        tuple(runs),
        arms=tuple(order),
        collapse_steps=5,
        warmup_steps=0,
        stability=True,
    )


def _cell_suite(name: str) -> Callable[[], Any]:
    return lambda: control_suite(name)


OPTIONAL: dict[str, Callable[[], Any]] = {name: _cell_suite(name) for name in CELLS}
