"""The job object's warnings and samples (issue 46): what will likely make a job learn nothing with what to
change (contract/warnings.py), and a few prompts with their completions (contract/samples.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from contract.warnings import KINDS


class JobWarning(BaseModel):
    kind: Literal[
        "unknown_characters",
        "no_chat_template",
        "truncated_responses",
        "constant_reward",
        "entropy_far_from_band",
    ]
    message: str = Field(description="What happens and what to change.")
    step: int | None = Field(default=None, description="The latest step it held (null: before the job ran).")
    count: int = Field(
        default=1, description="Steps it held so far (unknown_characters: the characters counted)."
    )
    first_step: int | None = Field(default=None, description="The first step it held.")


class Sample(BaseModel):
    prompt: str
    completion: str
    reference: str | None
    reward: float
    truncated: bool = Field(description="The completion was cut at sampling.max_new_tokens.")


class SampleSet(BaseModel):
    step: int
    samples: list[Sample]


class JobSamples(BaseModel):
    eval: SampleSet | None = Field(
        default=None, description="The latest evaluation's first held-out examples, one completion each."
    )
    train: SampleSet | None = Field(
        default=None, description="A few responses of a recent training step (the first, then every 10)."
    )


assert set(JobWarning.model_fields["kind"].annotation.__args__) == set(KINDS)  # type: ignore[union-attr]
