"""The one migration of a spec's algorithm section (contract/spec.py's AlgorithmSpec reads every spec through
it): the older `gate` and `entropy_control` sections, and a `control` that does not name its controller,
become the single `control` keyed by the algorithm's controller, so every stored spec validates to the same
job (tests/contract/test_stored_specs.py)."""

from __future__ import annotations

from typing import Any

from contract import algorithms
from contract import control as controllers
from contract.control.stare_gate import StareGateSettings


def closed_loop_laws() -> list[str]:
    """The algorithms whose controller is a closed-loop entropy law (the names a spec may give a law)."""
    return [
        n
        for n in algorithms.names()
        if (c := algorithms.get(n).controller) and controllers.get(c).closed_loop
    ]


def migrate_control(data: Any) -> Any:
    """The one migration of the algorithm section to its single `control` (docs/ALGORITHMS.md §8): specs
    written before it set STARE's gate in `algorithm.gate`, the adaptive coefficient's target in
    `algorithm.entropy_control` (or, before that, in `gate`), and a PI law's settings in `control` without
    naming the controller; every stored spec also carries a `gate` section (with its defaults) whatever its
    algorithm. Each is read once into `control`, keyed by the algorithm's controller; a `gate` that did
    nothing (an algorithm other than STARE and adaptive_entropy) is dropped. `control` set and no algorithm
    named: the law it names when that law is an algorithm, else the default law."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    section = data.get("control")
    named = str(section.get("controller")) if isinstance(section, dict) else ""
    if "name" not in data and section is not None:
        own = named in controllers.CONTROLLERS and controllers.get(named).own_algorithm is not None
        data["name"] = named if own else controllers.DEFAULT_LAW
    try:
        law = algorithms.get(data.get("name", "stare")).controller
    except ValueError:
        return data  # the name's own validator says what is wrong
    legacy = {k: v for k in ("gate", "entropy_control") if (v := data.pop(k, None)) is not None}
    name = data.get("name", "stare")
    if "entropy_control" in legacy and law != "entropy_coef":
        raise ValueError(f"algorithm.entropy_control: algorithm {name!r} has no entropy coefficient")
    if law is None:
        if section is not None:
            raise ValueError(
                f"algorithm.control: algorithm {name!r} has no controller; name a law ({', '.join(closed_loop_laws())}), "
                f"or leave algorithm.name unset for the default ({controllers.DEFAULT_LAW})"
            )
        return data
    if section is None:
        section = _legacy_section(law, legacy)
    elif law in ("stare_gate", "entropy_coef") and legacy.keys() & {"entropy_control", "gate"} - (
        {"gate"} if law == "entropy_coef" else set()
    ):
        raise ValueError(f"algorithm.{min(legacy)}: set {name!r}'s settings in algorithm.control only")
    if isinstance(section, dict):  # a stored section from before the declarations wrote unset gains as null
        section = {"controller": law, **{k: v for k, v in section.items() if v is not None}}
    data["control"] = section
    return data


def _legacy_section(law: str, legacy: dict[str, Any]) -> Any:
    """The control section an older spec's gate or entropy_control section stands for."""
    if law == "entropy_coef":
        if "entropy_control" in legacy:
            return legacy["entropy_control"]
        gate = legacy.get("gate", {})
        if isinstance(gate, dict) and set(gate) - {"target_entropy"} and not _all_gate_defaults(gate):
            raise ValueError(
                "algorithm.gate: adaptive_entropy has no gate; set its target with "
                "algorithm.control.target_entropy"
            )
        return (
            {"target_entropy": gate["target_entropy"]}
            if isinstance(gate, dict) and "target_entropy" in gate
            else gate
        )
    if law == "stare_gate":
        return legacy.get("gate", {})
    return {}


def _all_gate_defaults(gate: dict[str, Any]) -> bool:
    """A stored spec's gate section as every spec carried it: the gate's settings at their defaults."""
    defaults = StareGateSettings().model_dump()
    return all(defaults.get(k) == v for k, v in gate.items() if k != "target_entropy")
