"""Hostile completions: strings a model (or a tenant dry-running a verifier) could produce that would run
code, hang or exhaust memory if a verifier evaluated them.

`hostile_completions(marker)` gives each string with `marker`, a path, where code that ran would create a
file: the tests assert the file never exists. Classes: Python injection (bare, in an answer tag, boxed, in a
list, through eval/exec/lambda/getattr/subclass walks), sympy and LaTeX injection (parse_expr's namespace,
\\input and \\write, sympify-able strings), huge numbers (10**10**10, 9^9^9^9, factorials, binomials), deep
nesting, and very long inputs.
"""

from __future__ import annotations

CREATE = "__import__('pathlib').Path('{m}').touch()"
SYSTEM = "__import__('os').system('touch {m}')"
OPEN = "open('{m}', 'w').write('ran')"

_TEMPLATES: dict[str, str] = {
    # Python, bare and wrapped the ways scorers extract answers
    "import_touch": CREATE,
    "import_system": SYSTEM,
    "open_write": OPEN,
    "answer_tag": "<answer>" + SYSTEM + "</answer>",
    "answer_tag_open": "<answer>" + OPEN + "</answer>",
    "boxed": "\\boxed{" + SYSTEM + "}",
    "boxed_open": "so the answer is \\boxed{" + OPEN + "}",
    "first_line_then_text": SYSTEM + "\nbecause I said so",
    "python_list": "[" + SYSTEM + ", 1, 2]",
    "python_list_of_lists": "[[1, 0], [" + CREATE + ", 1]]",
    "list_in_answer_tag": "<answer>[" + OPEN + "]</answer>",
    "tuple": "(" + CREATE + ",)",
    "dict": "{'a': " + SYSTEM + "}",
    "eval_nested": 'eval("' + SYSTEM + '")',
    "exec_string": "exec(\"import os; os.system('touch {m}')\")",
    "lambda_call": "(lambda: " + SYSTEM + ")()",
    "getattr_builtins": "getattr(__builtins__, '__import__')('os').system('touch {m}')",
    "subclass_walk": (
        "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0](['touch', '{m}'])"
    ),
    "compile_exec": "exec(compile(\"open('{m}', 'w')\", 's', 'exec'))",
    "walrus": "(x := " + SYSTEM + ")",
    "fstring": "f'{" + SYSTEM.replace("'", '"') + "}'",
    "comprehension": "[" + SYSTEM + " for _ in range(1)]",
    "arithmetic_then_code": "1 + 2 * 3 + " + SYSTEM,
    "number_then_code": "24 and " + SYSTEM,
    "sorted_list_then_code": "[1, 2, 3] + [" + OPEN + "]",
    "matrix_rows_then_code": "1 2\n3 4\n" + SYSTEM,
    "semicolon": "1; " + SYSTEM,
    "newline_statement": "1\nimport os\nos.system('touch {m}')",
    "decorator_like": "@" + SYSTEM,
    # sympy: parse_expr/sympify evaluate in a namespace holding the builtins
    "sympy_symbol_walk": "Symbol('x').__class__.__mro__[-1].__subclasses__() or " + SYSTEM,
    "sympy_integrate": "integrate(" + SYSTEM + ", x)",
    "sympy_x_plus": "x + " + SYSTEM,
    "sympy_implicit_mul": "2x + " + CREATE,
    "sympy_C_constant": "x**2/2 + C + " + OPEN,
    "sympy_lambdify": "lambdify(x, '" + SYSTEM + "')(1)",
    "sympy_S": "S('" + SYSTEM + "')",
    "sympy_sympify": 'sympify("' + SYSTEM + '")',
    # LaTeX: the parser must build expressions, never read or write files
    "latex_input": "\\boxed{\\input{" + "{m}" + "}}",
    "latex_write": "\\boxed{\\immediate\\write18{touch {m}}}",
    "latex_text_code": "\\boxed{\\text{" + SYSTEM + "}}",
    "latex_frac_code": "\\boxed{\\frac{" + SYSTEM + "}{2}}",
    "latex_dollars": "$" + SYSTEM + "$",
    "latex_mathrm": "\\boxed{\\mathrm{__import__}('os')}",
    # huge numbers: must be refused or compared in bounded time, never evaluated
    "power_tower_python": "10**10**10",
    "power_tower_latex": "\\boxed{9^{9^{9^{9}}}}",
    "power_tower_caret": "9^9^9^9",
    "boxed_huge_power": "\\boxed{10^{10^{10}}}",
    "factorial_huge": "\\boxed{(10^{100})!}",
    "binomial_huge": "\\boxed{\\binom{10^{900}}{10^{800}}}",
    "product_huge": "\\boxed{\\prod_{k=1}^{10^9} k}",
    "symbolic_power": "\\boxed{(x+1)^{999}(x-1)^{999}}",
    "long_integer": "9" * 5000,
    "long_decimal": "0." + "3" * 5000,
    "huge_exponent_float": "1e999999999",
    "answer_tag_power": "<answer>2**2**2**2**2**2</answer>",
    # deep nesting
    "deep_parentheses": "(" * 5000 + "1" + ")" * 5000,
    "deep_brackets": "[" * 3000 + "]" * 3000,
    "deep_braces_boxed": "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}",
    "deep_fractions": "\\boxed{" + "\\frac{1}{" * 400 + "2" + "}" * 400 + "}",
    "unbalanced_box": "\\boxed{" * 2000,
    # very long inputs
    "long_text": "a" * 90_000,
    "many_numbers": " ".join(str(n) for n in range(15_000)),
    "many_answer_tags": "<answer>1</answer>" * 4000,
    "many_boxes": "\\boxed{1}" * 8000,
    "long_code_line": SYSTEM + " " + "+ 1 " * 20_000,
}


def hostile_completions(marker: str) -> dict[str, str]:
    """name -> completion, with `marker` (a path) where injected code would create a file."""
    return {name: template.replace("{m}", marker) for name, template in _TEMPLATES.items()}


NAMES = sorted(_TEMPLATES)
