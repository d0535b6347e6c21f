"""The `multi` grader's formula (`calculate_output`): parsed by a hand-written recursive descent over an
allow-listed grammar into a small tree of plain values, and evaluated by walking that tree.

Nothing of the formula reaches Python's compiler: there is no eval, exec, compile or ast here, no attribute
lookup and no call but the eight functions below. A string the grammar does not produce is a FormulaError
(a ValueError) that says where it went wrong; the job spec and the routes turn it into a 422 naming
`calculate_output`.

Grammar (whitespace between tokens is ignored):

    formula  := sum
    sum      := product (("+" | "-") product)*
    product  := unary (("*" | "/") unary)*
    unary    := ("-" | "+") unary | power
    power    := atom ("^" unary)?             right-associative: 2^3^2 = 2^9, and 2^-1 = 0.5
    atom     := NUMBER | NAME | FUNCTION "(" sum ("," sum)* ")" | "(" sum ")"
    NUMBER   := digits [. digits] [(e|E) [+|-] digits]  |  . digits [...]
    NAME     := one of the multi grader's own grader names
    FUNCTION := min | max (one or more arguments) | abs | floor | ceil | exp | sqrt | log (exactly one)

`^` binds tighter than unary minus (-2^2 = -4, as in the usual notation). The size is bounded
(MAX_FORMULA_CHARS characters, MAX_TOKENS tokens, MAX_DEPTH nested levels), so parsing and evaluating take
time linear in the formula, and no recursion limit is ever reached. Evaluation is in float64 with
math.pow and the math module's functions: a domain error (log of 0, sqrt of a negative, 0/0, a negative
base to a fractional power), an overflow or a non-finite result is a FormulaEvalError, which the grader
reports as a grader error, never as a score.
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MAX_FORMULA_CHARS = 2048
MAX_TOKENS = 512
MAX_DEPTH = 32

ONE_ARGUMENT: dict[str, Callable[[float], float]] = {
    "abs": abs,
    "floor": lambda x: float(math.floor(x)),
    "ceil": lambda x: float(math.ceil(x)),
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
ANY_ARGUMENTS: dict[str, Callable[..., float]] = {"min": min, "max": max}
FUNCTIONS = (*ANY_ARGUMENTS, *ONE_ARGUMENT)
OPERATORS = "+-*/^"


class FormulaError(ValueError):
    """The formula is not one the grammar produces (or names a grader the multi grader does not have)."""


class FormulaEvalError(ArithmeticError):
    """The formula has no finite value for these scores (a domain error, an overflow, a division by 0)."""


@dataclass(frozen=True)
class Node:
    """One node of a parsed formula: kind "num" (value), "var" (name), "neg" (args[0]), an operator of
    OPERATORS (args[0], args[1]) or "call" (name, args)."""

    kind: str
    value: float = 0.0
    name: str = ""
    args: tuple[Node, ...] = ()


@dataclass(frozen=True)
class _Token:
    kind: str  # "num", "name", "op", "(", ")", ","
    text: str
    at: int  # offset in the formula


def _number_end(text: str, start: int) -> int:
    end = start
    while end < len(text) and text[end].isascii() and text[end].isdigit():
        end += 1
    if end < len(text) and text[end] == ".":
        end += 1
        while end < len(text) and text[end].isascii() and text[end].isdigit():
            end += 1
    if end < len(text) and text[end] in "eE":
        exponent = end + 1
        if exponent < len(text) and text[exponent] in "+-":
            exponent += 1
        digits = exponent
        while digits < len(text) and text[digits].isascii() and text[digits].isdigit():
            digits += 1
        if digits > exponent:
            end = digits
    return end


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char in " \t\r\n":
            position += 1
            continue
        if char.isascii() and (char.isdigit() or char == "."):
            end = _number_end(text, position)
            if text[position:end] in (".", ""):
                raise FormulaError(f"a lone '.' at character {position + 1}")
            tokens.append(_Token("num", text[position:end], position))
        elif char.isascii() and (char.isalpha() or char == "_"):
            end = position
            while end < len(text) and text[end].isascii() and (text[end].isalnum() or text[end] == "_"):
                end += 1
            tokens.append(_Token("name", text[position:end], position))
        elif char in OPERATORS:
            end = position + 1
            tokens.append(_Token("op", char, position))
        elif char in "(),":
            end = position + 1
            tokens.append(_Token(char, char, position))
        else:
            raise FormulaError(f"character {char!r} at {position + 1} is not part of a formula")
        if len(tokens) > MAX_TOKENS:
            raise FormulaError(f"a formula has at most {MAX_TOKENS} tokens")
        position = end
    return tokens


class _Parser:
    def __init__(self, tokens: list[_Token], names: frozenset[str]) -> None:
        self.tokens, self.names, self.position = tokens, names, 0

    def peek(self) -> _Token | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> _Token:
        token = self.peek()
        if token is None:
            raise FormulaError("the formula ends too early")
        self.position += 1
        return token

    def expect(self, kind: str) -> _Token:
        token = self.take()
        if token.kind != kind:
            raise FormulaError(f"expected {kind!r} at character {token.at + 1}, found {token.text!r}")
        return token

    def sum(self, depth: int) -> Node:
        node = self.product(depth)
        while (token := self.peek()) is not None and token.kind == "op" and token.text in "+-":
            self.take()
            node = Node(token.text, args=(node, self.product(depth)))
        return node

    def product(self, depth: int) -> Node:
        node = self.unary(depth)
        while (token := self.peek()) is not None and token.kind == "op" and token.text in "*/":
            self.take()
            node = Node(token.text, args=(node, self.unary(depth)))
        return node

    def unary(self, depth: int) -> Node:
        token = self.peek()
        if token is not None and token.kind == "op" and token.text in "+-":
            self.take()
            inner = self.unary(_deeper(depth))
            return Node("neg", args=(inner,)) if token.text == "-" else inner
        return self.power(depth)

    def power(self, depth: int) -> Node:
        base = self.atom(depth)
        token = self.peek()
        if token is not None and token.kind == "op" and token.text == "^":
            self.take()
            return Node("^", args=(base, self.unary(_deeper(depth))))
        return base

    def atom(self, depth: int) -> Node:
        token = self.take()
        if token.kind == "num":
            try:
                value = float(token.text)
            except ValueError:
                raise FormulaError(f"{token.text!r} at character {token.at + 1} is not a number") from None
            if not math.isfinite(value):
                raise FormulaError(f"the number {token.text!r} is out of range")
            return Node("num", value=value)
        if token.kind == "(":
            node = self.sum(_deeper(depth))
            self.expect(")")
            return node
        if token.kind == "name":
            return self.name(token, depth)
        raise FormulaError(f"unexpected {token.text!r} at character {token.at + 1}")

    def name(self, token: _Token, depth: int) -> Node:
        following = self.peek()
        if token.text in FUNCTIONS and following is not None and following.kind == "(":
            self.take()
            args = [self.sum(_deeper(depth))]
            while (separator := self.take()).kind == ",":
                args.append(self.sum(_deeper(depth)))
            if separator.kind != ")":
                raise FormulaError(f"expected ',' or ')' at character {separator.at + 1}")
            if token.text in ONE_ARGUMENT and len(args) != 1:
                raise FormulaError(f"{token.text}() takes one argument, got {len(args)}")
            return Node("call", name=token.text, args=tuple(args))
        if token.text in self.names:
            return Node("var", name=token.text)
        valid = ", ".join(sorted(self.names)) or "none"
        raise FormulaError(
            f"{token.text!r} at character {token.at + 1} is neither a grader of this multi grader "
            f"({valid}) nor a function ({', '.join(FUNCTIONS)}) called with parentheses"
        )


def _deeper(depth: int) -> int:
    if depth + 1 > MAX_DEPTH:
        raise FormulaError(f"the formula nests deeper than {MAX_DEPTH} levels")
    return depth + 1


def parse(text: object, names: frozenset[str] | set[str]) -> Node:
    """The formula's tree; FormulaError saying what is wrong (never another exception)."""
    if not isinstance(text, str):
        raise FormulaError(f"the formula must be a string, got {type(text).__name__}")
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaError(f"the formula is {len(text)} characters long; at most {MAX_FORMULA_CHARS}")
    tokens = _tokens(text)
    if not tokens:
        raise FormulaError("the formula is empty")
    parser = _Parser(tokens, frozenset(names))
    node = parser.sum(0)
    rest = parser.peek()
    if rest is not None:
        raise FormulaError(f"unexpected {rest.text!r} at character {rest.at + 1}")
    return node


def names_used(node: Node) -> set[str]:
    if node.kind == "var":
        return {node.name}
    return set().union(*(names_used(arg) for arg in node.args)) if node.args else set()


def _binary(kind: str, left: float, right: float) -> float:
    if kind == "+":
        return left + right
    if kind == "-":
        return left - right
    if kind == "*":
        return left * right
    if kind == "/":
        return left / right
    return math.pow(left, right)


def _value(node: Node, scores: Mapping[str, float]) -> float:
    if node.kind == "num":
        return node.value
    if node.kind == "var":
        return scores[node.name]
    values = [_value(arg, scores) for arg in node.args]
    if node.kind == "neg":
        return -values[0]
    if node.kind == "call":
        if node.name in ONE_ARGUMENT:
            return ONE_ARGUMENT[node.name](values[0])
        return float(ANY_ARGUMENTS[node.name](values))
    return _binary(node.kind, values[0], values[1])


def evaluate(node: Node, scores: Mapping[str, float]) -> float:
    """The formula's value for the graders' scores; FormulaEvalError when it has no finite one."""
    try:
        value = _value(node, scores)
    except (ArithmeticError, ValueError) as err:  # ZeroDivisionError, OverflowError, math domain errors
        raise FormulaEvalError(f"the formula has no value for these scores: {err}") from None
    if not math.isfinite(value):
        raise FormulaEvalError(f"the formula's value is {value} for these scores")
    return value
