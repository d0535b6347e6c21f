"""The hostile-completion suite through the trainer's scoring path (trainer.tasks.verifiers.score), as a rollout
calls it: every string of tests/security/completions.py through every verifier. No code runs (the marker
file never appears and no text holding it is compiled), each call ends within its budget, and the result
is a score in [0, 1] or a VerifierError (the example cannot be scored), nothing else.

The API's dry run of the same suite: tests/service/test_hostile_completions.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.security.completions import hostile_completions
from tests.security.eval_watch import watching
from trainer.tasks import verifiers
from trainer.tasks.sources import Example, make_examples

BUDGET_S = 5.0  # per call; the slowest seen is math_verify on the deepest fractions, well under 1 s


def _rg(task: str) -> Example:
    return make_examples("reasoning_gym", name=task, size=1, seed=0)[0]


# verifier case -> (verifier, example, params). reasoning_gym: a plain task and the two whose scorers
# evaluate their entry (rebuilt, so safe), one whose scorer parses logic with its own parser, one that
# parses numbers.
CASES = {
    "exact": ("exact", Example("q", "46"), {}),
    "exact_full": ("exact", Example("q", "46"), {"extract": "full", "case_sensitive": True}),
    "numeric": ("numeric", Example("q", "0.5"), {}),
    "math_verify": ("math_verify", Example("q", "\\frac{1}{2}"), {}),
    "math_verify_symbolic": ("math_verify", Example("q", "x^2 + 1"), {}),
    "rg_chain_sum": ("reasoning_gym", _rg("chain_sum"), {}),
    "rg_bitwise_arithmetic": ("reasoning_gym", _rg("bitwise_arithmetic"), {}),
    "rg_number_sorting": ("reasoning_gym", _rg("number_sorting"), {"extract": "full"}),
    "rg_propositional_logic": ("reasoning_gym", _rg("propositional_logic"), {}),
    "rg_polynomial_equations": ("reasoning_gym", _rg("polynomial_equations"), {}),
}


def test_the_suite_is_at_least_fifty_strings_and_covers_every_verifier() -> None:
    assert len(hostile_completions("/x")) >= 50
    assert {name for name, _, _ in CASES.values()} == set(verifiers.VERIFIERS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_hostile_completion_runs_code_or_overruns_its_budget(case: str, tmp_path: Path) -> None:
    name, example, params = CASES[case]
    marker = tmp_path / "ran"
    verifiers.score(name, "1", example, params)  # imports (math_verify) are not the call's time
    problems = []
    for label, completion in hostile_completions(str(marker)).items():
        start = time.perf_counter()
        with watching(str(marker)) as seen:
            try:
                value = verifiers.score(name, completion, example, params)
            except verifiers.VerifierError:
                value = 0.0
        seconds = time.perf_counter() - start
        if seen or marker.exists():
            problems.append(f"{label}: evaluated ({seen[:1]}, file: {marker.exists()})")
        if seconds > BUDGET_S:
            problems.append(f"{label}: {seconds:.1f} s")
        if not 0.0 <= value <= 1.0:
            problems.append(f"{label}: score {value}")
        marker.unlink(missing_ok=True)
    assert not problems, problems
