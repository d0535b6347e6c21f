"""The job object's entropy and controller status (part of service/schemas.py's JobObject)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class EntropyBand(BaseModel):
    low: float | None
    high: float | None


class EntropyTarget(BaseModel):
    value: float = Field(description="The resolved target entropy (nats; a relative target is r × H₀).")
    state: Literal["below", "at_or_above"] | None = Field(
        description="Entropy at the latest step against the target: below it (STARE's gate is on) or not."
    )


class EntropyStatus(BaseModel):
    value: float | None = Field(description="Token-mean policy entropy (nats) at the latest step.")
    band: EntropyBand
    state: Literal["in_band", "below", "above"] | None
    steps_out_of_band: int | None = Field(description="Consecutive steps outside the band so far.")
    target: EntropyTarget | None = Field(
        default=None,
        description="The controller's resolved target entropy and where entropy stands against it.",
    )
    collapse_step: int | None = Field(
        default=None,
        description="Time to collapse: the first RL step from which entropy stayed below 0.25 × its "
        "first-step value for 5 steps; null while it has not collapsed (contract/stability.py).",
    )
    target_hold_fraction: float | None = Field(
        default=None,
        description="Share of the post-gate steps (from the first step below the target) with entropy "
        "within ±25 % of the target; null before entropy first went below the target, or without a target.",
    )
    post_gate_steps: int | None = Field(
        default=None, description="Steps since entropy first went below the target (that one included)."
    )


class ControlStatus(BaseModel):
    law: str = Field(
        description="The PI entropy law (entropy_pi, stare_pi or clip_pi; docs/ALGORITHMS.md §11)."
    )
    target: float | None = Field(
        description="H*, the law's resolved target entropy (nats); null before step 1."
    )
    output: float | None = Field(description="u, the clipped output at the latest step (> 0 raises entropy).")
    error: float | None = Field(description="e = (H* − H)/H*, the relative shortfall at the latest step.")
    integral: float | None = Field(description="I, the integrated error at the latest step.")
    actuator: float | None = Field(
        description="What the output sets at the latest step: α (entropy_pi), W (stare_pi) or ε_high (clip_pi)."
    )
    at_clip: bool | None = Field(description="The output sits at its clip (|u| = u_max) at the latest step.")
    saturated_steps: int | None = Field(description="Consecutive steps, up to the latest, at the clip.")
    saturated: bool = Field(
        description="At the clip for 20 steps or more (the ControllerSaturated alert's condition): the "
        "target cannot be held with this actuator."
    )
