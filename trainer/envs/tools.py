"""The built-in tools: a calculator (an ast allow-list walk, never eval) and the Python code tool (run out
of process in the bubblewrap sandbox, trainer/envs/sandbox.py). Each takes the call's argument text and
returns a ToolResult; a tool never raises for what the model wrote: a bad argument is a tool error."""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
from collections.abc import Callable
from typing import Any

from contract.spec import ToolLimitsSpec
from trainer.envs import sandbox


@dataclasses.dataclass(frozen=True)
class ToolResult:
    text: str  # what goes back into the context (before the token cut)
    error: bool = False  # malformed call, exception, limit hit
    timeout: bool = False  # stopped by the CPU-time or wall-time limit (also an error)


def tool_error(message: str, *, timeout: bool = False) -> ToolResult:
    return ToolResult(f"error: {message}", error=True, timeout=timeout)


# ------------------------------------------------------------------------------------------ calculator

CALC_MAX_CHARS = 500  # longest expression accepted
CALC_MAX_NODES = 200  # most syntax-tree nodes
CALC_MAX_EXPONENT = 1000  # |b| in a ** b
CALC_MAX_DIGITS = 1000  # digits of any integer on the way (operands and results)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    pass


def _bounded(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError("only numbers are allowed")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    if isinstance(value, int) and value.bit_length() > CALC_MAX_DIGITS * 3.33:
        raise CalculatorError(f"a number exceeds {CALC_MAX_DIGITS} digits")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > CALC_MAX_EXPONENT:
        raise CalculatorError(f"exponent beyond ±{CALC_MAX_EXPONENT}")
    # |base|^|exponent| must stay within the digit bound: check the size before computing it.
    big = isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0
    if big and exponent * math.log10(abs(base)) > CALC_MAX_DIGITS:
        raise CalculatorError(f"the result exceeds {CALC_MAX_DIGITS} digits")
    try:
        result = base**exponent
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("the result is too large") from None
    if isinstance(result, complex):
        raise CalculatorError("the result is not a real number")
    return result


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _bounded(_power(left, right))
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed (numbers, + - * / // % ** and parentheses)")


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, + - * / // % **, unary ±, parentheses. Anything else
    (names, calls, attributes, comparisons) is refused, and so are results past the size bounds."""
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > CALC_MAX_CHARS:
        raise CalculatorError(f"expression longer than {CALC_MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as err:
        raise CalculatorError(f"not an expression ({type(err).__name__})") from None
    if sum(1 for _ in ast.walk(tree)) > CALC_MAX_NODES:
        raise CalculatorError(f"expression has more than {CALC_MAX_NODES} parts")
    try:
        return _evaluate(tree)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def calculator_tool(argument: str, limits: ToolLimitsSpec) -> ToolResult:
    try:
        text = format_number(calculate(argument))
    except CalculatorError as err:
        return tool_error(str(err))
    return ToolResult(text[: limits.output_bytes])


# ------------------------------------------------------------------------------------------ python


def python_tool(argument: str, limits: ToolLimitsSpec) -> ToolResult:
    """Runs the argument as a Python program in the sandbox; its stdout+stderr (cut) is the result. A
    nonzero exit, a signal, or a limit hit is a tool error; the output comes back either way."""
    if not argument.strip():
        return tool_error("empty program")
    try:
        result = sandbox.run_python(argument, limits)
    except sandbox.SandboxUnavailable as err:
        return tool_error(f"sandbox unavailable: {err}")
    output = result.output.rstrip("\n")
    if result.timed_out:
        return tool_error(
            f"time limit ({limits.cpu_seconds:g}s CPU, {limits.wall_seconds:g}s wall)", timeout=True
        )
    if result.signal is not None:
        return tool_error(f"killed by signal {result.signal}" + (f": {output[-200:]}" if output else ""))
    if result.exit_code != 0:
        last = output.splitlines()[-1] if output else f"exit code {result.exit_code}"
        return tool_error(last[-300:])
    return ToolResult(output)


TOOLS: dict[str, Callable[[str, ToolLimitsSpec], ToolResult]] = {
    "calculator": calculator_tool,
    "python": python_tool,
}
