"""An upload's errors (issue 46, item 3): how many lines fail and why, grouped by kind with the fix, every
line scanned past the detail cap, and an unknown key refused by name with the key it stands for."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from tests.service.conftest import TenantKey
from tests.service.helpers import upload
from tests.service.test_errors import assert_error
from tests.service.test_files import stored_files


def lines(records: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_numeric_answers_on_every_line_are_counted_once_with_the_fix(
    make_client: Callable[..., TestClient], tenant: TenantKey, tmp_path: Path
) -> None:
    client = make_client(artifact_root=tmp_path / "art", max_file_errors=20)
    content = lines([{"prompt": f"{i}+1=", "answer": i + 1} for i in range(200)])
    error = assert_error(upload(client, tenant.headers, content), 422, "invalid_file", "file")
    message = error["message"]
    assert "200 lines fail" in message, message
    assert "200 lines (1, 2, 3, 4, 5, …): answer must be a string, not a number: quote it" in message
    assert "more)" not in message  # every line counted, not "(and 15 more)"
    assert len(error["details"]) == 20  # the detail cap
    assert {(d["code"], d["param"]) for d in error["details"]} == {("wrong_type", "answer")}
    assert stored_files(tmp_path / "art") == []


def test_an_unknown_key_is_refused_by_name_with_what_it_stands_for(
    make_client: Callable[..., TestClient], tenant: TenantKey, tmp_path: Path
) -> None:
    client = make_client(artifact_root=tmp_path / "art")
    content = lines([{"question": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4", "source": "x"}])
    error = assert_error(upload(client, tenant.headers, content), 422, "invalid_file", "file")
    assert [(d["line"], d["code"], d["param"]) for d in error["details"]] == [
        (1, "unknown_key", "question"),
        (2, "unknown_key", "source"),
    ]
    assert error["details"][0]["message"] == "unknown key `question`; did you mean `prompt`?"
    assert "2 lines fail" in error["message"]
    assert "line 1: unknown key `question`; did you mean `prompt`?" in error["message"]


def test_kinds_of_problem_are_grouped_the_most_frequent_first(
    make_client: Callable[..., TestClient], tenant: TenantKey, tmp_path: Path
) -> None:
    client = make_client(artifact_root=tmp_path / "art")
    good = {"prompt": "1+1=", "answer": "2"}
    content = lines([good, {"prompt": "x"}, {"prompt": "y"}, {"prompt": "z"}, good]) + b"{oops\n[1]\n{x\n"
    error = assert_error(upload(client, tenant.headers, content), 422, "invalid_file")
    message = error["message"]
    assert "6 lines fail" in message
    assert "2 lines (6, 8), the first: not JSON" in message  # each line's column differs: the first shown
    missing = "3 lines (2, 3, 4): missing field 'answer'"
    assert missing in message and message.index(missing) < message.index("2 lines (6, 8)")
    assert "line 7: expected a JSON object, got list" in message
