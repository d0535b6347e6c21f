"""The house limits on code size: no function or method over 80 lines (from `def` to its last line,
docstring included) in the repository's Python, tests and benches (bench/) included; the repository holds
no generated Python (the client's async twin is derived at run time, stare_client/driver.py), so nothing is
excluded but the page's npm packages. And no module over 600 lines, the same files (issue 22 set it for
the trainer; issue 35 for every package, the tests and the benches).

Tighter in the four packages that grow (issue 47, item 5): in trainer/, contract/, service/ and worker/ no
module over 500 lines and no function over 60, met by splitting along meaning, with no exception."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80
EXCLUDED_TOP = {"node_modules"}  # the page's npm packages (no Python of ours)


def _python_files() -> list[Path]:
    files = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if parts[0] in EXCLUDED_TOP or parts[0].startswith(".") or "node_modules" in parts:
            continue
        files.append(path)
    return files


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function or method in `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.name, node.lineno, length))
    return found


def test_the_scan_finds_a_long_function_and_passes_one_at_the_limit() -> None:
    def lines(n: int, indent: str) -> str:
        return "\n".join(f"{indent}x{i} = {i}" for i in range(n))

    assert long_functions(f"def long():\n{lines(LIMIT, '    ')}\n") == [("long", 1, LIMIT + 1)]
    at_limit = f"class A:\n    async def fits(self):\n{lines(LIMIT - 1, '        ')}\n"
    assert long_functions(at_limit) == []
    assert long_functions(at_limit, limit=LIMIT - 1) == [("fits", 2, LIMIT)]


def test_no_function_is_over_80_lines() -> None:
    files = _python_files()
    scanned = {path.relative_to(ROOT).parts[0] for path in files}
    # the scan reaches every package of the repository, the tests and the benches
    assert {
        "bench",
        "contract",
        "service",
        "store",
        "stare_client",
        "trainer",
        "worker",
        "migrations",
        "tests",
    } <= scanned
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in files
        for name, line, length in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "functions over 80 lines:\n" + "\n".join(offenders)


MODULE_LIMIT = 600


def test_no_module_is_over_600_lines() -> None:
    """Every module the function limit scans (every package, the migrations, the tests and the benches)."""
    modules = _python_files()
    assert ROOT / "trainer" / "engine.py" in modules
    assert ROOT / "stare_client" / "cli" / "jobs.py" in modules
    assert ROOT / "bench" / "bench_kernels.py" in modules
    over = [
        f"{path.relative_to(ROOT)} ({n} lines)"
        for path in modules
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LIMIT
    ]
    assert over == [], over


# --- room to grow (issue 47, item 5) ----------------------------------------------------------------------

# The packages held to the tighter limits: no module over 500 lines, no function or method over 60.
GROWING = ("trainer", "contract", "service", "worker")
GROWING_MODULE_LIMIT = 500
GROWING_FUNCTION_LIMIT = 60


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function and method in `source`: a method is named
    with its class (`Engine.train_step`), a nested function with its enclosing one (`outer.inner`)."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def _growing_files() -> list[Path]:
    return [path for path in _python_files() if path.relative_to(ROOT).parts[0] in GROWING]


def test_function_lengths_name_methods_with_their_class() -> None:
    source = "class A:\n    def f(self):\n        def g():\n            pass\n        return g\n\nasync def h():\n    pass\n"
    assert function_lengths(source) == [("A.f", 2, 4), ("A.f.g", 3, 2), ("h", 7, 2)]


def test_no_module_over_500_lines_in_the_packages() -> None:
    files = _growing_files()
    assert {path.relative_to(ROOT).parts[0] for path in files} == set(GROWING)
    over = [
        f"{path.relative_to(ROOT)} ({n} lines)"
        for path in files
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > GROWING_MODULE_LIMIT
    ]
    assert over == [], (
        f"modules over {GROWING_MODULE_LIMIT} lines (split them along their meaning):\n" + "\n".join(over)
    )


def test_no_function_over_60_lines_in_the_packages() -> None:
    over = []
    scanned = 0
    for path in _growing_files():
        for name, line, length in function_lengths(path.read_text(encoding="utf-8")):
            scanned += 1
            if length > GROWING_FUNCTION_LIMIT:
                over.append(f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)")
    assert scanned > 1000  # the scan read the packages' functions
    assert over == [], f"functions over {GROWING_FUNCTION_LIMIT} lines (one thing each):\n" + "\n".join(over)
