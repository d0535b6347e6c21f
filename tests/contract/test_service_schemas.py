"""The service's response schemas spell the contract's enum-like values the same way (a Literal there is
for the OpenAPI document; the values are the contract's)."""

from __future__ import annotations

from typing import Literal, get_args, get_origin

from contract.metrics import BandState
from contract.verifiers import PARAM_TYPES, REWARD_STYLES
from service import schemas


def _literals(annotation: object) -> set[object]:
    if get_origin(annotation) is Literal:
        return set(get_args(annotation))
    return {value for arg in get_args(annotation) for value in _literals(arg)}  # Optional, Union


def _literal_values(model: type, field: str) -> set[object]:
    return _literals(model.model_fields[field].annotation)  # type: ignore[attr-defined]


def test_the_entropy_states_are_the_band_states() -> None:
    assert _literal_values(schemas.EntropyStatus, "state") == {state.label for state in BandState}


def test_verifier_param_types_and_reward_styles_are_the_contracts() -> None:
    assert _literal_values(schemas.VerifierParam, "type") == set(PARAM_TYPES)
    assert _literal_values(schemas.VerifierTest, "reward_style") == set(REWARD_STYLES)


def test_the_spec_spells_reward_styles_and_task_sources_as_their_implementations() -> None:
    from contract.spec import RewardSpec, TaskSpec
    from trainer.tasks.sources import TASK_SOURCES

    assert _literal_values(RewardSpec, "style") == set(REWARD_STYLES)
    assert _literal_values(TaskSpec, "source") == set(TASK_SOURCES)
