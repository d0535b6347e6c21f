"""The tool-use environment, shaped like reset/step, and the code-generated SFT transcripts.

An episode (docs/TOOLS.md): `reset(example)` gives the prompt; each `step(turn_text)` takes one model turn
(the text of the tokens it sampled up to EOS) and answers with either a tool result to append to the
context or the end of the episode. A turn is a tool call when it starts with `(TOOL)`: TOOL is a tool's
name or its 1-based position in environment.tools, the rest of the turn is the argument. Any other turn
is the answer; so is the turn that reaches max_turns. A call naming no known tool, or with an empty
argument, is a tool error (a result saying so), never an exception. The answer is scored by the task's
verifier like a single-turn response.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from contract.spec import EnvironmentSpec
from trainer.envs.tools import TOOLS, ToolResult, calculate, format_number, tool_error
from trainer.tasks.sources import Example

if TYPE_CHECKING:  # typing only: the tool-use env itself loads no torch
    from trainer.distributed.runtime import Reduce

CALL_PATTERN = re.compile(r"\A\s*\(([A-Za-z_]\w*|\d+)\)(.*)\Z", re.S)
RESULT_SUFFIX = "\n"  # after every tool result in the context

# Per-episode counters, one column each of Rollout.tool_counts (B, len(COUNT_FIELDS)).
COUNT_FIELDS = ("calls", "errors", "timeouts", "turns", "tool_tokens", "model_tokens", "token_mismatches")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    tool: str | None  # None: the call names no tool of this environment
    argument: str
    raw_name: str


def parse_call(text: str, tools: list[str]) -> ToolCall | None:
    """The tool call a turn makes, or None when the turn is an answer."""
    match = CALL_PATTERN.match(text)
    if match is None:
        return None
    name, argument = match.group(1), match.group(2)
    tool: str | None = None
    if name.isdigit():
        index = int(name)
        tool = tools[index - 1] if 1 <= index <= len(tools) else None
    elif name in tools:
        tool = name
    return ToolCall(tool, argument, name)


@dataclasses.dataclass
class StepOutcome:
    done: bool
    observation: str | None = None  # the tool result to append (None when done)
    result: ToolResult | None = None


class ToolUseEnv:
    """One episode of the tool-use environment. Not thread-safe; one per rollout row."""

    def __init__(self, spec: EnvironmentSpec) -> None:
        self.spec = spec
        self.example: Example | None = None
        self.turns = 0
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.answer = ""
        self.done = False

    def reset(self, example: Example) -> str:
        """Starts an episode on `example`; returns the first observation (the example's prompt)."""
        self.example = example
        self.turns = self.calls = self.errors = self.timeouts = 0
        self.answer, self.done = "", False
        return example.prompt

    def step(self, turn_text: str) -> StepOutcome:
        if self.done:
            raise RuntimeError("step() after the episode ended: call reset()")
        self.turns += 1
        call = parse_call(turn_text, list(self.spec.tools))
        if call is None or self.turns >= self.spec.max_turns:
            self.answer, self.done = turn_text, True
            return StepOutcome(done=True)
        result = self.run_tool(call)
        self.calls += 1
        self.errors += int(result.error)
        self.timeouts += int(result.timeout)
        return StepOutcome(done=False, observation=result.text + RESULT_SUFFIX, result=result)

    def run_tool(self, call: ToolCall) -> ToolResult:
        if call.tool is None:
            valid = ", ".join(f"({i}) {name}" for i, name in enumerate(self.spec.tools, 1))
            return tool_error(f"unknown tool {call.raw_name!r}; this environment has {valid}")
        return TOOLS[call.tool](call.argument, self.spec.limits)


# ------------------------------------------------------------------------------------------ SFT data


def transcript(example: Example, spec: EnvironmentSpec) -> list[tuple[str, bool]]:
    """A code-generated episode for the SFT warm-start, after the prompt: (text, is a model turn) pieces.
    Each model turn ends with EOS (added by the caller). An arithmetic prompt "a*b=" with a calculator in
    the tools: "(k)a*b", the calculator's own result, then the answer; any other example: the answer."""
    tools = list(spec.tools)
    expression = example.prompt.strip()
    expression = expression[:-1] if expression.endswith("=") else expression
    if "calculator" in tools and spec.max_turns >= 2 and expression:
        try:
            value = format_number(calculate(expression))
        except ValueError:
            value = None
        if value is not None:
            index = tools.index("calculator") + 1
            return [(f"({index}){expression}", True), (value + RESULT_SUFFIX, False), (example.answer, True)]
    return [(example.answer, True)]


def episode_counts(env: ToolUseEnv, tool_tokens: int, model_tokens: int, mismatches: int) -> list[float]:
    values: dict[str, Any] = {
        "calls": env.calls,
        "errors": env.errors,
        "timeouts": env.timeouts,
        "turns": env.turns,
        "tool_tokens": tool_tokens,
        "model_tokens": model_tokens,
        "token_mismatches": mismatches,
    }
    return [float(values[name]) for name in COUNT_FIELDS]


def tool_metrics(sums: dict[str, float], episodes: float) -> dict[str, float]:
    """The step's tool/* metrics (contract.metrics) from the counters summed over the step's episodes."""
    calls = sums["calls"]
    tokens = sums["tool_tokens"] + sums["model_tokens"]
    return {
        "tool/calls_per_response": calls / max(episodes, 1.0),
        "tool/error_rate": sums["errors"] / calls if calls else 0.0,
        "tool/timeout_rate": sums["timeouts"] / calls if calls else 0.0,
        "tool/turns_per_episode": sums["turns"] / max(episodes, 1.0),
        "tool/output_token_fraction": sums["tool_tokens"] / tokens if tokens else 0.0,
        "tool/token_mismatches": sums["token_mismatches"],
    }


def reduced_tool_metrics(counts: Any, reduce: Reduce) -> dict[str, float]:
    """The tool/* metrics of a tool-use step, from the episodes' counters (B, len(COUNT_FIELDS)) summed
    over the processes by `reduce(values, "sum", dtype)`."""
    import torch

    column_sums = counts.sum(0).tolist() if counts.numel() else [0.0] * len(COUNT_FIELDS)
    totals = reduce([*column_sums, float(counts.shape[0])], "sum", torch.float64).tolist()
    return tool_metrics(dict(zip(COUNT_FIELDS, totals[:-1])), totals[-1])
