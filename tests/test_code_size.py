"""The house limits on code size: no function or method over 80 lines (from `def` to its last line,
docstring included) in the repository's Python, tests and benches (bench/) included; the repository holds
no generated Python (the client's async twin is derived at run time, stare_client/driver.py), so nothing is
excluded but the page's npm packages. And no module over 600 lines, the same files (issue 22 set it for
the trainer; issue 35 for every package, the tests and the benches)."""

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
    """Every module the function limit scans (every package, the migrations, the tests and the benches;
    trainer/engine.py sits exactly at it)."""
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
