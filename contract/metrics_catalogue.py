"""The whole metric catalogue, in its documented order: what every step logs (contract/metrics_training.py),
the controllers' own metrics (each declared with its controller, contract/control; an entry two laws share is
listed once), what the methods' losses and the runtime log (contract/metrics_methods.py), a tenant grader's
health (contract/metrics_graders.py), then the holding statistics. contract/metrics.py indexes it."""

from __future__ import annotations

from contract import control as controllers
from contract.metrics_graders import GRADERS
from contract.metrics_methods import METHODS
from contract.metrics_training import HOLDING, TRAINING
from contract.metrics_types import Metric


def controller_metrics() -> tuple[Metric, ...]:
    """Every registered controller's metrics in registration order, each key once."""
    seen: dict[str, Metric] = {}
    for controller in controllers.CONTROLLERS.values():
        for m in controller.metrics:
            seen.setdefault(m.key, m)
    return tuple(seen.values())


def catalogue() -> tuple[Metric, ...]:
    """The catalogue as the registries hold it now (a law registered after import joins it here)."""
    return (*TRAINING, *controller_metrics(), *METHODS, *GRADERS, *HOLDING)


CATALOGUE: tuple[Metric, ...] = catalogue()
