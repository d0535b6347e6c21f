"""Tenant graders' tests: the grader environment (scripts/build-grader-venv) and bubblewrap are real
components; a test that needs them is skipped (a failure under STARE_REQUIRE_REAL_COMPONENTS=1) without."""

from __future__ import annotations

import pytest

from tests.conftest import skip_missing_component
from trainer.graders import pool


@pytest.fixture(scope="session")
def grader_environment() -> None:
    problem = pool.unavailable()
    if problem is not None:
        skip_missing_component(problem)
