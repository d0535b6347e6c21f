"""The shape of the packages, as tests: no import cycle in trainer/ or contract/ (every import counted,
those inside functions and under TYPE_CHECKING too), and a trainer root of at most 12 modules, the rest in
folders named for what they hold. Which import may go which way between the trainer's folders is
import-linter's (pyproject.toml; tests/trainer/test_layers.py runs it)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINER_ROOT_LIMIT = 12
# No cycle is allowed (the last one, the Triton kernel's guard imported back from the kernels module, is gone:
# trainer/algos/logits_grad.py holds it for both).
KNOWN_CYCLES: list[list[str]] = []


def package_modules(package: str) -> dict[str, Path]:
    """Dotted name → file of every module of `package` (a folder's __init__.py under the folder's name)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool, known: Iterable[str]) -> list[str]:
    """The modules an import statement names: `from a import b` is a.b where that is a module, else a."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the package that holds `module`
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the modules of `modules` it imports, wherever the import statement stands."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(node, name, path.name == "__init__.py", modules):
                while target not in modules and "." in target:  # a name inside a module: the module
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif successor not in index:
                index[successor] = low[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph[successor]))))
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
    return sorted(found)


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import_and_passes_a_chain() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    source = "def f():\n    from pkg.b import x\n"
    tree = ast.parse(source)
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert _imported(node, "pkg.a", False, {"pkg.a", "pkg.b"}) == ["pkg.b"]
    relative = ast.parse("from .b import y\nfrom . import b\n").body
    assert _imported(relative[0], "pkg.a", False, {"pkg.b"}) == ["pkg.b"]
    assert _imported(relative[1], "pkg.a", False, {"pkg.b"}) == ["pkg.b"]


def test_no_import_cycle_in_the_trainer_or_the_contract() -> None:
    for package in ("trainer", "contract"):
        graph = import_graph(package_modules(package))
        assert len(graph) > 10 and any(graph.values())  # the scan read the package's imports
        known = [c for c in KNOWN_CYCLES if c[0].split(".")[0] == package]
        assert cycles(graph) == known, package


def test_the_trainer_root_holds_at_most_12_modules_and_its_folders_are_packages() -> None:
    trainer = ROOT / "trainer"
    modules = sorted(p.name for p in trainer.glob("*.py"))
    assert "engine.py" in modules and "__main__.py" in modules
    assert len(modules) <= TRAINER_ROOT_LIMIT, modules
    folders = [p for p in trainer.iterdir() if p.is_dir() and any(p.glob("*.py"))]
    assert {"launch", "rollout", "policy", "run", "tasks", "distributed"} <= {p.name for p in folders}
    assert [p.name for p in folders if not (p / "__init__.py").is_file()] == []


# --- one handle on the processes ---------------------------------------------------------------------------

RUNTIME = "trainer/distributed/runtime.py"
# torch.distributed's group functions and collectives (and its reduce operations).
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast",
    "broadcast_object_list", "barrier", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather",
    "scatter", "send", "recv", "init_process_group", "destroy_process_group", "new_group", "get_rank",
    "get_world_size", "is_initialized", "get_backend", "ReduceOp",
}  # fmt: skip
# Inside trainer/distributed/, beside the runtime: the strategy hands every process rank 0's weights before
# sharding a loaded model (one broadcast per tensor, as DDP does when it wraps a model): part of laying the
# model out, which is the strategy's.
LAYOUT_CALLS = [("trainer/distributed/strategy.py", "torch.distributed.broadcast")]
SCANNED = ("trainer", "contract", "service", "worker", "store", "experiments", "monitoring", "stare_client")


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name → the dotted name it stands for, from the module's imports (wherever they stand)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def distributed_uses(source: str) -> tuple[list[str], list[str]]:
    """(the torch.distributed modules a module imports, the group functions and collectives it names)."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    imported = sorted({target for target in aliases.values() if target.startswith("torch.distributed")})
    named = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name) and not isinstance(
            getattr(node, "ctx", None), ast.Store
        ):
            dotted = _dotted(node, aliases)
            if dotted and dotted.startswith("torch.distributed.") and dotted.split(".")[2] in COLLECTIVES:
                named.append(".".join(dotted.split(".")[:3]))
    return imported, sorted(set(named))


def test_the_scan_finds_collectives_under_any_alias() -> None:
    source = (
        "import torch\nimport torch.distributed as dist\nfrom torch.distributed import barrier as b\n"
        "def f(x):\n    dist.all_reduce(x, op=dist.ReduceOp.SUM)\n    b()\n    torch.distributed.get_rank()\n"
    )
    imported, named = distributed_uses(source)
    assert imported == ["torch.distributed", "torch.distributed.barrier"]
    assert named == [
        "torch.distributed.ReduceOp", "torch.distributed.all_reduce", "torch.distributed.barrier",
        "torch.distributed.get_rank",
    ]  # fmt: skip
    assert distributed_uses("from torch.distributed.tensor import DTensor\nDTensor\n") == (
        ["torch.distributed.tensor.DTensor"],
        [],
    )


def test_one_place_calls_the_collectives_and_nothing_outside_distributed_imports_them() -> None:
    outside, calls = [], []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            imported, named = distributed_uses(path.read_text(encoding="utf-8"))
            if imported and not where.startswith("trainer/distributed/"):
                outside.append(f"{where}: {imported}")
            calls += [(where, name) for name in named]
    assert outside == []
    assert {where for where, _ in calls} - {RUNTIME} == {where for where, _ in LAYOUT_CALLS}
    assert [c for c in calls if c[0] != RUNTIME] == LAYOUT_CALLS
    assert ("trainer/distributed/runtime.py", "torch.distributed.all_reduce") in calls  # the scan saw it
    # process_group's free functions are gone: the group is joined and used through the runtime alone
    assert not (ROOT / "trainer" / "distributed" / "process_group.py").exists()


def _declared_names(node: ast.AST) -> list[str]:
    """The names an assignment (plain or annotated) or a class statement binds."""
    if isinstance(node, ast.ClassDef):
        return [node.name]
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else []
    )
    return [target.id for target in targets if isinstance(target, ast.Name)]


def test_one_reduce_type_one_reduction() -> None:
    """`Reduce` (and the reduction names) are declared once, in the runtime; every function of the trainer
    that takes a reduction takes a `Reduce`; no other object offers one."""
    declared, untyped, methods = [], [], []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            declared += [
                f"{where}:{name}" for name in _declared_names(node) if name in {"Reduce", "REDUCTIONS"}
            ]
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name in {"_reduce", "reduce"} and where != RUNTIME:
                methods.append(f"{where}:{node.lineno} {node.name}")
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                annotation = ast.unparse(arg.annotation) if arg.annotation is not None else None
                if arg.arg == "reduce" and annotation != "Reduce":
                    untyped.append(f"{where}:{node.lineno} {node.name}({arg.arg}: {annotation})")
    assert sorted(declared) == [f"{RUNTIME}:REDUCTIONS", f"{RUNTIME}:Reduce"]
    assert untyped == []
    assert methods == []


# --- placement asked in one place ---------------------------------------------------------------------------

# What placement computes on its way to an answer: the service names none of it.
PLACEMENT_INSIDES = {
    "job_memory", "memory_param", "micro_batch_tokens", "vllm_cpu_resident_bytes", "estimate_memory",
    "memory_per_device", "lora_parameters", "place", "JobNeeds", "model_shape", "builtin_model_shape",
}  # fmt: skip


def test_the_service_asks_placement_one_question_in_one_place() -> None:
    """How much memory a job needs, which worker class it fits and why not is contract.fleet.place_job's
    answer: the service calls it once (service/fleet.py) and names nothing of the arithmetic behind it."""
    insides, calls = [], []
    for path in sorted((ROOT / "service").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            dotted = _dotted(node, aliases) if isinstance(node, ast.Attribute | ast.Name) else None
            module, _, name = (dotted or "").rpartition(".")
            if (
                module in {"contract.fleet", "contract.catalog", "contract.distributed"}
                and name in PLACEMENT_INSIDES
            ):
                insides.append(f"{where}:{node.lineno} {dotted}")  # type: ignore[attr-defined]
            if isinstance(node, ast.Call) and _dotted(node.func, aliases) == "contract.fleet.place_job":
                calls.append(where)
    assert insides == []
    assert calls == ["service/fleet.py"]
