"""Writes a JSONL file of word problems with numeric answers: what a user's own data looks like.

    python examples/own_data/make_data.py --out /tmp/own_data/problems.jsonl   # 200 lines, seed 0

One line per problem: {"prompt": "...", "answer": "12"}. The answer is a string (quote numbers: an upload
whose answer is a JSON number is refused), the number alone; the numeric verifier scores the last number
of the model's response against it. Made by code, so nothing is committed but this script.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ("Tom", "Ana", "Lee", "Mia", "Sam", "Ola", "Raj", "Eva", "Ben", "Zoe")
THINGS = ("apples", "pencils", "stickers", "marbles", "books", "coins", "cards", "shells")

# (question, how the answer follows from a and b); every answer is a whole number ≥ 0
TEMPLATES = (
    ("{n} has {a} {t} and gets {b} more. How many {t} does {n} have now?", lambda a, b: a + b),
    ("{n} had {a} {t} and then found {b} more. How many {t} does {n} have?", lambda a, b: a + b),
    (
        "There are {a} {t} in one box and {b} {t} in another. How many {t} are there in all?",
        lambda a, b: a + b,
    ),
    ("{n} has {c} {t} and gives away {b}. How many {t} are left?", lambda a, b: a),
)


def problem(rng: random.Random) -> dict[str, str]:
    a, b = rng.randint(0, 20), rng.randint(1, 20)
    text, answer = rng.choice(TEMPLATES)
    prompt = text.format(n=rng.choice(NAMES), t=rng.choice(THINGS), a=a, b=b, c=a + b)
    return {"prompt": prompt, "answer": str(answer(a, b))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("problems.jsonl"))
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    seen: set[str] = set()
    lines = []
    while len(lines) < args.lines:
        item = problem(rng)
        if item["prompt"] not in seen:  # distinct prompts: the held-out split needs them
            seen.add(item["prompt"])
            lines.append(json.dumps(item))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(lines)} lines")


if __name__ == "__main__":
    main()
