"""docker-compose.yml and the Dockerfiles, checked statically (no Docker engine runs here): every build
context and file they name exists, every command names a real entry point, and no secret is baked in."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_references_exist():
    compose = _compose()
    services = compose["services"]
    assert {"postgres", "redis", "api", "worker", "sweeper", "exporter", "prometheus"} <= set(services)
    for name, service in services.items():
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), (name, source)
        for dep in service.get("depends_on", []):
            assert dep in services, (name, dep)


def test_dockerfile_copies_exist():
    for dockerfile in (ROOT / "deploy" / "docker").glob("Dockerfile.*"):
        for line in dockerfile.read_text().splitlines():
            match = re.match(r"COPY\s+(.+)\s+\S+$", line.strip())
            if match:
                for source in match.group(1).split():
                    assert (ROOT / source).exists(), (dockerfile.name, source)
        assert "torch==2.13.0" in dockerfile.read_text() or dockerfile.name == "Dockerfile.api"


def test_commands_are_real_entry_points():
    for name, service in _compose()["services"].items():
        command = service.get("command")
        if isinstance(command, list) and command[:2] == ["python", "-m"]:
            module, sub = command[2], command[3]
            done = subprocess.run(
                [sys.executable, "-m", module, sub, "--help"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, (name, done.stderr[-2000:])


def test_no_secrets_in_compose():
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text
    assert "${POSTGRES_PASSWORD:?" in text and "${REDIS_PASSWORD:?" in text
