"""One real stack (API + worker over PostgreSQL and Redis) for every client test that asks for it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from stare_client import Client
from tests.client.stack import Stack, running_stack, tiny_spec


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("client-stack")) as running:
        yield running


@dataclass(frozen=True)
class Submitted:
    """The jobs the tests share, submitted together so the one worker never idles between tests."""

    full: str  # STARE, full fine-tuning, 4 steps, checkpoints and evaluations at 2 and 4
    lora: str  # STARE with a LoRA adapter (merge_on_save), 2 steps
    broken: str  # its training file removed from storage after submission: the trainer fails
    full_spec: dict[str, Any]
    idempotency_key: str


@pytest.fixture(scope="session")
def client(stack: Stack) -> Iterator[Client]:
    with Client(stack.url, stack.api_key, backoff_s=0.2) as c:
        yield c


@pytest.fixture(scope="session")
def submitted(stack: Stack, client: Client, tmp_path_factory: pytest.TempPathFactory) -> Submitted:
    full_spec = tiny_spec(4)
    key = f"client-test-{uuid.uuid4().hex}"
    full = client.jobs.create(full_spec, idempotency_key=key, metadata={"test": "full"})
    lora_spec = tiny_spec(
        2, model={"name": "tiny-arith", "lora": {"r": 4, "alpha": 8, "merge_on_save": True}}
    )
    lora_spec["evaluation"] = {"interval": 0}
    lora_spec["task"] = {**lora_spec["task"], "eval_size": 4}
    lora = client.jobs.create(lora_spec, metadata={"test": "lora"})
    data = tmp_path_factory.mktemp("broken") / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    uploaded = client.files.upload(data)
    broken_spec = tiny_spec(2)
    broken_spec["task"] = {"source": "jsonl", "train_size": 0, "eval_size": 2}
    broken = client.jobs.create(broken_spec, training_file=uploaded.id, metadata={"test": "broken"})
    stored = stack.artifact_root / stack.tenant_id / "files" / f"{uploaded.id}.jsonl"
    assert stored.is_file(), stored
    stored.unlink()  # the trainer will not find its data: a crash, and with max_attempts 1 the job fails
    return Submitted(full.id, lora.id, broken.id, full_spec, key)
