"""Loophole checks: a grader run on a fixed set of adversarial samples per item before anything trains on it,
and the warnings it earns. A policy learns whatever its grader pays for: an empty answer scoring 1.0
through a substring check, a syntax error read as "all tests pass". So POST /v1/graders/validate, POST
/v1/graders/run and job submission grade, for each item, the samples of ADVERSARIAL and the item's own
reference answer, and warn:

- "scores 1.0 for an empty output" (and the rest of ADVERSARIAL): an output that answers nothing passes;
- "does not pass the reference answer itself": the grader may never reward a right answer;
- "fails on an empty output: ...": the grader raises (or times out) on an output a policy will write,
  which counts against the job's error budget (trainer.graders.health).

Each warning says on how many of the items checked it happened. A job is refused on them only when its
spec asks (grading.refuse_loopholes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from trainer.graders.grading import Grader, Outcome

SYNTAX_ERROR_LIKE = (
    "Traceback (most recent call last):\n"
    '  File "solution.py", line 1\n'
    "    def f(:\n"
    "          ^\n"
    "SyntaxError: invalid syntax"
)
LONG_OUTPUT_BYTES = 100_000
MAX_ITEMS = 8  # items checked at most (the first ones given)


def adversarial(item: dict[str, Any]) -> list[tuple[str, str]]:
    """(what it is, the output) of each adversarial sample for `item`, then its reference answer."""
    prompt = item.get("prompt")
    answer = item.get("answer")
    samples = [
        ("an empty output", ""),
        ("a whitespace-only output", " \n\t "),
        ("the prompt echoed back", prompt if isinstance(prompt, str) else ""),
        ("a 100 kB output", ("the answer is " * (LONG_OUTPUT_BYTES // 14 + 1))[:LONG_OUTPUT_BYTES]),
        ("a syntax-error-like output", SYNTAX_ERROR_LIKE),
    ]
    if isinstance(answer, str):
        samples.append((REFERENCE, answer))
    return samples


REFERENCE = "the reference answer itself"


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str  # passes_adversarial | misses_reference | fails_on
    what: str
    items: int
    checked: int
    detail: str = ""

    @property
    def message(self) -> str:
        share = f"{self.items} of {self.checked} item{'s' if self.checked != 1 else ''} checked"
        if self.code == "misses_reference":
            return f"does not pass {REFERENCE} ({share}{self.detail}): it may never reward a right answer"
        if self.code == "fails_on":
            return f"fails on {self.what} ({share}): {self.detail}"
        return f"scores {self.detail} for {self.what} ({share}): a policy can learn to answer that"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "sample": self.what, "items": self.items, "checked": self.checked,
                "message": self.message}  # fmt: skip


def _judge(what: str, outcomes: list[Outcome], threshold: float) -> Finding | None:
    checked = len(outcomes)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        return Finding("fails_on", what, len(failed), checked, failed[0].describe()[:300])
    scores = [o.score for o in outcomes if o.score is not None]
    if what == REFERENCE:
        missed = [s for s in scores if s < threshold]
        if missed:
            return Finding("misses_reference", what, len(missed), checked, f"; it scores {missed[0]:g}")
        return None
    passing = [s for s in scores if s >= threshold]
    if passing:
        return Finding("passes_adversarial", what, len(passing), checked, f"{max(passing):g}")
    return None


def check(grader: Grader, items: Sequence[dict[str, Any]]) -> list[Finding]:
    """The findings of the adversarial samples on the first MAX_ITEMS items (graded in one batch)."""
    chosen = list(items)[:MAX_ITEMS]
    labelled = [(what, text, item) for item in chosen for what, text in adversarial(item)]
    if not labelled:
        return []
    outcomes = grader.grade([text for _, text, _ in labelled], [item for _, _, item in labelled])
    by_what: dict[str, list[Outcome]] = {}
    for (what, _, _), outcome in zip(labelled, outcomes):
        by_what.setdefault(what, []).append(outcome)
    findings = [_judge(what, found, grader.threshold) for what, found in by_what.items()]
    return [finding for finding in findings if finding is not None]
