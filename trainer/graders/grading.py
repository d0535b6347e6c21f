"""Grading samples with a tenant's grader (contract.graders): the templates filled in, string_check and the
multi formula computed here, python and text_similarity sent to the sandboxed pool (trainer/graders/pool.py),
and every sample's outcome kept: a finite score, or an error that says what went wrong.

An outcome is never turned into a number it is not: a sample whose grader raised, returned something that
is not a finite number, or ran past its budget is an error (kind exception | not_a_number | non_finite |
timeout | crashed | template | formula), with the first message and traceback; what the training step
does with it is `trainer.graders.health`'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from contract import grader_formula, grader_templates
from contract.graders import (
    AnyGrader,
    GraderLimitsSpec,
    MultiGrader,
    PythonGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    leaves,
    pass_threshold,
    runs_in_sandbox,
)
from trainer.graders.pool import GraderPool, Reply
from trainer.tasks.sources import Example
from trainer.tasks.verifiers import strip_stop_markers

ERROR_KINDS = ("exception", "not_a_number", "non_finite", "timeout", "crashed", "template", "formula")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One sample's grading: `score` (finite) or `error` (a kind of ERROR_KINDS) with its message and the
    grader's traceback (cut), and what its code printed."""

    score: float | None
    error: str | None = None
    message: str = ""
    traceback: str = ""
    output: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        return f"{self.error}: {self.message}" if self.error else f"score {self.score}"


def setup_message(grader: AnyGrader, limits: GraderLimitsSpec) -> dict[str, Any]:
    """What the pool's harness loads: the python graders' sources by name, and the text-similarity metrics
    it computes (their libraries are imported once, at the start)."""
    python = {name: leaf.source for name, leaf in leaves(grader).items() if isinstance(leaf, PythonGrader)}
    similarity = sorted(
        {leaf.evaluation_metric for leaf in leaves(grader).values() if isinstance(leaf, TextSimilarityGrader)}
    )
    return {"python": python, "similarity": similarity, "output_bytes": limits.output_bytes}


def _string_check(leaf: StringCheckGrader, given: str, reference: str) -> float:
    if leaf.operation == "eq":
        return float(given == reference)
    if leaf.operation == "ne":
        return float(given != reference)
    if leaf.operation == "like":
        return float(reference in given)
    return float(reference.casefold() in given.casefold())  # ilike


@dataclasses.dataclass
class _Pending:
    """One sample on its way: the leaves scored so far, the tasks for the pool (with their leaf names)."""

    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    tasks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    names: list[str] = dataclasses.field(default_factory=list)
    failed: Outcome | None = None


class Grader:
    """A job's grader: `grade(texts, items)` returns an Outcome per sample. With python or
    text_similarity inside, it owns a started pool (close it with `close`)."""

    def __init__(self, grader: AnyGrader, pool: GraderPool | None) -> None:
        if runs_in_sandbox(grader) and pool is None:
            raise ValueError("a python or text_similarity grader needs its sandboxed pool")
        self.spec, self.pool = grader, pool
        self.threshold = pass_threshold(grader)
        self.formula = grader.formula() if isinstance(grader, MultiGrader) else None

    @classmethod
    def start(cls, grader: AnyGrader, limits: GraderLimitsSpec, workers: int) -> Grader:
        """The grader with its pool started (GraderSetupError when the source does not load,
        GraderUnavailable when the environment is missing)."""
        pool = None
        if runs_in_sandbox(grader):
            pool = GraderPool(setup_message(grader, limits), limits, workers)
            pool.start()
        return cls(grader, pool)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def _prepare(self, text: str, item: dict[str, Any]) -> _Pending:
        sample = grader_templates.sample_of(strip_stop_markers(text))
        pending = _Pending()
        for name, leaf in leaves(self.spec).items():
            if isinstance(leaf, PythonGrader):
                pending.tasks.append({"kind": "python", "name": name, "sample": sample, "item": item})
                pending.names.append(name)
                continue
            try:
                given = grader_templates.render(leaf.input, sample, item)
                reference = grader_templates.render(leaf.reference, sample, item)
            except grader_templates.TemplateError as err:
                pending.failed = Outcome(None, "template", f"{_leaf_label(name)}{err}")
                return pending
            if isinstance(leaf, StringCheckGrader):
                pending.scores[name] = _string_check(leaf, given, reference)
            else:
                metric = leaf.evaluation_metric
                pending.tasks.append(
                    {"kind": "similarity", "metric": metric, "input": given, "reference": reference}
                )
                pending.names.append(name)
        return pending

    def _finish(self, pending: _Pending, reply: Reply) -> Outcome:
        if pending.failed is not None:
            return pending.failed
        if reply.failure is not None:
            return Outcome(None, reply.failure, reply.message, output=reply.output, seconds=reply.seconds)
        for name, result in zip(pending.names, reply.results):
            score = result.get("score") if isinstance(result, dict) else None
            if isinstance(score, bool) or not isinstance(score, int | float) or score != score:
                result = result if isinstance(result, dict) else {}
                kind = str(result.get("error", "crashed"))
                return Outcome(
                    None,
                    kind if kind in ERROR_KINDS else "crashed",
                    _leaf_label(name) + str(result.get("message", "the grader gave no score"))[:1000],
                    str(result.get("traceback", ""))[-4000:],
                    reply.output,
                    reply.seconds,
                )
            pending.scores[name] = float(score)
        return self._combine(pending.scores, reply)

    def _combine(self, scores: dict[str, float], reply: Reply) -> Outcome:
        if self.formula is None:
            value = scores[""]
        else:
            try:
                value = grader_formula.evaluate(self.formula, scores)
            except grader_formula.FormulaEvalError as err:
                return Outcome(None, "formula", str(err), output=reply.output, seconds=reply.seconds)
        if value != value or value in (float("inf"), float("-inf")):
            return Outcome(
                None, "non_finite", f"the score is {value}", output=reply.output, seconds=reply.seconds
            )
        return Outcome(value, output=reply.output, seconds=reply.seconds)

    def grade(self, texts: Sequence[str], items: Sequence[dict[str, Any]]) -> list[Outcome]:
        """Each text graded against its item (same order)."""
        pending = [self._prepare(text, item) for text, item in zip(texts, items)]
        asks = [p.tasks if p.failed is None else [] for p in pending]
        asked = self.pool is not None and any(asks)
        replies = self.pool.grade(asks) if self.pool is not None and asked else [Reply([]) for _ in asks]
        return [self._finish(p, reply) for p, reply in zip(pending, replies)]

    def grade_examples(
        self, texts: Sequence[str], examples: Sequence[Example]
    ) -> tuple[list[Outcome], float]:
        """grade() on examples; also the seconds it took."""
        start = time.perf_counter()
        items = [item_of(example) for example in examples]
        return self.grade(texts, items), time.perf_counter() - start


def item_of(example: Example) -> dict[str, Any]:
    return grader_templates.item_of(example.prompt, example.answer, example.meta)


def _leaf_label(name: str) -> str:
    return f"grader {name!r}: " if name else ""
