"""The live monitoring stack of tests/monitoring: the HTTP API (served by uvicorn, so Prometheus scrapes
its /metrics and the test's requests are counted), one real `python -m worker run`, the real
`python -m worker exporter`, and Debian's Prometheus scraping both with the shipped config and alert rules
(intervals shortened, targets pointed here), on the test session's PostgreSQL and Redis (tests/services.py).

A job's queries are run while its trainer is frozen (SIGSTOP) after a few steps and an evaluation: the
worker keeps heartbeating, so the job stays active and its series exist, and its step no longer moves, so
each value can be checked against the job's row.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import sqlalchemy as sa
import uvicorn
import yaml

from contract import metrics as catalogue
from monitoring.alerts import ALERTS_PATH, AlertRule
from monitoring.build import query_refs
from monitoring.dashboards import DASHBOARDS
from monitoring.docs import RESULTS_PATH
from monitoring.model import RATE_INTERVAL, QueryRef
from monitoring.promql import metric_names, substitute
from service.app import create_app
from store.models import JobEval
from tests.conftest import vllm_python
from tests.servers import free_port
from tests.worker.harness import Harness, WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
SCRAPE_S = 1
RATE_WINDOW = "1m"  # what Grafana's $__rate_interval becomes here
RECORD = os.environ.get("STARE_RECORD_QUERY_RESULTS") == "1"


@dataclass
class Frozen:
    """A job whose trainer is stopped: its step and its series stay put until thaw()."""

    job_id: str
    algorithm: str
    step: int
    trainer: psutil.Process

    def thaw(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.trainer.send_signal(signal.SIGCONT)


class ApiServer:
    """The API app on a real port, in a thread."""

    def __init__(self, harness: Harness) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            create_app(harness.settings), host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="api", daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, headers=harness.headers, timeout=30)
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the API server did not start")
            time.sleep(0.05)

    def close(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)


class PrometheusServer:
    def __init__(self, folder: Path, api_port: int, exporter_port: int) -> None:
        binary = shutil.which("prometheus")
        assert binary is not None
        folder.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load(PROMETHEUS_YML.read_text())
        config["global"] = {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"}
        shutil.copy(ALERTS_PATH, folder / "alerts.yml")
        config["rule_files"] = [str(folder / "alerts.yml")]
        targets = {"stare-api": api_port, "stare-fleet": exporter_port, "dcgm": free_port()}  # dcgm: down
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": [f"127.0.0.1:{targets[job['job_name']]}"]}]
            if job["job_name"] == "stare-fleet":  # the exporter pings the workers (PING_TIMEOUT_S) per scrape
                job["scrape_interval"] = job["scrape_timeout"] = "2s"
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log = folder / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def api(self, path: str, **params: str) -> Any:
        response = self.client.get(f"/api/v1/{path}", params=params)
        body = response.json()
        assert body.get("status") == "success", f"{path} {params}: {response.status_code} {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])

    def ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return self.client.get("/-/ready").status_code == 200
        return False

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


class Stack:
    def __init__(self, harness: Harness, folder: Path) -> None:
        self.h = harness
        self.api: ApiServer | None = None
        self.prometheus: PrometheusServer | None = None
        self.exporter_port = free_port()
        exporter = WorkerProcess(
            "exporter",
            [sys.executable, "-m", "worker", "exporter", "--port", str(self.exporter_port)],
            harness.worker_env(),
            folder / "exporter.log",
        )
        harness.workers.append(exporter)
        # The worker runs a vllm job's trainer in vLLM's interpreter (the rollout row's live test).
        vllm_env = {"STARE_VLLM_PYTHON": vllm_python()}
        self.worker = harness.start_worker(sweep=False, env=vllm_env, wait_ready=False)
        self.api = ApiServer(harness)
        self.prometheus = PrometheusServer(folder / "prometheus", self.api.port, self.exporter_port)
        self.worker.wait_ready()
        harness.wait_for("Prometheus to be ready", self.prometheus.ready, 60)

    @property
    def prom(self) -> PrometheusServer:
        assert self.prometheus is not None
        return self.prometheus

    @property
    def http(self) -> httpx.Client:
        assert self.api is not None
        return self.api.client

    def close(self) -> None:
        if self.prometheus is not None:
            self.prometheus.close()
        if self.api is not None:
            self.api.close()

    # --------------------------------------------------------------------------------------------- jobs

    def submit(self, spec: dict[str, Any]) -> str:
        response = self.http.post("/v1/jobs", json={"spec": spec})
        assert response.status_code == 201, response.text
        job_id = str(response.json()["id"])
        self.h.jobs.append(job_id)
        return job_id

    def freeze_after(self, job_id: str, step: int) -> Frozen:
        """Wait for `step` and an evaluation, SIGSTOP the trainer, and wait until the job's row, the exporter
        and Prometheus all show the same step."""
        h = self.h
        h.wait_step(job_id, step, timeout=120)
        h.wait_for("an evaluation row", lambda: self._has_eval(job_id), 60, job_id=job_id)
        trainer = h.wait_trainer(self.worker)
        trainer.send_signal(signal.SIGSTOP)
        frozen = Frozen(job_id, str(self.http.get(f"/v1/jobs/{job_id}").json()["algorithm"]), 0, trainer)
        last: dict[str, Any] = {"step": -1, "since": time.monotonic()}

        def settled() -> int | None:  # the worker may still be recording lines the trainer wrote
            now = h.job_row(job_id)["current_step"]
            if now != last["step"]:
                last.update(step=now, since=time.monotonic())
                return None
            return now if time.monotonic() - last["since"] > 1.5 else None

        frozen.step = int(h.wait_for("the frozen job's step to settle", settled, 30, job_id=job_id))

        def scraped() -> bool:
            found = self.prom.query(f'stare_job_step{{job_id="{job_id}"}}')
            return bool(found) and float(found[0]["value"][1]) == frozen.step

        h.wait_for("Prometheus to scrape the frozen step", scraped, 30, job_id=job_id)
        return frozen

    def _has_eval(self, job_id: str) -> bool:
        def count(session: Any) -> int:
            return int(session.scalar(sa.select(sa.func.count()).where(JobEval.job_id == job_id)) or 0)

        return self.h.infra.db_retry(count) > 0

    def end(self, frozen: Frozen) -> None:
        """Cancel the job and let its trainer go (SIGTERM waits on a stopped process until SIGCONT)."""
        self.http.post(f"/v1/jobs/{frozen.job_id}/cancel")
        frozen.thaw()
        self.h.wait_status(frozen.job_id, ("cancelled", "succeeded"), timeout=90)

    # ------------------------------------------------------------------------------------------ queries

    def variables(self, frozen: Frozen) -> dict[str, str]:
        return {
            "job_id": frozen.job_id,  # a job id is letters, digits and '_': the same as a regex
            "algorithm": frozen.algorithm,
            "queue": self.h.queue,
            RATE_INTERVAL.lstrip("$"): RATE_WINDOW,
        }


def scope_of(name: str) -> str | None:
    """The label a series is scoped by in the checks: job_id (per-job series), queue, or None."""
    if any(m.prometheus == name for m in catalogue.CATALOGUE):
        return "job_id"
    for series in (*catalogue.FLEET_SERIES, *catalogue.API_SERIES):
        if name in catalogue.series_names(series):
            return "job_id" if "job_id" in series.labels else "queue" if "queue" in series.labels else None
    return None


def dashboard_refs(requires: str | None) -> list[QueryRef]:
    """The queries of every dashboard's rows that need `requires` (None: the rows for any job)."""
    return [ref for d in DASHBOARDS for ref in query_refs(d) if ref.row.requires == requires]


def legend_of(ref: QueryRef, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), ref.query.legend)


def check_dashboard_queries(stack: Stack, frozen: Frozen, refs: list[QueryRef]) -> dict[str, Any]:
    """Run each query with the job's variables; each must return series, for this job or queue where the
    query is scoped so, with every value as its panel expects. Returns the results to record."""
    values = stack.variables(frozen)
    results: dict[str, Any] = {}
    problems: list[str] = []
    for ref in refs:
        expr = substitute(ref.query.expr, values)
        found = stack.prom.query(expr)
        if not found:
            problems.append(f"{ref.key}: no series for {expr}")
            continue
        for series in found:
            labels, value = series["metric"], float(series["value"][1])
            if "job_id" in labels and labels["job_id"] != frozen.job_id and "job_id" in ref.query.expr:
                problems.append(f"{ref.key}: series of another job {labels}")
            if "queue" in labels and "$queue" in ref.query.expr and labels["queue"] != stack.h.queue:
                problems.append(f"{ref.key}: series of another queue {labels}")
            if not ref.query.expect.admits(value, frozen.step):
                problems.append(
                    f"{ref.key}: {expr} gave {value} for {labels}, expected {ref.query.expect.value}"
                )
        if "$job_id" in ref.query.expr and not any(s["metric"].get("job_id") == frozen.job_id for s in found):
            problems.append(f"{ref.key}: no series of job {frozen.job_id}: {found}")
        results[ref.key] = {
            "expr": ref.query.expr,
            "series": [
                {
                    "label": _generic(legend_of(ref, s["metric"]), frozen, stack),
                    "value": _rounded(float(s["value"][1])),
                }
                for s in sorted(found, key=lambda s: json.dumps(s["metric"], sort_keys=True))
            ],
        }
    assert not problems, "\n".join(problems)
    return results


def check_alert_selectors(stack: Stack, frozen: Frozen, rules: list[AlertRule]) -> dict[str, Any]:
    """Every alert rule: its expression evaluates (valid PromQL against real data), and each of its vector
    selectors returns series, for this job where the series is per job and this queue where per queue."""
    results: dict[str, Any] = {}
    problems: list[str] = []
    for rule in rules:
        stack.prom.api("query", query=rule.expr)  # asserts status success
        if not rule.selectors:
            problems.append(f"{rule.name}: no selector found in {rule.expr}")
        for index, selector in enumerate(rule.selectors):
            (name,) = metric_names(selector)
            scope = scope_of(name)
            found = stack.prom.query(selector)
            wanted = {"job_id": frozen.job_id, "queue": stack.h.queue}.get(scope or "")
            mine = [s for s in found if scope is None or s["metric"].get(scope) == wanted]
            if not mine:
                problems.append(f"{rule.name}: {selector} returned no series for {scope}={wanted}: {found}")
            for s in mine:
                if not math.isfinite(float(s["value"][1])):
                    problems.append(f"{rule.name}: {selector} gave {s}")
            results[rule.selector_key(index)] = {
                "expr": selector,
                "series": [{"label": "", "value": _rounded(float(s["value"][1]))} for s in mine],
            }
    assert not problems, "\n".join(problems)
    return results


def _generic(label: str, frozen: Frozen, stack: Stack) -> str:
    """A legend with the run's job id and queue written as the variables (the record stays the same from
    one run to the next where the values do)."""
    return label.replace(frozen.job_id, "$job_id").replace(stack.h.queue, "$queue").strip()


def _rounded(value: float) -> float:
    return float(f"{value:.6g}")


def record(results: dict[str, Any], run: dict[str, Any]) -> None:
    """Merge into deploy/grafana/query-results.json (STARE_RECORD_QUERY_RESULTS=1 only)."""
    current = json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.is_file() else {"run": {}, "results": {}}
    current["run"].update(run)
    current["results"].update(results)
    current["results"] = dict(sorted(current["results"].items()))
    RESULTS_PATH.write_text(json.dumps(current, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def running_stack(harness: Harness, folder: Path) -> Iterator[Stack]:
    stack = Stack(harness, folder)
    try:
        yield stack
    except BaseException:
        if stack.prometheus is not None:
            sys.stderr.write(stack.prometheus.log.read_text(errors="replace")[-3000:])
        raise
    finally:
        stack.close()


def prometheus_names(stack: Stack) -> set[str]:
    return set(stack.prom.api("label/__name__/values"))
