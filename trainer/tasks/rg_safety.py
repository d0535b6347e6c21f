"""Reasoning-gym without tenant code: the meta an example carries, the entry rebuilt from it, and the tasks
whose scorers evaluate the answer as code (refused).

Some reasoning-gym scorers hand strings to `eval()` or to sympy's `parse_expr` (which is `eval` over a
rewritten token stream, with the builtins, `__import__` included, in its namespace). Two kinds of string
reach them:

- the entry: `bitwise_arithmetic` evaluates `entry.metadata.problem`, `number_sorting` `entry.answer`. An
  entry is therefore never taken from tenant data: an example carries only what our generator needs to
  rebuild it (`META_FIELDS`: task, config, seed, size, index), and the verifier rebuilds the entry
  (`rebuild_entry`, cached) before scoring. A meta holding anything else (an `entry`) is refused, naming the
  field, in an uploaded line, a test request and the trainer alike (`check_meta`).
- the answer, i.e. the model's completion: `REFUSED_SCORERS` lists the tasks whose `score_answer` evaluates
  it, and `composite`, which scores with any task's scorer. Scoring them is refused, task by task, with an
  error naming the task; generating them (with another verifier) is not, since generators evaluate only
  strings they built.

`AUDITED_SITES` is the audit of the installed package: every call in reasoning-gym's source that evaluates a
string (`scan_eval_sites`), with the verdict for it. tests/security/test_eval_paths.py recomputes the sites
from the installed source, so an upgrade that adds one fails until it is reviewed here, and runs every
task's scorer on answers that would run code if evaluated, to show the refused list is complete.

This module imports neither torch nor reasoning_gym at import time.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.tasks import rg_config

__all__ = [
    "AUDITED_SITES",
    "META_FIELDS",
    "REFUSED_SCORERS",
    "MetaError",
    "check_meta",
    "rebuild_entry",
    "refusal",
    "scan_eval_sites",
]

META_KEY = "reasoning_gym"
META_FIELDS = ("task", "config", "seed", "size", "index")
MAX_SIZE = 1_000_000_000  # an index past this is no dataset we generate
_SCORER_EVALUATES = "its score_answer evaluates the answer as Python"
_SCORER_PARSES = "its score_answer hands the answer to sympy's parse_expr (an eval)"

# Tasks whose score_answer evaluates the completion (audit of reasoning-gym 0.1.25, AUDITED_SITES).
REFUSED_SCORERS: dict[str, str] = {
    "binary_matrix": _SCORER_EVALUATES,
    "n_queens": _SCORER_EVALUATES,
    "spiral_matrix": _SCORER_EVALUATES,
    "string_insertion": _SCORER_EVALUATES,
    "countdown": _SCORER_PARSES,
    "intermediate_integration": _SCORER_PARSES,
    "polynomial_multiplication": _SCORER_PARSES,
    "puzzle24": _SCORER_PARSES,
    "simple_integration": _SCORER_PARSES,
    "composite": "it scores with the scorer of any task it mixes, including those above",
}

# (file under reasoning_gym/, enclosing function, callee) -> verdict. "refused: t" names REFUSED_SCORERS.
AUDITED_SITES: dict[tuple[str, str, str], str] = {
    ("algebra/intermediate_integration.py", "IntermediateIntegrationDataset.score_answer", "parse_expr"): (
        "refused: intermediate_integration"
    ),
    ("algebra/polynomial_multiplication.py", "PolynomialMultiplicationDataset.score_answer", "parse_expr"): (
        "refused: polynomial_multiplication"
    ),
    ("algebra/simple_integration.py", "SimpleIntegrationDataset.score_answer", "parse_expr"): (
        "refused: simple_integration"
    ),
    ("algorithmic/binary_matrix.py", "BinaryMatrixDataset.score_answer", "eval"): "refused: binary_matrix",
    ("algorithmic/spiral_matrix.py", "SpiralMatrixDataset.score_answer", "eval"): "refused: spiral_matrix",
    ("algorithmic/string_insertion.py", "StringInsertionDataset.score_answer", "eval"): (
        "refused: string_insertion"
    ),
    ("games/countdown.py", "CountdownDataset.score_answer", "parse_expr"): "refused: countdown",
    ("games/n_queens.py", "NQueensDataset.score_answer", "eval"): "refused: n_queens",
    ("games/puzzle24.py", "Puzzle24Dataset.score_answer", "parse_expr"): "refused: puzzle24",
    ("algorithmic/number_sorting.py", "NumberSortingDataset.score_answer", "eval"): (
        "entry: evaluates entry.answer, which is rebuilt by our generator, never taken from the tenant"
    ),
    ("arithmetic/bitwise_arithmetic.py", "verify_solution", "eval"): (
        "entry: evaluates entry.metadata.problem, rebuilt by our generator; the answer goes through int()"
    ),
    ("arithmetic/bitwise_arithmetic.py", "generate_problem", "eval"): "generator: its own expression",
    ("arithmetic/basic_arithmetic.py", "eval_floordiv", "eval"): "generator: its own expression",
    ("arithmetic/gsm_symbolic/generators_00_49.py", "generate_32.generate_example", "eval"): (
        "generator: a fraction from its own list"
    ),
    ("arithmetic/gsm_symbolic/generators_50_99.py", "generate_69.generate_from_variables", "eval"): (
        "generator: a fraction from its own list"
    ),
    ("code/codeio.py", "CodeIODataset._generate_io_pair", "exec"): (
        "generator: programs from the package's own data file"
    ),
    ("logic/propositional_logic.py", "Expression.from_string", "parse_expr"): (
        "not an eval: the module's own recursive-descent parser of that name"
    ),
    ("logic/propositional_logic.py", "parse_expr", "parse_expr"): (
        "not an eval: the module's own recursive-descent parser (a recursive call)"
    ),
}


class MetaError(ValueError):
    """An example's reasoning-gym meta is not one we accept; `field` names the offending part."""

    def __init__(self, message: str, field: str, code: str = "invalid_meta") -> None:
        super().__init__(message)
        self.field = field
        # invalid_meta | invalid_config | forbidden_field (an entry, a file name) | unsafe_task (REFUSED_SCORERS)
        self.code = code


def refusal(task: str) -> str | None:
    """Why scoring `task` is refused, or None when its scorer evaluates no answer."""
    why = REFUSED_SCORERS.get(task)
    if why is None:
        return None
    return (
        f"reasoning-gym task {task!r} cannot be scored here: {why}; use another task, or another "
        "verifier (exact, numeric, math_verify)"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_meta(meta: Any, where: str = "meta.reasoning_gym") -> dict[str, Any]:
    """The canonical {task, config, seed, size, index} of an example's meta, or MetaError naming the field
    (`where` is its prefix). An `entry` is refused: entries are rebuilt, never taken from the tenant."""
    if not isinstance(meta, Mapping):
        raise MetaError(f"{where} must be an object {{{', '.join(META_FIELDS)}}}", where)
    if "entry" in meta:
        raise MetaError(
            f"{where}.entry is not accepted: the entry is rebuilt by the server's generator from "
            f"{{{', '.join(META_FIELDS)}}}, never taken from the request or the file",
            f"{where}.entry",
            "forbidden_field",
        )
    unknown = sorted(str(key) for key in meta if key not in META_FIELDS)
    if unknown:
        raise MetaError(
            f"{where}.{unknown[0]}: unknown field; valid: {', '.join(META_FIELDS)}",
            f"{where}.{unknown[0]}",
        )
    missing = [name for name in META_FIELDS if name not in meta and name != "config"]
    if missing:
        raise MetaError(f"{where}.{missing[0]} is missing", f"{where}.{missing[0]}")
    task, config = meta["task"], meta.get("config") or {}
    if not isinstance(task, str) or not task:
        raise MetaError(f"{where}.task must be a task name", f"{where}.task")
    why = refusal(task)
    if why is not None:
        raise MetaError(f"{where}.task: {why}", f"{where}.task", "unsafe_task")
    if not isinstance(config, Mapping) or {"size", "seed"} & set(config):
        raise MetaError(
            f"{where}.config must be an object of the task's params (not size or seed)", f"{where}.config"
        )
    if task not in rg_config.task_names():
        raise MetaError(f"{where}.task: unknown reasoning-gym task", f"{where}.task")
    try:  # the allow-list: no path, URL or free text reaches the generator (trainer/tasks/rg_config.py)
        config = rg_config.check_config(task, config, f"{where}.config")
    except rg_config.ConfigError as err:
        raise MetaError(str(err), err.field, err.code) from None
    seed, size, index = meta["seed"], meta["size"], meta["index"]
    if not _is_int(seed) or not 0 <= seed < 2**63:
        raise MetaError(f"{where}.seed must be an integer in [0, 2^63)", f"{where}.seed")
    if not _is_int(size) or not 1 <= size <= MAX_SIZE:
        raise MetaError(f"{where}.size must be an integer in [1, {MAX_SIZE}]", f"{where}.size")
    if not _is_int(index) or not 0 <= index < size:
        raise MetaError(f"{where}.index must be an integer in [0, size)", f"{where}.index")
    return {"task": task, "config": dict(config), "seed": seed, "size": size, "index": index}


@functools.lru_cache(maxsize=32)
def _dataset(task: str, config_json: str, seed: int, size: int) -> Any:
    import reasoning_gym

    config = rg_config.check_config(task, json.loads(config_json), "config")  # (enums back from strings)
    return reasoning_gym.create_dataset(task, size=size, seed=seed, **config)


@functools.lru_cache(maxsize=4096)
def _entry(task: str, config_json: str, seed: int, size: int, index: int) -> tuple[Any, dict[str, Any]]:
    dataset = _dataset(task, config_json, seed, size)
    return dataset, dict(dataset[index])


def rebuild_entry(meta: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The dataset (for its score_answer) and the entry our generator makes for a checked meta (cached).
    Raises ValueError for a task or config the generator refuses, naming the task."""
    task, config_json = meta["task"], json.dumps(meta["config"], sort_keys=True)
    try:
        dataset, entry = _entry(task, config_json, meta["seed"], meta["size"], meta["index"])
    except Exception as exc:  # reasoning-gym raises all kinds on bad configs (N7): the tenant's params
        # A stable message: what the generator said may name files or paths (issue 44, R1).
        raise ValueError(f"reasoning-gym task {task!r} cannot generate with this config") from exc
    return dataset, copy.deepcopy(entry)  # a scorer that changes its entry changes no cached one


# --- the audit --------------------------------------------------------------------------------------------

_EVAL_NAMES = frozenset(
    {"eval", "exec", "compile", "__import__", "parse_expr", "sympify", "S", "parse_latex"}
)
_EVAL_ATTRIBUTES = frozenset({"parse_expr", "sympify", "parse_latex", "unsafe_load", "full_load"})
_LOADER_MODULES = frozenset({"pickle", "cPickle", "dill", "marshal", "yaml", "shelve", "jsonpickle"})


def scan_eval_sites(package_root: Path) -> set[tuple[str, str, str]]:
    """Every call in the package's source that evaluates or unpickles a string: (file, function, callee)."""
    found: set[tuple[str, str, str]] = set()
    for path in sorted(package_root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        relative = path.relative_to(package_root).as_posix()
        found.update((relative, scope, callee) for scope, callee in _calls(tree, ()))
    return found


def _calls(node: ast.AST, scope: tuple[str, ...]) -> list[tuple[str, str]]:
    """(enclosing function, callee) of every eval-like call under `node`."""
    calls = []
    for child in ast.iter_child_nodes(node):
        inner = scope
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = (*scope, child.name)
        if isinstance(child, ast.Call):
            callee = _callee(child.func)
            if callee is not None:
                calls.append((".".join(scope) or "<module>", callee))
        calls.extend(_calls(child, inner))
    return calls


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name) and func.id in _EVAL_NAMES:
        return func.id
    if isinstance(func, ast.Attribute):
        if func.attr in _EVAL_ATTRIBUTES:
            return func.attr
        loader = isinstance(func.value, ast.Name) and func.value.id in _LOADER_MODULES
        if loader and func.attr in {"load", "loads", "Unpickler"}:
            return f"{func.value.id}.{func.attr}"  # type: ignore[attr-defined]
    return None
