"""One registration per algorithm: its name, parameter class, advantage estimator and properties.

This is the list of algorithms a job spec may name; the spec, the engine and the losses all read it (the
loss functions themselves register under the same names in trainer/algos). Torch-free.

Properties:
- advantage_estimator: the estimator the method is defined with (a spec may choose another);
- zero_advantage_inert: every term of the per-token loss is a multiple of the advantage at that token, so
  a row whose advantage is exactly 0 gets exactly 0 gradient whatever its log-probs (the clipped surrogate;
  STARE's ω, RSI-S's, 80/20's and Clip-Cov's masks multiply Â). Not KL-Cov (its |ℓ − ℓ_old| penalty
  reaches Â = 0 rows once the policy moved) nor the adaptive entropy bonus (−α·H has no Â), and no loss
  with a KL penalty (β > 0): see `zero_advantage_rows_inert`;
- differentiable_entropy: the loss has an entropy term (the adaptive entropy bonus);
- overlong_shaping: DAPO's soft overlong penalty applies by default;
- controller: the per-step controller the loss reads (a declaration of contract/control: STARE's gate, the
  adaptive entropy coefficient, the entropy laws), or None. A controller reads H̄ of π_old on the training
  batch before the update (`measures_entropy_first`); its settings are the spec's `algorithm.control`. A law
  that is an algorithm of its own (entropy_pi, stare_pi, clip_pi, entropy_split) is registered from its
  declaration (`law_algorithm`); its actuator is the loss registered under its name in trainer/algos.
Formulas: docs/ALGORITHMS.md §3–6; its §8 table is `render_defaults()` (`python -m contract.algorithms
--write`), and a test fails when the two differ.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from contract import control
from contract.control.base import Controller
from contract.docs import DOCS, generated_doc_main
from contract.hyperparams import (
    AdaptiveEntropyParams,
    ClipCovParams,
    ClipLossParams,
    DrGrpoParams,
    ForkingParams,
    GrpoParams,
    KlCovParams,
    RsiParams,
    StareParams,
)

# The advantage estimators (trainer/algos/advantages.py registers one function under each name).
ADVANTAGE_ESTIMATOR_NAMES = ("grpo", "dr_grpo")


# What a controller sets at every step; a spec may not set it in algorithm.params.
CONTROLLED_PARAMS = frozenset().union(*(c.controls for c in control.CONTROLLERS.values()))
# Names refused in algorithm.params: the controlled ones and the KL weight (optim.kl_beta).
SPEC_FREE_PARAMS = CONTROLLED_PARAMS | {"kl_beta"}


def check_estimator(name: str) -> str:
    if name not in ADVANTAGE_ESTIMATOR_NAMES:
        raise ValueError(
            f"unknown advantage estimator {name!r}; valid: {', '.join(ADVANTAGE_ESTIMATOR_NAMES)}"
        )
    return name


@dataclass(frozen=True)
class Algorithm:
    name: str
    params_cls: type[ClipLossParams]
    advantage_estimator: str
    zero_advantage_inert: bool
    controller: str | None = None  # a controller's name (contract/control)
    # The loss has an entropy term, so the training pass's entropy must carry its gradient.
    differentiable_entropy: bool = False
    # DAPO's soft overlong penalty shapes the rewards by default (reward.overlong unset).
    overlong_shaping: bool = False

    def __post_init__(self) -> None:
        check_estimator(self.advantage_estimator)
        if self.controller is not None and self.controller not in control.CONTROLLERS:
            raise ValueError(f"algorithm {self.name!r}: unknown controller {self.controller!r}")

    @property
    def measures_entropy_first(self) -> bool:
        """A controller reads H̄ of π_old before the update."""
        return self.controller is not None

    @property
    def controller_info(self) -> Controller | None:
        return None if self.controller is None else control.get(self.controller)


_REGISTERED: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    if algorithm.name in _REGISTERED:
        raise ValueError(f"algorithm {algorithm.name!r} is registered twice")
    _REGISTERED[algorithm.name] = algorithm
    return algorithm


for _algorithm in (
    Algorithm("grpo", GrpoParams, "grpo", zero_advantage_inert=True),
    Algorithm("grpo_ds", ClipLossParams, "grpo", zero_advantage_inert=True),
    Algorithm("dapo", ClipLossParams, "grpo", zero_advantage_inert=True, overlong_shaping=True),
    Algorithm("dr_grpo", DrGrpoParams, "dr_grpo", zero_advantage_inert=True),
    Algorithm("stare", StareParams, "grpo", zero_advantage_inert=True, controller="stare_gate"),
    Algorithm("rsi_s", RsiParams, "grpo", zero_advantage_inert=True),
    Algorithm("forking_8020", ForkingParams, "grpo", zero_advantage_inert=True),
    Algorithm("clip_cov", ClipCovParams, "grpo", zero_advantage_inert=True),
    Algorithm("kl_cov", KlCovParams, "grpo", zero_advantage_inert=False),
    Algorithm(
        "adaptive_entropy",
        AdaptiveEntropyParams,
        "grpo",
        zero_advantage_inert=False,
        controller="entropy_coef",
        differentiable_entropy=True,
    ),
):
    register(_algorithm)


def law_algorithm(law: Controller) -> Algorithm:
    """The algorithm a law that is its own algorithm stands for: grpo_ds's surrogate with its actuator."""
    own = law.own_algorithm
    assert own is not None
    return Algorithm(
        law.name,
        own.params_cls,
        "grpo",
        zero_advantage_inert=own.zero_advantage_inert,
        controller=law.name,
        differentiable_entropy=own.differentiable_entropy,
    )


class _Algorithms(Mapping[str, Algorithm]):
    """The registered algorithms and the laws that are algorithms of their own (contract/control), read-only:
    a law registered later (a test's toy) is an algorithm from then on."""

    def _all(self) -> dict[str, Algorithm]:
        laws = {
            c.name: law_algorithm(c)
            for c in control.CONTROLLERS.values()
            if c.own_algorithm is not None and c.name not in _REGISTERED
        }
        return {**_REGISTERED, **laws}

    def __getitem__(self, name: str) -> Algorithm:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


# name → registration, read-only.
ALGORITHMS: Mapping[str, Algorithm] = _Algorithms()


def names() -> list[str]:
    return sorted(ALGORITHMS)


def get(name: str) -> Algorithm:
    """The registration of `name`; ValueError listing the valid names when there is none."""
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(names())}") from None


def make_loss_params(name: str, **overrides: Any) -> ClipLossParams:
    """The named loss's parameters with overrides; an unknown loss or parameter is an error naming it."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(names())}")
    params_cls = ALGORITHMS[name].params_cls
    known = {f.name for f in dataclasses.fields(params_cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) for loss {name!r}: {', '.join(unknown)}; valid: {', '.join(sorted(known))}"
        )
    return params_cls(**overrides)


def zero_advantage_rows_inert(name: str, params: ClipLossParams) -> bool:
    """Whether rows with advantage exactly 0 contribute exactly 0 to the gradient of loss `name` with
    these parameters, so a trainer may score them without autograd."""
    return get(name).zero_advantage_inert and params.kl_beta <= 0


# ------------------------------------------------------------------------------- docs/ALGORITHMS.md §8

DOCS_PATH = DOCS / "ALGORITHMS.md"
DEFAULTS_BEGIN = "<!-- defaults: generated by `python -m contract.algorithms --write` -->"
DEFAULTS_END = "<!-- end of defaults -->"


def _value(value: object) -> str:
    return "none" if value is None else f"`{value}`"


def render_defaults() -> str:
    """The defaults table of docs/ALGORITHMS.md §8, from the registrations and the parameter classes."""
    lines = [
        "| algorithm | parameters | estimator | Â = 0 rows inert | controller | defaults |",
        "|---|---|---|---|---|---|",
    ]
    for name in names():
        entry = ALGORITHMS[name]
        fields = [f for f in dataclasses.fields(entry.params_cls) if f.name not in SPEC_FREE_PARAMS]
        defaults = ", ".join(f"{f.name} {_value(f.default)}" for f in fields)
        lines.append(
            f"| `{name}` | `{entry.params_cls.__name__}` | `{entry.advantage_estimator}` "
            f"| {'yes' if entry.zero_advantage_inert else 'no'} "
            f"| {_value(entry.controller)} | {defaults} |"
        )
    lines.append("")
    for info in control.CONTROLLERS.values():
        declared = info.settings.model_fields
        settings = ", ".join(f"{k} {_value(f.default)}" for k, f in declared.items() if k != "controller")
        users = ", ".join(f"`{n}`" for n in names() if ALGORITHMS[n].controller == info.name)
        lines.append(
            f"- controller `{info.name}` of {users} (`algorithm.control`, "
            f"`{info.settings.__name__}`): {settings}."
        )
    return "\n".join([DEFAULTS_BEGIN, *lines, DEFAULTS_END])


def documented_defaults(text: str) -> str:
    """The generated block as it stands in a copy of docs/ALGORITHMS.md."""
    start, end = text.index(DEFAULTS_BEGIN), text.index(DEFAULTS_END) + len(DEFAULTS_END)
    return text[start:end]


def main(argv: list[str] | None = None) -> int:
    return generated_doc_main(
        argv,
        prog="python -m contract.algorithms",
        path=DOCS_PATH,
        render=lambda text: text.replace(documented_defaults(text), render_defaults()),
    )


if __name__ == "__main__":
    sys.exit(main())
