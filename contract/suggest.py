"""Did you mean: the valid name nearest to a misspelt or foreign one.

A name is matched, in this order, by a name other libraries use for the same setting (ALIASES, e.g. TRL's
`learning_rate` for our `lr`), by its initials (`learning_rate` → `lr`), then by edit distance
(Damerau-Levenshtein, optimal string alignment: a swap of two neighbours is one edit, so `grop` is one edit
from `grpo`), case-insensitively, within about a third of the name's length. A suggestion is only ever
one of the valid names given; no match is None, and the caller says nothing rather than guess.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ALIASES", "did_you_mean", "edit_distance", "nearest"]

# Names for our settings in other trainers' configs (TRL, verl, OpenAI's fine-tuning API): a foreign name is
# suggested its counterpart only where that counterpart is valid at the place it was written.
ALIASES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr",),
    "lr_scheduler_type": ("schedule",),
    "scheduler": ("schedule",),
    "max_steps": ("steps",),
    "num_steps": ("steps",),
    "total_steps": ("steps",),
    "total_training_steps": ("steps",),
    "num_generations": ("group_size",),
    "num_samples": ("group_size", "k"),
    "n": ("group_size", "k"),
    "rollout_n": ("group_size",),
    "max_tokens": ("max_new_tokens",),
    "max_length": ("max_new_tokens",),
    "max_completion_length": ("max_new_tokens",),
    "max_response_length": ("max_new_tokens",),
    "beta": ("kl_beta",),
    "kl_coef": ("kl_beta",),
    "kl_coeff": ("kl_beta",),
    "max_grad_norm": ("grad_clip",),
    "num_epochs": ("ppo_epochs",),
    "epochs": ("ppo_epochs",),
    "num_iterations": ("ppo_epochs",),
    "per_device_train_batch_size": ("micro_batch_size",),
    "model_name": ("name",),
    "model_name_or_path": ("name",),
    "question": ("prompt",),
    "input": ("prompt",),
    "query": ("prompt",),
    "instruction": ("prompt",),
    "completion": ("answer",),
    "output": ("answer",),
    "target": ("answer",),
    "label": ("answer",),
    "solution": ("answer",),
    "response": ("answer",),
    "metadata": ("meta",),
}


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and adjacent swaps."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, start=1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], previous2[j - 2] + 1)
        previous2, previous = previous, row
    return previous[-1]


def _initials(name: str) -> str:
    return "".join(word[0] for word in name.split("_") if word)


def nearest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name `name` most likely stands for, or None when none is close."""
    candidates = [v for v in dict.fromkeys(valid) if isinstance(v, str)]
    if not isinstance(name, str) or not name or name in candidates:
        return None
    lowered = name.lower()
    for alias in ALIASES.get(lowered, ()):
        if alias in candidates:
            return alias
    if "_" in lowered:
        by_initials = [v for v in candidates if v.lower() == _initials(lowered)]
        if by_initials:
            return by_initials[0]
    limit = max(1, (len(lowered) + 1) // 3)
    scored = sorted((edit_distance(lowered, v.lower()), v) for v in candidates)
    if scored and scored[0][0] <= limit:
        return scored[0][1]
    return None


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """The sentence `; did you mean `x`?` for the nearest valid name, or "" when none is close."""
    found = nearest(name, valid)
    return f"; did you mean `{found}`?" if found is not None else ""
