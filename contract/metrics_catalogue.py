"""The whole metric catalogue, in its documented order: what every step logs (contract/metrics_training.py),
then what the methods and the runtime log (contract/metrics_methods.py). contract/metrics.py indexes it."""

from __future__ import annotations

from contract.metrics_methods import METHODS
from contract.metrics_training import TRAINING
from contract.metrics_types import Metric

CATALOGUE: tuple[Metric, ...] = (*TRAINING, *METHODS)
