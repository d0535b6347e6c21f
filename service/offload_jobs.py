"""What the API's child processes run (service/offload.py): task generation for job validation and the
verifier's dry run. Each function takes `report(phase)` first, to name the request field it works on, so a
budget overrun names the field; its arguments and result are plain data."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from trainer.tasks import rg_safety, sources, verifiers

Report = Callable[[str], None]


class Refusal(ValueError):
    """Our own refusal of the input, with a message of ours: the only exception whose text leaves the child
    (service/offload.py); a dependency's message may name files (issue 44, R1)."""


def warm() -> None:
    """Import what the calls need once, at the child's start."""
    import math_verify  # noqa: F401
    import reasoning_gym  # noqa: F401

    verifiers.get_verifier("math_verify")


def generate(report: Report, source: str, name: str | None, seed: int, params: dict[str, Any]) -> int:
    """One example of the task, as the trainer will make them: how many came out (a check, not the data).
    sources.make_examples words its own refusals and turns a generator's exception into a stable one."""
    try:
        return len(sources.make_examples(source, name=name, size=1, seed=seed, params=params))
    except ValueError as err:
        raise Refusal(str(err)) from None


def score(
    report: Report,
    name: str,
    completion: str,
    example: dict[str, Any],
    params: dict[str, Any],
) -> dict[str, Any]:
    """verifiers.score on one example: {score, error: None | {code, message}, latency_ms}."""
    built = sources.Example(prompt=example["prompt"], answer=example["answer"], meta=example["meta"])
    rg_meta = built.meta.get(sources.REASONING_GYM_META_KEY)
    if name == "reasoning_gym" and rg_meta is not None:
        report("example.meta.reasoning_gym.config")  # rebuilding the entry (cached for the scoring below)
        with contextlib.suppress(ValueError):  # the scorer reports it as the example's error, as in training
            rg_safety.rebuild_entry(rg_safety.check_meta(rg_meta))
    report("completion")
    start = time.perf_counter()
    value: float | None = None
    error = None
    try:
        value = verifiers.score(name, completion, built, params)
    except verifiers.VerifierError as err:  # this example cannot be scored by this verifier (our words)
        error = {"code": "example_not_scorable", "message": str(err)}
    except MemoryError:
        raise
    except Exception:  # a verifier's own failure on odd input: reported (not its text: it may name files)
        error = {"code": "verifier_error", "message": "the verifier failed on this input"}
    return {"score": value, "error": error, "latency_ms": (time.perf_counter() - start) * 1000}


def items(
    report: Report, source: str, name: str | None, seed: int, params: dict[str, Any], size: int
) -> list[dict[str, Any]]:
    """The task's first `size` examples as graders see them (prompt, answer, the meta's fields): the
    items of a job's loophole check (service/grading.py)."""
    examples = sources.make_examples(source, name=name, size=size, seed=seed, params=params)
    return [{**example.meta, "prompt": example.prompt, "answer": example.answer} for example in examples]


FUNCTIONS: dict[str, Callable[..., Any]] = {"generate": generate, "score": score, "items": items}
