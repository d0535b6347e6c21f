"""Dataset uploads: a multipart body streamed to a staged file with a byte limit, then checked line by line.

The body is parsed as it arrives (python-multipart's push parser), so an oversize upload is cut off at the
limit with 413 and never held in memory or written past the limit. The staged file is then checked with
trainer.tasks.sources.jsonl_errors (the check the trainer runs when it loads the file; here strict about
keys too: prompt, answer and meta only), every line read one at a time with a cap on its length; the
problems are counted and grouped by kind with their fix (FileProblems) for the 422. A reasoning-gym meta
names a task and config the trainer will generate from: each distinct (task, config) is generated once, in
the API's child processes within their budget (`check_reasoning_gym_configs`), so a config that fails or
never ends is a line error now, not a hung job. Nothing is stored unless every check passes: the staged file is removed on any rejection, and the
route inserts the row only after the file was moved into place.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import anyio.to_thread
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from contract import safejson
from service import job_specs
from service.errors import BadRequest, PayloadTooLarge, Unprocessable, UnsupportedMediaType
from service.offload import BudgetExceeded, CallError, ChildFailed, ChildPool, QueueBusy
from service.offload import Unavailable as PoolUnavailable
from store.models import FILE_PURPOSES
from trainer.tasks import sources
from trainer.tasks.sources import LineError, jsonl_errors

MAX_FIELD_BYTES = 1024
MULTIPART_OVERHEAD_BYTES = 64 * 1024  # headers and boundaries around the file part
GROUPS_IN_MESSAGE = 5  # kinds of problem said in an invalid file's message
LINES_PER_GROUP = 5  # line numbers shown for each
# Problems whose message is the same on every line it occurs on (no column, no offset): grouped by message.
_SAME_MESSAGE_EVERY_LINE = frozenset(
    {"missing_field", "wrong_type", "empty_field", "unknown_key", "not_object", "line_too_long"}
)
MAX_REASONING_GYM_CONFIGS = 16  # distinct (task, config) pairs one file may name
_CONFIG_FIELD = "meta.reasoning_gym.config"
_UNSAFE_FILENAME = re.compile(r"[\x00-\x1f\x7f/\\]")


@dataclass
class ReceivedUpload:
    filename: str
    purpose: str
    size: int
    sha256: str


@dataclass
class _Part:
    headers: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    filename: str | None = None
    value: bytearray = field(default_factory=bytearray)


class _MultipartSink:
    """Callbacks for MultipartParser: the `file` part goes to disk, small fields to memory."""

    def __init__(self, out: BinaryIO, max_bytes: int) -> None:
        self.out = out
        self.max_bytes = max_bytes
        self.size = 0
        self.digest = hashlib.sha256()
        self.part = _Part()
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.seen_file = False
        self.finished = False

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": lambda data, start, end: self.header_field.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self.header_value.extend(data[start:end]),
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self.part = _Part()

    def on_header_end(self) -> None:
        name = self.header_field.decode("latin-1").strip().lower()
        self.part.headers[name] = self.header_value.decode("latin-1").strip()
        self.header_field.clear()
        self.header_value.clear()

    def on_headers_finished(self) -> None:
        disposition, options = parse_options_header(self.part.headers.get("content-disposition", ""))
        if disposition != b"form-data" or b"name" not in options:
            raise BadRequest("each multipart part needs 'Content-Disposition: form-data; name=...'")
        self.part.name = options[b"name"].decode("utf-8", errors="replace")
        if b"filename" in options:
            self.part.filename = options[b"filename"].decode("utf-8", errors="replace")
        if self.part.name == "file":
            if self.seen_file:
                raise Unprocessable("send exactly one file part", param="file")
            self.seen_file = True
            self.filename = self.part.filename or "upload.jsonl"
        elif self.part.name != "purpose":
            raise Unprocessable(f"unknown form field {self.part.name!r}", param=self.part.name)

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.part.name == "file":
            self.size += len(chunk)
            if self.size > self.max_bytes:
                raise PayloadTooLarge(
                    f"the file is larger than the limit of {self.max_bytes} bytes",
                    param="file",
                    code="file_too_large",
                )
            self.digest.update(chunk)
            self.out.write(chunk)
        else:
            self.part.value.extend(chunk)
            if len(self.part.value) > MAX_FIELD_BYTES:
                raise Unprocessable(f"form field {self.part.name!r} is too long", param=self.part.name)

    def on_part_end(self) -> None:
        if self.part.name is not None and self.part.name != "file":
            if self.part.name in self.fields:
                raise Unprocessable(f"form field {self.part.name!r} given twice", param=self.part.name)
            try:
                self.fields[self.part.name] = self.part.value.decode("utf-8")
            except UnicodeDecodeError:
                raise Unprocessable(
                    f"form field {self.part.name!r} is not UTF-8", param=self.part.name
                ) from None

    def on_end(self) -> None:
        self.finished = True


def multipart_boundary(content_type: str | None) -> bytes:
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data":
        raise UnsupportedMediaType("upload the file as multipart/form-data with a 'file' part", param="file")
    boundary = options.get(b"boundary")
    if not boundary or len(boundary) > 200:
        raise BadRequest("the multipart Content-Type has no usable boundary", param="file")
    return boundary


def check_declared_length(content_length: str | None, max_bytes: int) -> None:
    """Refuse early when Content-Length already says the body is over the limit."""
    if content_length is None:
        return
    try:
        declared = int(content_length)
    except ValueError:
        raise BadRequest("Content-Length is not a number") from None
    if declared > max_bytes + MULTIPART_OVERHEAD_BYTES:
        raise PayloadTooLarge(
            f"the file is larger than the limit of {max_bytes} bytes", param="file", code="file_too_large"
        )


async def receive_upload(
    chunks: AsyncIterator[bytes], boundary: bytes, staged: Path, *, max_bytes: int
) -> ReceivedUpload:
    """Stream the multipart body into `staged`; raises 413 at the limit, 400/422 for a malformed form."""
    with staged.open("wb") as out:
        sink = _MultipartSink(out, max_bytes)
        parser = MultipartParser(boundary, sink.callbacks())  # type: ignore[arg-type]
        try:
            async for chunk in chunks:
                if chunk:
                    parser.write(chunk)
            parser.finalize()
        except MultipartParseError as err:
            raise BadRequest(f"malformed multipart body: {err}", param="file") from None
    if not sink.finished:
        raise BadRequest("the multipart body ended before its closing boundary", param="file")
    if not sink.seen_file:
        raise Unprocessable("the form has no 'file' part", param="file")
    purpose = sink.fields.get("purpose", "rl_train")
    if purpose not in FILE_PURPOSES:
        raise Unprocessable(f"purpose must be one of {', '.join(FILE_PURPOSES)}", param="purpose")
    return ReceivedUpload(
        filename=clean_filename(sink.filename or "upload.jsonl"),
        purpose=purpose,
        size=sink.size,
        sha256=sink.digest.hexdigest(),
    )


def clean_filename(name: str) -> str:
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = _UNSAFE_FILENAME.sub("_", base).strip() or "upload.jsonl"
    return base[:255]


# --------------------------------------------------------------------------------------------- validation


def _capped_lines(fh: BinaryIO, max_line_bytes: int, too_long: list[int]) -> Iterator[bytes]:
    """Lines of fh, each read with a cap; an over-long line is skipped (and its number recorded)."""
    number = 0
    while True:
        line = fh.readline(max_line_bytes + 1)
        if not line:
            return
        number += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            too_long.append(number)
            while True:
                rest = fh.readline(max_line_bytes)
                if not rest or rest.endswith(b"\n"):
                    break
            yield b""
            continue
        yield line


@dataclass
class _Group:
    """Problems of one kind: how many, the first, and the first few line numbers."""

    first: LineError
    count: int = 0
    lines: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        if self.first.line == 0:
            return self.first.message
        if self.count == 1:
            return str(self.first)  # line N: what
        shown = ", ".join(map(str, self.lines)) + (", …" if self.count > len(self.lines) else "")
        where = f"{self.count} lines ({shown})"
        if self.first.code in _SAME_MESSAGE_EVERY_LINE:
            return f"{where}: {self.first.message}"
        return f"{where}, the first: {self.first.message}"


@dataclass
class FileProblems:
    """What is wrong with a file: the first `max_errors` problems in full (the 422's details) and, over every
    line, how many fail and the problems grouped by kind (`200 lines (1, 2, 3, 4, 5, …): answer must be a
    string, not a number: quote it`), so a file wrong the same way on every line says so once, with the fix."""

    max_errors: int
    errors: list[LineError] = field(default_factory=list)
    failing_lines: int = 0
    groups: dict[tuple[str, str | None, str], _Group] = field(default_factory=dict)
    _last_line: int = 0

    @classmethod
    def of(cls, errors: list[LineError]) -> FileProblems:
        problems = cls(max_errors=len(errors))
        for error in errors:
            problems.add(error)
        return problems

    def __bool__(self) -> bool:
        return bool(self.errors)

    def add(self, error: LineError) -> None:
        """Count one problem; problems arrive in line order."""
        if len(self.errors) < self.max_errors:
            self.errors.append(error)
        if error.line and error.line != self._last_line:
            self.failing_lines += 1
            self._last_line = error.line
        same = error.code in _SAME_MESSAGE_EVERY_LINE
        group = self.groups.setdefault(
            (error.code, error.field, error.message if same else ""), _Group(error)
        )
        group.count += 1
        if len(group.lines) < LINES_PER_GROUP:
            group.lines.append(error.line)

    def summary(self) -> str:
        """The kinds of problem, the most frequent first."""
        groups = sorted(self.groups.values(), key=lambda g: -g.count)
        more = len(groups) - GROUPS_IN_MESSAGE
        return "; ".join(map(str, groups[:GROUPS_IN_MESSAGE])) + (
            f"; and {more} other kinds of problem" if more > 0 else ""
        )


def validate_jsonl(path: Path, *, max_line_bytes: int, max_errors: int) -> tuple[int, FileProblems]:
    """(records, problems) of a staged JSONL file, every line scanned; no problems means the trainer can
    load it."""
    too_long: list[int] = []
    records = 0

    def counted(lines: Iterator[bytes]) -> Iterator[bytes]:
        nonlocal records
        for line in lines:
            records += bool(line.strip())
            yield line

    problems = FileProblems(max_errors=max_errors)
    with path.open("rb") as fh:
        for error in jsonl_errors(counted(_capped_lines(fh, max_line_bytes, too_long))):
            if not (too_long and error.code == "empty_file"):  # its lines were there, too long
                problems.add(error)
    long_lines = [
        LineError(n, "line_too_long", f"line is longer than {max_line_bytes} bytes") for n in too_long
    ]
    for error in long_lines:  # an over-long line was read as blank: it has no other problem
        problems.add(error)
    problems.errors = sorted({*problems.errors, *long_lines}, key=lambda e: e.line)[:max_errors]
    return records, problems


def invalid_file(problems: FileProblems | list[LineError]) -> Unprocessable:
    """422 invalid_file: how many lines fail and why, grouped, in the message; the first lines in details."""
    if isinstance(problems, list):
        problems = FileProblems.of(problems)
    failing = problems.failing_lines
    count = (
        f"{failing} line{'s' if failing != 1 else ''} fail{'s' if failing == 1 else ''}: " if failing else ""
    )
    return Unprocessable(
        f"the file is not valid JSONL for training: {count}{problems.summary()}",
        param="file",
        code="invalid_file",
        details=[
            {"line": e.line, "code": e.code, "message": e.message, "param": e.field} for e in problems.errors
        ],
    )


def reasoning_gym_configs(
    path: Path, *, max_line_bytes: int
) -> tuple[list[tuple[int, str, Any]], list[LineError]]:
    """(first line, task, config) of each distinct reasoning-gym (task, config) in a valid staged file, and
    line errors for unknown task names."""
    found: dict[tuple[str, str], tuple[int, str, Any]] = {}
    errors = []
    with path.open("rb") as fh:
        for number, raw in enumerate(_capped_lines(fh, max_line_bytes, []), start=1):
            if sources.REASONING_GYM_META_KEY.encode() not in raw:
                continue
            record = safejson.loads(raw.decode("utf-8").removeprefix("\ufeff"))
            meta = record.get("meta", {}).get(sources.REASONING_GYM_META_KEY)
            if meta is None:
                continue
            config = meta.get("config") or {}
            key = (meta["task"], json.dumps(config, sort_keys=True))
            if key in found:
                continue
            try:
                sources.check_reasoning_gym_task(meta["task"])
            except ValueError as err:
                errors.append(LineError(number, "invalid_meta", str(err), "meta.reasoning_gym.task"))
                continue
            found[key] = (number, meta["task"], config)
    return list(found.values()), errors


async def check_reasoning_gym_configs(
    path: Path, pool: ChildPool, *, max_line_bytes: int, tenant: str = ""
) -> list[LineError]:
    """Line errors for the reasoning-gym configs of a valid staged file that do not generate within the
    budget (service/offload.py); [] when all do or the file names none."""
    configs, errors = await anyio.to_thread.run_sync(
        lambda: reasoning_gym_configs(path, max_line_bytes=max_line_bytes)
    )
    if len(configs) > MAX_REASONING_GYM_CONFIGS:
        number = configs[MAX_REASONING_GYM_CONFIGS][0]
        message = (
            f"more than {MAX_REASONING_GYM_CONFIGS} distinct reasoning-gym (task, config) pairs in one file"
        )
        return [*errors, LineError(number, "too_many_configs", message, _CONFIG_FIELD)]
    for number, task, config in configs:
        try:
            await pool.run("generate", "reasoning_gym", task, 0, config, phase=_CONFIG_FIELD, tenant=tenant)
        except (QueueBusy, PoolUnavailable) as err:
            raise job_specs.pool_refusal(err) from None
        except BudgetExceeded as err:
            errors.append(
                LineError(number, "budget_exceeded", f"task {task!r} with this config: {err}", _CONFIG_FIELD)
            )
        except (CallError, ChildFailed) as err:
            errors.append(LineError(number, "invalid_meta", str(err), _CONFIG_FIELD))
    return sorted(errors, key=lambda error: error.line)
