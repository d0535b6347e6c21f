"""The multi grader's formula (contract/grader_formula.py): the grammar's precedence and functions, its
errors, and a fuzz of generated formulas and code-like strings that never executes anything (an audit
hook watches for compile, exec and process starts) and never raises anything but FormulaError: a 422
naming `calculate_output` (tests/service/test_graders_fuzz.py takes a share of them through the route)."""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from contract import grader_formula as gf
from contract.graders import GraderError, parse_grader

NAMES = frozenset({"a", "b", "name", "email"})
SCORES = {"a": 0.5, "b": 2.0, "name": 1.0, "email": 0.0}

CODE_LIKE = [
    "__import__('os').system('id')", "exec('1')", "eval('1+1')", "compile('1','x','eval')", "open('/etc/passwd')",
    "a.__class__", "a.__class__.__bases__[0].__subclasses__()", "lambda: 0", "(lambda x: x)(a)", "[x for x in a]",
    "a if b else 0", "a and b", "a or b", "not a", "a == b", "a < b", "a % b", "a // b", "a ** b", "a @ b", "a; b",
    "a\nimport os", "globals()", "locals()", "vars()", "getattr(a, 'real')", "__builtins__", "a[0]", "{a}", "{'a': 1}",
    "f'{a}'", "'a'", '"a"', "b'a'", "a = 1", "a := 1", "...", "None", "True", "print(a)", "os.system", "sys.exit()",
    "min", "max()", "abs(a, b)", "log()", "sqrt(a,)", "exp(,)", "min(a b)", "()", "(", ")", "a +", "+", "* a", "a ^",
    "1e999", "1e309 * a", "0x10", "1_000", "1.2.3", ".", "..5", "a.b", "a b", "a(b)", "a(1)", "unknown(a)", "\x00",
    "ａ", "a\u200b+b", "é", "⁹", "a+b" * 300, "(" * 40 + "a" + ")" * 40, "-" * 100 + "a", "min(" * 40 + "a" + ")" * 40,
    "a ^ b ^ a ^ b", "\\", "`a`", "$a", "#a", "a # comment", "a\tb", "", "   ", "\n",
]  # fmt: skip


def test_precedence_and_functions_follow_the_grammar() -> None:
    def value(text: str) -> float:
        return gf.evaluate(gf.parse(text, NAMES), SCORES)

    assert value("(name + email) / 2") == 0.5
    assert value("a + b * 2") == 4.5
    assert value("2 ^ 3 ^ 2") == 512.0  # right-associative
    assert value("-2 ^ 2") == -4.0  # ^ binds tighter than unary minus
    assert value("min(a, b, 3) + max(a) + abs(-b) + floor(1.5) + ceil(1.2)") == 0.5 + 0.5 + 2 + 1 + 2
    assert value("exp(0) + sqrt(4) + log(exp(1))") == pytest.approx(4.0)
    assert value("1.5e1 - .5") == 14.5
    assert gf.names_used(gf.parse("min(a, b) + 2", NAMES)) == {"a", "b"}


@pytest.mark.parametrize(
    "text", ["a / email", "log(email)", "sqrt(-b)", "b ^ 2000", "exp(1000)", "(-b) ^ 0.5"]
)
def test_a_formula_without_a_finite_value_is_an_eval_error_not_a_score(text: str) -> None:
    with pytest.raises(gf.FormulaEvalError):
        gf.evaluate(gf.parse(text, NAMES), SCORES)


def _generated(rng: random.Random, depth: int = 0) -> str:
    """A random formula over the grammar's pieces, sometimes broken on purpose."""
    if depth > 5 or rng.random() < 0.3:
        return rng.choice([*sorted(NAMES), "1", "0.5", "2e3", ".25", "bogus", "1e999"])
    kind = rng.random()
    if kind < 0.4:
        return f"{_generated(rng, depth + 1)} {rng.choice('+-*/^')} {_generated(rng, depth + 1)}"
    if kind < 0.55:
        return f"({_generated(rng, depth + 1)})"
    if kind < 0.65:
        return f"-{_generated(rng, depth + 1)}"
    if kind < 0.9:
        function = rng.choice([*gf.FUNCTIONS, "pow", "round"])
        arguments = ", ".join(_generated(rng, depth + 1) for _ in range(rng.randint(0, 3)))
        return f"{function}({arguments})"
    text = _generated(rng, depth + 1)
    cut = rng.randint(0, len(text))
    return text[:cut] + rng.choice(["(", ")", ",", "'", ".", "__", "[", "=", " import "]) + text[cut:]


def fuzz_formulas(count: int, seed: int = 7) -> list[str]:
    """CODE_LIKE and `count` distinct generated formulas."""
    rng = random.Random(seed)
    generated: dict[str, None] = {}
    while len(generated) < count:
        generated[_generated(rng)] = None
    return CODE_LIKE + list(generated)


class _Watch:
    """An audit hook that records compiles, execs and process or file starts while armed."""

    EVENTS = (
        "compile",
        "exec",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "subprocess.Popen",
        "open",
        "import",
    )

    def __init__(self) -> None:
        self.armed = False
        self.seen: list[tuple[str, Any]] = []
        sys.addaudithook(self)

    def __call__(self, event: str, args: Any) -> None:
        if self.armed and event in self.EVENTS:
            self.seen.append((event, args))

    def __enter__(self) -> _Watch:
        self.armed = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.armed = False


WATCH = _Watch()


@pytest.fixture
def watch() -> Iterator[_Watch]:
    WATCH.seen.clear()
    with WATCH:
        yield WATCH


def test_a_thousand_generated_formulas_and_code_like_strings_never_execute_anything(watch: _Watch) -> None:
    formulas = fuzz_formulas(1200)
    assert len(set(formulas)) >= 1200
    parsed = refused = 0
    leaf = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "x", "operation": "eq"}
    graders = {name: leaf for name in sorted(NAMES)}
    for text in formulas:
        try:
            tree = gf.parse(text, NAMES)
        except gf.FormulaError:
            refused += 1
        else:
            parsed += 1
            try:
                value = gf.evaluate(tree, SCORES)
            except gf.FormulaEvalError:
                continue
            assert math.isfinite(value)
        # through the grader object too: only a GraderError naming the field (the formula uses every
        # grader it names; one that leaves graders out is refused for that, on the same field)
        try:
            parse_grader({"type": "multi", "graders": graders, "calculate_output": text})
        except GraderError as err:
            assert err.field in ("grader.calculate_output",), (text, err.field)
    assert parsed > 100 and refused > 100  # both sides of the grammar are exercised
    assert watch.seen == [], watch.seen[:5]


def test_the_sizes_are_bounded() -> None:
    with pytest.raises(gf.FormulaError, match="characters long"):
        gf.parse("a+" * 2000 + "a", NAMES)
    with pytest.raises(gf.FormulaError, match="deeper"):
        gf.parse("(" * 100 + "a" + ")" * 100, NAMES)
    with pytest.raises(gf.FormulaError, match="tokens"):
        gf.parse("+".join(["a"] * 600)[:2000], NAMES)
