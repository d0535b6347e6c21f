"""The shapes of the results plan, below every suite definition: a run (one job spec), a suite (runs compared
arm against arm), the arms (algorithm sections) and the spec helpers the suite builders share.
experiments.plan (the demo's suites) and experiments.smollm2 (the SmolLM2 suites) both build on this module
and neither imports the other's private names."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from contract import algorithms
from contract.protocol import CHECKPOINTS_DIR, checkpoint_name

REPO = Path(__file__).resolve().parent.parent
DEMO_SPEC = REPO / "trainer" / "specs" / "demo.yaml"
TOOL_USE_SPEC = REPO / "trainer" / "specs" / "tool_use.yaml"
SFT_REF = "@sft:"  # model.name placeholder: the step-0 model of the named run

# Arm name → algorithm section of the spec (every other setting is the suite's).
ARMS: dict[str, dict[str, Any]] = {
    "grpo_ds": {"name": "grpo_ds"},
    "stare_o1": {"name": "stare", "params": {"variant": "O1"}},
    "stare_c2": {"name": "stare", "params": {"variant": "C2"}},
    "adaptive_entropy": {"name": "adaptive_entropy"},
    "rsi_s": {"name": "rsi_s"},
    "dapo": {"name": "dapo"},
    "forking_8020": {"name": "forking_8020"},
    "clip_cov": {"name": "clip_cov"},
    "kl_cov": {"name": "kl_cov"},
}
HEADLINE = ("grpo_ds", "stare_o1")


@dataclass(frozen=True)
class Run:
    suite: str
    name: str  # within the suite: "sft/seed0", "grpo_ds/seed3", "seed2-t1"
    spec: dict[str, Any]
    threads: int = 1
    needs: tuple[str, ...] = ()
    arm: str | None = None
    seed: int = 0
    # False: the run's checkpoints are deleted once it has finished (a SmolLM2 run's are ~1.6 GB each;
    # its events are what the page reads).
    keep_checkpoints: bool = True

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.name}"

    def resolve_spec(self, folder_of: Callable[[str], Path]) -> dict[str, Any]:
        """The spec with placeholders replaced: an `@sft:<run id>` model is that run's step-0 model."""
        spec = copy.deepcopy(self.spec)
        name = spec.get("model", {}).get("name", "")
        if isinstance(name, str) and name.startswith(SFT_REF):
            spec["model"]["name"] = str(
                folder_of(name[len(SFT_REF) :]) / CHECKPOINTS_DIR / checkpoint_name(0) / "model"
            )
        return spec


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    description: str
    runs: tuple[Run, ...]
    arms: tuple[str, ...] = ()
    collapse_steps: int = 10  # "collapse": entropy below entropy_band.low for this many consecutive steps
    warmup_steps: int = 10  # steps left out of "fraction in band" (the RL warm-up)
    # A robustness suite: one spec over seeds and thread counts, each run with its own SFT, judged per run
    # by the demo's acceptance (avg@k gain, gate on) instead of compared arm against arm.
    robustness: bool = False
    # A stability suite (the SmolLM2 suites): its section is experiments/stability_page.py's (time to
    # collapse, holding, every method paired with grpo_ds, the drift analysis, what is still running).
    stability: bool = False


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def own_target_section(algorithm: dict[str, Any]) -> dict[str, Any]:
    """The algorithm section with the shared gate's target moved to the arm's controller's section
    (algorithm.control), so every arm is compared at one target. STARE reads the gate section as its own
    (the spec's one migration), and an arm without a controller keeps it for the page only."""
    info = algorithms.get(algorithm.get("name", "stare")).controller_info
    if info is None or info.name == "stare_gate":
        return algorithm
    rest = {k: v for k, v in algorithm.items() if k != "gate"}
    target = (algorithm.get("gate") or {}).get("target_entropy")
    own = {"target_entropy": target} if target is not None else {}
    return {**rest, "control": {**own, **rest.get("control", {})}}


def demo_spec() -> dict[str, Any]:
    """The demo's job spec (trainer/specs/demo.yaml), as a dict the suites override."""
    data = yaml.safe_load(DEMO_SPEC.read_text())
    assert isinstance(data, dict)
    return data
