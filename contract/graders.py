"""Tenant graders in the job spec: the shapes and field names of OpenAI's fine-tuning graders (python,
string_check, text_similarity, multi), the limits a python grader runs under, and how a job grades
(`GradingSpec`). docs/GRADERS.md has a worked example of each.

A job names either a built-in verifier (`verifier`) or a grader (`grader`); with a grader, a sample's
reward is the grader's score (a finite float: anything else is a grader error, never a reward) and it
passes (reward/accuracy, eval accuracy) when the score reaches the grader's pass_threshold (1.0 when it
sets none). What runs where is the trainer's (trainer/graders/): string_check and the multi formula in the
trainer's process (plain string comparison and contract.grader_formula), python and text_similarity in
sandboxed processes of the grader environment (its own pinned packages: rapidfuzz, sacrebleu, nltk,
rouge-score, numpy and the rest).

`parse_grader` validates a grader object and reports the first problem as GraderError with the dotted
path of the field (grader.graders.name.input, grader.calculate_output): the routes and the job spec turn
it into a 422 naming that field. score_model and label_model need a model to grade with and are refused
by name. Standard library and pydantic only.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from contract import grader_formula, grader_templates

MAX_SOURCE_BYTES = 256 * 1024  # OpenAI's limit on a python grader's source
MAX_MULTI_GRADERS = 16
# OpenAI's python grader limits, the defaults here; an operator lowers the ceilings (STARE_GRADER_MAX_*).
DEFAULT_TIMEOUT_S = 120.0  # 2 minutes: one sample's grading (and loading the source)
DEFAULT_MEMORY_MB = 2048  # 2 GB of address space per grader process
DEFAULT_DISK_MB = 1024  # 1 GB of scratch disk (a tmpfs) per grader process
# The python grader image OpenAI documents; this server has one grader environment, which stands for it.
IMAGE_TAGS = ("2025-05-08",)
SIMILARITY_METRICS = (
    "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l",
)  # fmt: skip
STRING_OPERATIONS = ("eq", "ne", "like", "ilike")
MODEL_GRADERS = ("score_model", "label_model")
LEAF_TYPES = ("python", "string_check", "text_similarity")
GRADER_TYPES = (*LEAF_TYPES, "multi")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class GraderError(ValueError):
    """A grader object the server cannot run; `field` is the dotted path of the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Name = Annotated[str, Field(min_length=1, max_length=256)]
Threshold = Annotated[float, Field(ge=-1e12, le=1e12)]


def _template(value: str) -> str:
    try:
        return grader_templates.check(value)
    except grader_templates.TemplateError as err:
        raise ValueError(str(err)) from None


class PythonGrader(_Strict):
    """`source` defines grade(sample, item) -> float; it runs only in the grader sandbox."""

    type: Literal["python"]
    name: Name | None = None
    source: str
    image_tag: str | None = None
    pass_threshold: Threshold | None = None

    @field_validator("source")
    @classmethod
    def _size(cls, value: str) -> str:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_SOURCE_BYTES:
            raise ValueError(f"the source is {size} bytes; at most {MAX_SOURCE_BYTES} (256 kB)")
        if "\x00" in value:
            raise ValueError("the source contains a NUL character")
        if not value.strip():
            raise ValueError("the source is empty; it must define grade(sample, item)")
        return value

    @field_validator("image_tag")
    @classmethod
    def _tag(cls, value: str | None) -> str | None:
        if value is not None and value not in IMAGE_TAGS:
            raise ValueError(f"unknown image_tag {value!r}; this server offers {', '.join(IMAGE_TAGS)}")
        return value


class StringCheckGrader(_Strict):
    """eq / ne: the rendered input equals / differs from the rendered reference; like / ilike: the
    reference occurs in the input (ilike ignoring case). Scores 1.0 or 0.0."""

    type: Literal["string_check"]
    name: Name | None = None
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"]
    pass_threshold: Threshold | None = None

    @field_validator("input", "reference")
    @classmethod
    def _templates(cls, value: str) -> str:
        return _template(value)


class TextSimilarityGrader(_Strict):
    """The similarity of the rendered input to the rendered reference under `evaluation_metric`, in
    [0, 1], computed by the grader environment's libraries (docs/GRADERS.md names which metric comes
    from which)."""

    type: Literal["text_similarity"]
    name: Name | None = None
    input: str
    reference: str
    evaluation_metric: Literal[
        "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"
    ]  # fmt: skip
    pass_threshold: Threshold | None = None

    @field_validator("input", "reference")
    @classmethod
    def _templates(cls, value: str) -> str:
        return _template(value)


LeafGrader = Annotated[PythonGrader | StringCheckGrader | TextSimilarityGrader, Field(discriminator="type")]


class MultiGrader(_Strict):
    """Named graders, combined by the `calculate_output` formula over their scores
    (contract.grader_formula: + - * / ^ and min, max, abs, floor, ceil, exp, sqrt, log)."""

    type: Literal["multi"]
    name: Name | None = None
    graders: Annotated[dict[str, LeafGrader], Field(min_length=1, max_length=MAX_MULTI_GRADERS)]
    calculate_output: str
    pass_threshold: Threshold | None = None

    @field_validator("graders")
    @classmethod
    def _keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _KEY.fullmatch(key):
                raise ValueError(
                    f"grader name {key[:80]!r} must be an identifier (letters, digits and _; a formula names it)"
                )
        return value

    @field_validator("calculate_output")
    @classmethod
    def _formula(cls, value: str, info: ValidationInfo) -> str:
        graders = info.data.get("graders")
        if graders is None:  # they failed their own validation, which is reported
            return value
        tree = grader_formula.parse(value, set(graders))  # FormulaError is a ValueError
        unused = sorted(set(graders) - grader_formula.names_used(tree))
        if unused:
            raise ValueError(f"the formula does not use the grader(s) {', '.join(unused)}")
        return value

    def formula(self) -> grader_formula.Node:
        return grader_formula.parse(self.calculate_output, set(self.graders))


Grader = Annotated[
    PythonGrader | StringCheckGrader | TextSimilarityGrader | MultiGrader, Field(discriminator="type")
]
AnyGrader = PythonGrader | StringCheckGrader | TextSimilarityGrader | MultiGrader


def leaves(grader: AnyGrader) -> dict[str, PythonGrader | StringCheckGrader | TextSimilarityGrader]:
    """The graders that score a sample: a multi grader's by name; a single grader under the name ""."""
    if isinstance(grader, MultiGrader):
        return dict(grader.graders)
    return {"": grader}


def runs_in_sandbox(grader: AnyGrader) -> bool:
    """Whether grading needs the sandboxed grader processes (python or text_similarity inside)."""
    return any(leaf.type in ("python", "text_similarity") for leaf in leaves(grader).values())


def pass_threshold(grader: AnyGrader) -> float:
    return 1.0 if grader.pass_threshold is None else float(grader.pass_threshold)


class GraderLimitsSpec(_Strict):
    """What one sandboxed grader process may use (OpenAI's python grader limits are the defaults and the
    ceilings; an operator may lower the ceilings: STARE_GRADER_MAX_*). One CPU each: the process runs
    one sample at a time, with its numerical libraries held to one thread."""

    timeout_s: Annotated[float, Field(gt=0.0, le=DEFAULT_TIMEOUT_S)] = DEFAULT_TIMEOUT_S  # per sample
    memory_mb: Annotated[int, Field(ge=128, le=DEFAULT_MEMORY_MB)] = DEFAULT_MEMORY_MB  # RLIMIT_AS
    disk_mb: Annotated[int, Field(ge=1, le=DEFAULT_DISK_MB)] = DEFAULT_DISK_MB  # its scratch tmpfs
    processes: Annotated[int, Field(ge=1, le=256)] = 16  # threads and processes in one sandbox
    output_bytes: Annotated[int, Field(ge=0, le=65_536)] = 4096  # stdout+stderr kept per sample


class GradingSpec(_Strict):
    """How a job with a `grader` grades (docs/GRADERS.md): the warm pool of sandboxed grader processes,
    their limits, when grader errors end the job, and whether loophole warnings refuse it."""

    workers: Annotated[int, Field(ge=1, le=32)] = 2  # grader processes of the job's pool
    limits: GraderLimitsSpec = Field(default_factory=GraderLimitsSpec)
    # The job ends grader_failed when more than this share of the last `error_window` graded samples
    # failed (an exception, a timeout, a value that is not a finite number).
    max_error_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    error_window: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    refuse_loopholes: bool = False  # refuse the job when the loophole check warns (else: warnings only)


def _dotted(prefix: str, loc: tuple[Any, ...]) -> str:
    parts = [prefix]
    skip_tag = False
    for index, part in enumerate(loc):
        if skip_tag:  # the discriminated union's tag (the grader's type) after a multi grader's key
            skip_tag = False
            if part in LEAF_TYPES:
                continue
        if isinstance(part, int):
            parts[-1] += f"[{part}]"
            continue
        parts.append(str(part))
        if index > 0 and loc[index - 1] == "graders":
            skip_tag = True
    return ".".join(parts)


def _clean(message: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def parse_grader(data: object, where: str = "grader") -> AnyGrader:
    """The grader object `data`, or GraderError naming the field (`where` prefixes the path)."""
    if not isinstance(data, dict):
        raise GraderError(where, f"a grader is an object with a type, got {type(data).__name__}")
    kind = data.get("type")
    if kind in MODEL_GRADERS:
        raise GraderError(
            f"{where}.type",
            f"{kind} graders need a model to grade with; this server runs {', '.join(GRADER_TYPES)}",
        )
    models: dict[str, type[BaseModel]] = {
        "python": PythonGrader,
        "string_check": StringCheckGrader,
        "text_similarity": TextSimilarityGrader,
        "multi": MultiGrader,
    }
    if not isinstance(kind, str) or kind not in models:
        raise GraderError(f"{where}.type", f"unknown grader type {kind!r}; valid: {', '.join(GRADER_TYPES)}")
    if kind == "multi":
        inner = data.get("graders")
        if isinstance(inner, dict):
            for key, leaf in inner.items():
                if isinstance(leaf, dict) and leaf.get("type") in (*MODEL_GRADERS, "multi"):
                    raise GraderError(
                        f"{where}.graders.{key}.type",
                        f"a multi grader combines {', '.join(LEAF_TYPES)} graders, not {leaf.get('type')}",
                    )
    try:
        parsed = models[kind].model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        raise GraderError(_dotted(where, tuple(first["loc"])), _clean(first["msg"])) from None
    assert isinstance(parsed, PythonGrader | StringCheckGrader | TextSimilarityGrader | MultiGrader)
    return parsed


def check_job(
    grader: AnyGrader | None, grading: GradingSpec | None, *, verifier_set: bool, style: str
) -> None:
    """A job spec's grader fields together with the rest (ValueError naming the field): a grader replaces
    the verifier (the two are not combined), its score is the reward (reward.style binary: pm1 would need a
    score in [0, 1]), and grading settings need a grader."""
    if grader is None:
        if grading is not None:
            raise ValueError("grading: set only with a grader (grader)")
        return
    if verifier_set:
        raise ValueError("verifier: a job is rewarded by a verifier or by a grader, not both; remove one")
    if style != "binary":
        raise ValueError("reward.style: with a grader the reward is the grader's score; leave style binary")
