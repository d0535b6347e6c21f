"""Shared settings for the algorithm tests: one torch thread (shared CI boxes) and a deterministic
hypothesis profile (no deadline: timing on a loaded machine is noise, not a property).
HYPOTHESIS_PROFILE=thorough runs many more random examples, for bug hunts rather than CI."""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)

# Without a GPU, Triton's interpreter runs the kernels: tests/conftest.py sets TRITON_INTERPRET before any
# test module loads.

settings.register_profile(
    "algos",
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", parent=settings.get_profile("algos"), max_examples=1000, derandomize=False
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "algos"))
