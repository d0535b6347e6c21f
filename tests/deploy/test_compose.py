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


def test_compose_references_exist() -> None:
    compose = _compose()
    services = compose["services"]
    assert {"postgres", "redis", "api", "worker", "sweeper", "exporter", "prometheus", "grafana"} <= set(
        services
    )
    assert {"worker-gpu", "dcgm-exporter"} <= set(services)
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


def test_dockerfile_copies_exist() -> None:
    for dockerfile in (ROOT / "deploy" / "docker").glob("Dockerfile.*"):
        for line in dockerfile.read_text().splitlines():
            match = re.match(r"COPY\s+(.+)\s+\S+$", line.strip())
            if match and "--from=" not in line:  # a COPY from an earlier build stage names no source file
                for source in (word for word in match.group(1).split() if not word.startswith("--")):
                    assert (ROOT / source).exists(), (dockerfile.name, source)
        assert "torch==2.13.0" in dockerfile.read_text() or dockerfile.name == "Dockerfile.api"


def test_commands_are_real_entry_points() -> None:
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


def test_no_secrets_in_compose() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text
    assert (
        "${POSTGRES_PASSWORD:?" in text
        and "${REDIS_PASSWORD:?" in text
        and "${GRAFANA_ADMIN_PASSWORD:?" in text
    )


IMAGE_TAG = re.compile(r"^[\w./-]+:[\w.-]+$")


def test_every_image_is_pinned_to_a_version() -> None:
    for name, service in _compose()["services"].items():
        image = service.get("image")
        if image:
            assert IMAGE_TAG.match(image) and not image.endswith(":latest"), (name, image)
    from_line = next(
        line
        for line in (ROOT / "deploy/docker/Dockerfile.worker-gpu").read_text().splitlines()
        if line.startswith("FROM")
    )
    assert re.fullmatch(r"FROM nvidia/cuda:\d+\.\d+\.\d+-[\w.-]+", from_line), from_line


def test_grafana_is_provisioned_with_the_datasource_and_the_dashboards() -> None:
    from monitoring.build import rendered
    from monitoring.model import DATASOURCE_UID

    grafana = _compose()["services"]["grafana"]
    assert grafana["image"].startswith("grafana/grafana-oss:")
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"] if v.startswith("./")}
    assert all(v.endswith(":ro") for v in grafana["volumes"] if v.startswith("./"))
    provisioning = ROOT / "deploy/grafana/provisioning"
    assert mounts["/etc/grafana/provisioning/datasources"] == "./deploy/grafana/provisioning/datasources"
    assert mounts["/etc/grafana/provisioning/dashboards"] == "./deploy/grafana/provisioning/dashboards"
    (source,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    assert source["uid"] == DATASOURCE_UID and source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090" and "prometheus" in grafana["depends_on"]
    (provider,) = yaml.safe_load((provisioning / "dashboards/stare.yml").read_text())["providers"]
    folder = provider["options"]["path"]
    assert mounts[folder] == "./deploy/grafana/dashboards"
    for name in rendered():
        assert (ROOT / "deploy/grafana/dashboards" / name).is_file(), name
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (
        home.startswith(folder + "/")
        and (ROOT / "deploy/grafana/dashboards" / home[len(folder) + 1 :]).is_file()
    )
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")


def test_gpu_workers_reserve_one_gpu_each_and_dcgm_is_scraped() -> None:
    services = _compose()["services"]
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["command"] == ["python", "-m", "worker", "run"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    assert gpu["build"]["dockerfile"] == "deploy/docker/Dockerfile.worker-gpu"
    dcgm = services["dcgm-exporter"]
    assert dcgm["profiles"] == ["gpu"] and dcgm["image"].startswith("nvcr.io/nvidia/k8s/dcgm-exporter:")
    assert "9400:9400" in dcgm["ports"]
    for name, service in services.items():  # nothing outside the profile needs a GPU
        if "gpu" not in service.get("profiles", []):
            assert "deploy" not in service, name
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets["dcgm"] == ["dcgm-exporter:9400"]
    assert targets["stare-api"] == ["api:8000"] and targets["stare-fleet"] == ["exporter:9464"]
    dockerfile = (ROOT / "deploy/docker/Dockerfile.worker-gpu").read_text()
    assert "bubblewrap" in dockerfile and "python3.11" in dockerfile
    assert re.search(r"pip install [^\n]*torch==2\.13\.0", dockerfile)


def test_the_ray_profile_is_a_head_worker_and_nodes_sharing_the_artifacts() -> None:
    services = _compose()["services"]
    head, node = services["worker-ray"], services["ray-node"]
    assert head["profiles"] == node["profiles"] == ["ray"]
    assert head["environment"]["STARE_RAY_ADDRESS"] == "auto", "the worker's host is a Ray node"
    assert (
        "ray start --head --port 6379" in head["command"][-1]
        and "python -m worker run" in head["command"][-1]
    )
    assert node["command"][:4] == ["ray", "start", "--address", "worker-ray:6379"]
    for service in (head, node):
        assert "distributed" in service["build"]["args"]["EXTRAS"], "the image has Ray"
        assert "artifacts:/artifacts" in service["volumes"], "every rank writes its checkpoint part there"
    dockerfile = (ROOT / "deploy/docker/Dockerfile.worker").read_text()
    assert "ARG EXTRAS=" in dockerfile and '".[${EXTRAS}]"' in dockerfile
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r"^distributed = \[.*ray\[train\]", pyproject, re.M)


def test_the_api_and_the_workers_run_as_a_user_that_is_not_root() -> None:
    """docs/SECURITY.md ("Users"): every image of ours ends on an unprivileged USER, which owns the artifact
    folder, and every service built from them runs as it; the workers may lift exactly what unprivileged
    bubblewrap needs (the trainer's confinement), and no service of ours is privileged or adds capabilities."""
    for dockerfile in (ROOT / "deploy" / "docker").glob("Dockerfile.*"):
        users = re.findall(r"^USER\s+(\S+)\s*$", dockerfile.read_text(), re.MULTILINE)
        assert users and users[-1] not in ("root", "0", "0:0"), dockerfile.name
        assert "chown stare:stare /artifacts" in dockerfile.read_text(), dockerfile.name
    bwrap = {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"}
    for name, service in _compose()["services"].items():
        if not service.get("build"):
            continue
        assert service.get("user") == "stare", name
        assert not service.get("privileged") and not service.get("cap_add"), name
        if "worker" in name:
            assert set(service.get("security_opt", [])) == bwrap, name
        elif name == "api":  # its task-check children's bubblewrap: user namespaces, no /proc mount
            assert set(service.get("security_opt", [])) == bwrap - {"systempaths=unconfined"}, name
        else:
            assert not service.get("security_opt"), name


def test_rays_processes_start_without_the_services_secrets() -> None:
    """The Ray head's processes (multi-node jobs' training processes, outside the trainer's confinement)
    inherit `ray start`'s environment: it starts without the database and broker URLs."""
    command = _compose()["services"]["worker-ray"]["command"][-1]
    ray_start = command.split("&&")[0]
    assert "ray start" in ray_start
    assert "-u STARE_DATABASE_URL" in ray_start and "-u STARE_BROKER_URL" in ray_start
