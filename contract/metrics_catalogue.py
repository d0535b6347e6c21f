"""The whole metric catalogue, in its documented order: what every step logs (contract/metrics_training.py),
then what the methods and the runtime log (contract/metrics_methods.py), then a tenant grader's health
(contract/metrics_graders.py). contract/metrics.py indexes it."""

from __future__ import annotations

from contract import control_metrics
from contract.metrics_graders import GRADERS
from contract.metrics_methods import METHODS
from contract.metrics_training import TRAINING
from contract.metrics_types import Metric, Surface
from contract.metrics_types import metric as _m

# The PI entropy laws and the holding statistics come last: contract/control_metrics.py.
CATALOGUE: tuple[Metric, ...] = (
    *TRAINING,
    *METHODS,
    *GRADERS,
    *control_metrics.entries(_m, {s.value: s for s in Surface}),
)
