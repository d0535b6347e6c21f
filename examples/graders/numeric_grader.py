"""A python grader that scores a completion as the built-in `numeric` verifier does (rel_tol 1e-9,
abs_tol 1e-6): the number in the last \\boxed{} (else the last number of the completion) against the
item's numeric answer. docs/GRADERS.md walks through it; grader.json carries this file as its `source`.

It runs in the grader sandbox, once loaded per grader process: grade(sample, item) is called for every
sample. An item whose answer is not a number raises (a grader error, reported with its traceback), never
a score of 0."""

import math
import re
from fractions import Fraction

STOP = ("<eos>", "<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")
NUMBER = (
    r"(?:(?<![\w)\]}.])[-+−])?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE][-+]?\d+)?"
)
NUMBER_OR_FRACTION = re.compile(rf"({NUMBER})(?:\s*/\s*({NUMBER}))?")
LATEX_FRACTION = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")


def cut_at_stop(text):
    ends = [text.find(marker) for marker in STOP if marker in text]
    return text[: min(ends)] if ends else text


def last_boxed(text):
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start == -1:
        return None
    depth, begin = 1, text.index("{", start) + 1
    for at in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return text[begin:at]
    return None


def to_fraction(text):
    text = text.replace(",", "").replace("−", "-")
    exponent = re.search(r"[eE]([-+]?\d+)$", text)
    if exponent and abs(int(exponent.group(1))) > 400:
        raise OverflowError("exponent out of range")
    return Fraction(text)


def as_number(text):
    found = NUMBER_OR_FRACTION.fullmatch(text.strip().strip("$").strip())
    if found is None:
        return None
    try:
        top = to_fraction(found.group(1))
        bottom = to_fraction(found.group(2)) if found.group(2) else Fraction(1)
        return None if bottom == 0 else float(top / bottom)
    except (ValueError, OverflowError):
        return None


def grade(sample, item):
    reference = as_number(item["answer"])
    if reference is None:
        raise ValueError(f"the item's answer {item['answer']!r} is not a number")
    text = cut_at_stop(sample["output_text"])
    boxed = last_boxed(text)
    numbers = list(
        NUMBER_OR_FRACTION.finditer(LATEX_FRACTION.sub(r"\1/\2", text if boxed is None else boxed))
    )
    predicted = as_number(numbers[-1].group(0)) if numbers else None
    if predicted is None:
        return 0.0
    return float(math.isclose(predicted, reference, rel_tol=1e-9, abs_tol=1e-6))
