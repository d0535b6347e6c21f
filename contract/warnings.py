"""Warnings instead of silence (issue 46, item 2): what a job does that will likely make it learn nothing,
each saying what to change.

Two moments:
- before the job runs (POST /v1/jobs/estimate and POST /v1/jobs): `spec_warnings` reads the spec and,
  for an uploaded JSONL file, its records: characters the model's tokenizer maps to its unknown token
  (`unknown_characters`, counted, only for models whose alphabet is known: tiny-arith's 18 characters;
  a byte-level BPE such as SmolLM2's reads every character), and a chat model run without its chat template
  (`no_chat_template`);
- during training, from each step's metrics (`StepWatch`, fed by the trainer, which writes a `warning`
  event, contract.protocol): most responses cut at sampling.max_new_tokens for several steps in a row
  (`truncated_responses`), a reward constant within every group for several steps in a row (no group has
  an advantage: `constant_reward`), and an entropy band or target far from the entropy the model starts
  from (`entropy_far_from_band`, on the first RL step).

A warning is reported once per kind, then again while it holds at most every REPEAT_STEPS steps and on the
run's last step, each time with `count` (the steps it held so far) and `first_step`; the job view keeps the
latest of each kind. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.catalog import CHAT_MODELS, MODEL_ALPHABETS
from contract.numbers import finite

# Kinds.
UNKNOWN_CHARACTERS = "unknown_characters"
NO_CHAT_TEMPLATE = "no_chat_template"
TRUNCATED_RESPONSES = "truncated_responses"
CONSTANT_REWARD = "constant_reward"
ENTROPY_FAR_FROM_BAND = "entropy_far_from_band"
SPEC_KINDS = (UNKNOWN_CHARACTERS, NO_CHAT_TEMPLATE)  # known before the job runs
TRAINING_KINDS = (TRUNCATED_RESPONSES, CONSTANT_REWARD, ENTROPY_FAR_FROM_BAND)  # from the steps' metrics
KINDS = (*SPEC_KINDS, *TRAINING_KINDS)

# Thresholds (why: a step where most responses are cut, or no group has an advantage, happens by chance
# early on; several in a row do not).
TRUNCATED_SHARE = 0.5  # response/truncated_fraction at or above this ...
TRUNCATED_STEPS = 3  # ... for this many steps in a row
CONSTANT_REWARD_STEPS = 5  # reward/zero_std_fraction == 1 (every group) for this many steps in a row
FAR_FACTOR = 2.0  # H₀ more than this factor above the band's top, or below its bottom (or the target)
REPEAT_STEPS = 10
SHOWN_CHARACTERS = 12  # distinct unknown characters named in the message


def warning(
    kind: str, message: str, *, step: int | None = None, count: int = 1, first_step: int | None = None
) -> dict[str, Any]:
    """A warning as the API shows it (and, with `type`, as the trainer's event carries it)."""
    return {"kind": kind, "message": message, "step": step, "count": count, "first_step": first_step}


# --- before the job runs ------------------------------------------------------------------------------------


def spec_warnings(spec: Any, records: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The warnings a validated TrainSpec (`spec`) earns before it runs; `records`: an uploaded JSONL file's
    objects (their `prompt` and `answer`), read for the unknown-character count."""
    found = []
    model = spec.model.name
    if model in CHAT_MODELS and not spec.task.use_chat_template:
        found.append(
            warning(
                NO_CHAT_TEMPLATE,
                f"{model} is a chat model, and this job renders prompts without its chat template: set "
                "task.use_chat_template: true (a `task:` block), or the model reads raw text it was not "
                "tuned on",
            )
        )
    alphabet = MODEL_ALPHABETS.get(model)
    if alphabet is not None:
        unknown = unknown_characters(alphabet, spec.task.prompt_template.replace("{prompt}", ""), records)
        if unknown is not None:
            found.append(unknown)
    return found


def unknown_characters(
    alphabet: str, template: str, records: Iterable[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The `unknown_characters` warning where the template or a record's prompt or answer holds characters
    outside `alphabet` (counted: characters, distinct characters, records); None where none does."""
    allowed = set(alphabet)
    counts: dict[str, int] = {}
    records_hit = 0
    for ch in template:
        if ch not in allowed:
            counts[ch] = counts.get(ch, 0) + 1
    in_template = bool(counts)
    for record in records:
        hit = False
        for key in ("prompt", "answer"):
            value = record.get(key)
            for ch in value if isinstance(value, str) else "":
                if ch not in allowed:
                    counts[ch] = counts.get(ch, 0) + 1
                    hit = True
        records_hit += hit
    if not counts:
        return None
    total = sum(counts.values())
    shown = "".join(sorted(counts, key=lambda c: -counts[c])[:SHOWN_CHARACTERS])
    more = f" and {len(counts) - SHOWN_CHARACTERS} more" if len(counts) > SHOWN_CHARACTERS else ""
    places = (["task.prompt_template"] if in_template else []) + (
        [f"{records_hit} records"] if records_hit else []
    )
    where = " in " + " and ".join(places)
    return warning(
        UNKNOWN_CHARACTERS,
        f"{total} characters{where} ({len(counts)} distinct: {shown!r}{more}) are not in this model's "
        f"vocabulary ({alphabet!r}) and become its unknown token, so the model cannot read them: pick a model "
        "whose tokenizer reads your text (GET /v1/models), or rewrite the prompts and answers in its alphabet",
        count=total,
    )


# --- during training ----------------------------------------------------------------------------------------


@dataclass
class _Run:
    consecutive: int = 0
    count: int = 0
    first_step: int | None = None
    reported_at: int | None = None


@dataclass
class StepWatch:
    """Reads each step's metrics (`observe`) and returns the warnings to report at that step."""

    total_steps: int
    max_new_tokens: int
    relative_target: bool = False  # a target set relative to the start: never far from it by construction
    runs: dict[str, _Run] = field(default_factory=dict)

    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
        out = []
        truncated = finite(metrics.get("response/truncated_fraction"))
        held = truncated is not None and truncated >= TRUNCATED_SHARE
        message = (
            f"{truncated or 0:.0%} of this step's responses were cut at sampling.max_new_tokens "
            f"({self.max_new_tokens} tokens), {TRUNCATED_STEPS} or more steps in a row: a cut answer is "
            "rarely right; raise sampling.max_new_tokens to fit the answers, or ask for shorter ones in "
            "task.prompt_template"
        )
        out += self._track(TRUNCATED_RESPONSES, step, held, TRUNCATED_STEPS, message)
        zero_std = finite(metrics.get("reward/zero_std_fraction"))
        message = (
            f"every group's responses got the same reward for {CONSTANT_REWARD_STEPS} or more steps in a "
            f"row (reward/mean {finite(metrics.get('reward/mean')) or 0:.3g}), so no response has an "
            "advantage and nothing is learned: check the verifier and the answers' format against the "
            "sample completions, make the task easier or harder, or raise sampling.group_size"
        )
        out += self._track(CONSTANT_REWARD, step, zero_std == 1.0, CONSTANT_REWARD_STEPS, message)
        if step == 1 and not self.relative_target:
            far = entropy_far(metrics)
            if far is not None:
                out += self._track(ENTROPY_FAR_FROM_BAND, step, True, 1, far)
        return out

    def _track(self, kind: str, step: int, held: bool, needed: int, message: str) -> list[dict[str, Any]]:
        run = self.runs.setdefault(kind, _Run())
        run.consecutive = run.consecutive + 1 if held else 0
        if run.consecutive < needed:
            return []
        run.count += 1
        run.first_step = step if run.first_step is None else run.first_step
        due = run.reported_at is None or step - run.reported_at >= REPEAT_STEPS or step == self.total_steps
        if not due:
            return []
        run.reported_at = step
        return [warning(kind, message, step=step, count=run.count, first_step=run.first_step)]


def entropy_far(metrics: Mapping[str, Any]) -> str | None:
    """The `entropy_far_from_band` message for the first RL step's metrics, or None: H₀ (entropy/mean) more
    than FAR_FACTOR above the band's top or below its bottom, or that far from the resolved target."""
    h0 = finite(metrics.get("entropy/mean"))
    low, high = finite(metrics.get("entropy/band_low")), finite(metrics.get("entropy/band_high"))
    if h0 is None or h0 <= 0:
        return None
    suggest = f"[{h0 / FAR_FACTOR:.2f}, {h0 * FAR_FACTOR:.2f}]"
    target = finite(metrics.get("entropy/target"))
    if target is not None and target > 0 and not 1 / FAR_FACTOR <= target / h0 <= FAR_FACTOR:
        return (
            f"the model starts at {h0:.3f} nats of entropy, far from the target {target:.3f}: set "
            "algorithm.control.target_entropy relative to the start ({relative: r}, r × the starting "
            f"entropy) or near {h0:.2f} nats, and entropy_band around it (e.g. {suggest})"
        )
    if low is None or high is None or (h0 <= FAR_FACTOR * high and h0 * FAR_FACTOR >= low):
        return None
    side = "above" if h0 > high else "below"
    return (
        f"the model starts at {h0:.3f} nats of entropy, far {side} entropy_band [{low:.2f}, {high:.2f}] "
        f"(the default band fits tiny-arith): set entropy_band.low/high around the start, e.g. {suggest}, "
        "or a relative target (algorithm.control.target_entropy: {relative: r}), whose band follows it"
    )
