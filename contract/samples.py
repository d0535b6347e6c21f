"""Sample completions: the few prompts, completions, references and rewards a run keeps so that a person can
read what the model writes (issue 46, item 1).

The trainer keeps the first SAMPLES_PER_EVAL held-out examples of every evaluation (one completion each;
a tool-use job's multi-turn evaluation keeps none)
and, every TRAIN_SAMPLE_INTERVAL steps (and on the first), TRAIN_SAMPLES responses of that step's batch; it
writes them as a `samples` event (contract.protocol). The worker stores them among the job's events, the
service shows the latest of each phase in the job object, the report shows the first and the last
evaluation's and the latest training ones. Every text is cut at SAMPLE_TEXT_CHARS characters, so a set is
bounded (a few kilobytes). Samples are the tenant's data: they never become metric labels.
Standard library only.
"""

from __future__ import annotations

from typing import Any, Literal

from contract.numbers import finite

SAMPLES_PER_EVAL = 4
TRAIN_SAMPLES = 2
TRAIN_SAMPLE_INTERVAL = 10  # steps; and the first step
SAMPLE_TEXT_CHARS = 400
ELLIPSIS = "…"

Phase = Literal["eval", "train"]
PHASES: tuple[Phase, ...] = ("eval", "train")
SAMPLE_FIELDS = ("prompt", "completion", "reference", "reward", "truncated")


def clip_text(text: str, limit: int = SAMPLE_TEXT_CHARS) -> str:
    """`text`, cut to `limit` characters with an ellipsis where it was longer."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def sample(
    prompt: str, completion: str, reference: str | None, reward: float, truncated: bool
) -> dict[str, Any]:
    """One sample as it travels: texts clipped, the reward a float, `truncated` whether the completion hit
    sampling.max_new_tokens."""
    return {
        "prompt": clip_text(prompt),
        "completion": clip_text(completion),
        "reference": clip_text(reference) if reference is not None else None,
        "reward": float(reward),
        "truncated": bool(truncated),
    }


def train_sample_step(step: int) -> bool:
    """Whether training step `step` keeps samples: the first, then every TRAIN_SAMPLE_INTERVAL."""
    return step == 1 or step % TRAIN_SAMPLE_INTERVAL == 0


def checked_samples(value: Any) -> list[dict[str, Any]]:
    """The well-formed samples of an event's `samples` field, clipped again (a reader trusts no writer):
    at most SAMPLES_PER_EVAL, each with exactly SAMPLE_FIELDS."""
    out: list[dict[str, Any]] = []
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("completion"), str):
            continue
        reward = finite(item.get("reward"))
        reference = item.get("reference")
        out.append(
            sample(
                str(item.get("prompt", "")),
                item["completion"],
                reference if isinstance(reference, str) else None,
                reward if reward is not None else 0.0,
                item.get("truncated") is True,
            )
        )
        if len(out) == SAMPLES_PER_EVAL:
            break
    return out
