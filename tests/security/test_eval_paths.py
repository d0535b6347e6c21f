"""Tenant text and model output are code nowhere: the reasoning-gym audit (trainer/tasks/rg_safety.py) against the
installed package, and the trainer's scoring path against entries and completions that would run code.

N5 (issue 32): an uploaded line's meta carried a reasoning-gym entry, and bitwise_arithmetic eval()'d its
`metadata.problem` in the trainer; spiral_matrix (and eight other tasks) evaluate the completion itself.
Each regression here uses a harmless marker, an expression that would create a file, and asserts that the
file does not exist and that no text holding it was compiled (tests/security/eval_watch.py).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.security.eval_watch import watching
from trainer.tasks import rg_safety, sources, verifiers
from trainer.tasks.sources import Example, JsonlFormatError, load_jsonl, make_examples
from trainer.tasks.verifiers import VerifierError

reasoning_gym = pytest.importorskip("reasoning_gym")
PACKAGE = Path(reasoning_gym.__file__).parent


def _code(marker: Path) -> str:
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


# --- the audit --------------------------------------------------------------------------------------------


def test_the_audit_lists_exactly_the_eval_sites_of_the_installed_package() -> None:
    # An upgrade that adds (or moves) an eval, exec, parse_expr, sympify or unpickling fails here until
    # rg_safety.AUDITED_SITES reviews it.
    assert rg_safety.scan_eval_sites(PACKAGE) == set(rg_safety.AUDITED_SITES)


def test_every_refused_verdict_names_a_refused_task_and_back() -> None:
    refused_sites = {
        verdict.removeprefix("refused: ")
        for verdict in rg_safety.AUDITED_SITES.values()
        if verdict.startswith("refused: ")
    }
    assert refused_sites == set(rg_safety.REFUSED_SCORERS) - {"composite"}
    from reasoning_gym.factory import DATASETS

    assert set(rg_safety.REFUSED_SCORERS) <= set(DATASETS)


@pytest.mark.slow
def test_the_scorers_that_evaluate_an_answer_are_exactly_the_refused_ones(tmp_path: Path) -> None:
    # The dynamic side of the audit: every task's own score_answer on answers shaped for each scorer; a
    # scorer that compiles the answer (eval, exec, parse_expr, an implicit sympify) is seen by the audit
    # hook. Composite cannot be built without datasets; it is refused for delegating.
    marker = tmp_path / "ran"
    code = _code(marker)
    answers = [code, f"[{code}]", f"[[1, {code}]]", f"x + {code}", f"1 + {code}"]
    from reasoning_gym.factory import DATASETS

    evaluating = set()
    for name in sorted(set(DATASETS) - {"composite"}):
        dataset = reasoning_gym.create_dataset(name, size=1, seed=0)
        entry = dataset[0]
        with watching(str(marker)) as seen:
            for answer in answers:
                with contextlib.suppress(Exception):  # a refusal of the answer is fine; evaluating it is not
                    dataset.score_answer(answer, entry)
        if seen:
            evaluating.add(name)
        marker.unlink(missing_ok=True)
    assert evaluating == set(rg_safety.REFUSED_SCORERS) - {"composite"}


# --- N5: the trainer's scoring path -----------------------------------------------------------------------

ENTRY_EVALUATORS = {
    # task -> the entry fields its scorer evaluates, given code
    "bitwise_arithmetic": lambda code: {"answer": "0x1", "metadata": {"problem": code}},
    "number_sorting": lambda code: {"answer": f"[{code}]", "metadata": {}},
}


@pytest.mark.parametrize("task", sorted(ENTRY_EVALUATORS))
def test_an_entry_in_meta_is_refused_and_never_evaluated(task: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    rebuilt = make_examples("reasoning_gym", name=task, size=1, seed=0)[0].meta["reasoning_gym"]
    meta = {**rebuilt, "entry": ENTRY_EVALUATORS[task](_code(marker))}
    example = Example("q", "1", {"reasoning_gym": meta})
    with watching(str(marker)) as seen, pytest.raises(VerifierError, match="entry is not accepted"):
        verifiers.score("reasoning_gym", "<answer>0x1</answer>", example)
    # the old meta shape (task and entry only) is refused too, naming the entry
    old = Example("q", "1", {"reasoning_gym": {"task": task, "entry": meta["entry"]}})
    with watching(str(marker)) as seen_old, pytest.raises(VerifierError, match="entry is not accepted"):
        verifiers.score("reasoning_gym", "[1]", old)
    assert not seen and not seen_old and not marker.exists()


@pytest.mark.parametrize("task", sorted(set(rg_safety.REFUSED_SCORERS) - {"composite"}))
def test_a_completion_never_reaches_a_scorer_that_evaluates_it(task: str, tmp_path: Path) -> None:
    # spiral_matrix eval()'d the model's own completion: a model could run code with no hostile tenant.
    marker = tmp_path / "ran"
    example = make_examples("reasoning_gym", name=task, size=1, seed=0)[0]
    code = _code(marker)
    with watching(str(marker)) as seen:
        for completion in (code, f"<answer>[{code}]</answer>", f"[[1, {code}]]", f"x + {code}"):
            with pytest.raises(VerifierError, match=f"reasoning-gym task {task!r} cannot be scored here"):
                verifiers.score("reasoning_gym", completion, example)
    assert not seen and not marker.exists()


def test_a_file_carrying_an_entry_is_refused_naming_the_field(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    rebuilt = make_examples("reasoning_gym", name="bitwise_arithmetic", size=1, seed=0)[0].meta
    good = {"prompt": "p", "answer": "a", "meta": rebuilt}
    bad = {
        "prompt": "p",
        "answer": "a",
        "meta": {
            "reasoning_gym": {
                **rebuilt["reasoning_gym"],
                "entry": ENTRY_EVALUATORS["bitwise_arithmetic"](_code(marker)),
            }
        },
    }
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(JsonlFormatError) as raised:
        load_jsonl(path)
    [error] = raised.value.errors
    assert (error.line, error.code, error.field) == (2, "forbidden_field", "meta.reasoning_gym.entry")
    assert not marker.exists()


def test_a_rebuilt_entry_scores_as_the_generated_one() -> None:
    # The meta is the generator's parameters; the entry the verifier rebuilds is the one generated.
    for example in make_examples("reasoning_gym", name="number_sorting", size=3, seed=7):
        meta: dict[str, Any] = json.loads(json.dumps(example.meta))
        assert verifiers.score("reasoning_gym", example.answer, Example("q", "a", meta)) == 1.0
    assert sources.REASONING_GYM_META_KEY == rg_safety.META_KEY
