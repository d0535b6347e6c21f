"""The one error shape of the HTTP API, as the OpenAPI schema shows it (service/errors.py builds it)."""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["ErrorBody", "ErrorDetail", "ErrorResponse"]


class ErrorDetail(BaseModel):
    param: str | None = Field(default=None, description="The offending field (dotted path) or header.")
    message: str = Field(description="What is wrong, in plain words, and the fix where one is known.")
    line: int | None = Field(
        default=None, description="1-based line of an uploaded file (0: the whole file)."
    )
    code: str | None = Field(
        default=None,
        description="A spec problem: unknown_field, missing_field, wrong_type, out_of_range or invalid_value; "
        "a file line: the rule broken (wrong_type, unknown_key, ...).",
    )
    field: str | None = Field(
        default=None, description="A spec problem: the field's dotted path inside the spec (optim.lr)."
    )
    suggestion: str | None = Field(
        default=None,
        description="A spec problem: the valid name an unknown field or value most likely meant.",
    )


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. invalid_spec, not_found.")
    message: str = Field(description="What went wrong, for people.")
    param: str | None = Field(description="The offending field as a dotted path (spec.optim.lr), or null.")
    details: list[ErrorDetail] | None = Field(
        default=None,
        description="Every problem found, when there are several (spec fields, all at once; file lines).",
    )


class ErrorResponse(BaseModel):
    """The one error shape of every 4xx and 5xx response."""

    error: ErrorBody
