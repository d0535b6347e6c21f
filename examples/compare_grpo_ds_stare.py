"""GRPO-ds against STARE on the same task, through the Python client.

Submits the two jobs from one spec (only algorithm.name differs), waits for both, downloads both final
checkpoints, loads each with transformers, and prints the two evaluation summaries side by side.

    stare local up                                     # or: export STARE_API_URL=... STARE_API_KEY=...
    python examples/compare_grpo_ds_stare.py           # the demo spec (trainer/specs/demo.yaml), 500 steps
    python examples/compare_grpo_ds_stare.py --steps 50 --out runs/compare

Needs the client (pip install stare-rl[client]) and, to load the checkpoints, transformers.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from stare_client import Client, StareError

ROWS = [
    ("status", lambda j, r: j.status),
    ("steps", lambda j, r: f"{j.progress.step}/{j.progress.total_steps}"),
    ("avg@k before", lambda j, r: r.evaluation.before.avg_at_k if r.evaluation.before else None),
    ("avg@k after", lambda j, r: r.evaluation.after.avg_at_k if r.evaluation.after else None),
    ("avg@k delta", lambda j, r: r.evaluation.delta.get("avg_at_k")),
    ("pass@k after", lambda j, r: r.evaluation.after.pass_at_k if r.evaluation.after else None),
    ("entropy last", lambda j, r: r.entropy.get("last")),
    ("fraction in band", lambda j, r: r.entropy.get("fraction_in_band")),
    ("gate on fraction", lambda j, r: r.gate.get("on_fraction")),
    ("reward mean", lambda j, r: (r.reward.get("mean") or {}).get("mean")),
]


def specs(base: dict[str, Any], steps: int | None) -> dict[str, dict[str, Any]]:
    """The same spec twice: GRPO-ds (its defaults) and STARE (the base's STARE settings, if any)."""
    out = {}
    for name in ("grpo_ds", "stare"):
        spec = copy.deepcopy(base)
        algorithm = spec.get("algorithm") or {}
        spec["algorithm"] = (
            algorithm if name == "stare" and algorithm.get("name") == "stare" else {"name": name}
        )
        spec["name"] = f"compare-{name}"
        if steps is not None:
            spec.setdefault("optim", {})["steps"] = steps
        out[name] = spec
    return out


def fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else ("-" if value is None else str(value))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=Path("trainer/specs/demo.yaml"))
    parser.add_argument("--steps", type=int, default=None, help="override optim.steps")
    parser.add_argument("--out", type=Path, default=Path("runs/compare"), help="where the checkpoints go")
    parser.add_argument("--url", default=None, help="API URL (else STARE_API_URL, else a local stack)")
    parser.add_argument("--api-key", default=None, help="API key (else STARE_API_KEY)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the jobs")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer  # loading the checkpoints needs it

    base = yaml.safe_load(args.spec.read_text())
    with Client(args.url, args.api_key) as stare:
        jobs = {
            name: stare.jobs.create(spec, metadata={"example": "compare_grpo_ds_stare", "arm": name})
            for name, spec in specs(base, args.steps).items()
        }
        for name, job in jobs.items():
            print(f"submitted {name}: {job.id}", flush=True)
        finished = {name: stare.jobs.wait(job, timeout=args.timeout) for name, job in jobs.items()}
        failed = [f"{n} {j.status}" for n, j in finished.items() if j.status != "succeeded"]
        if failed:
            print(f"not every job succeeded: {', '.join(failed)}", file=sys.stderr)
            return 1
        reports = {name: stare.reports.get(job) for name, job in finished.items()}
        for name, job in finished.items():
            ckpt = stare.checkpoints.download(job, "latest", args.out / name, overwrite=True)
            model = AutoModelForCausalLM.from_pretrained(ckpt.path)
            tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
            params = sum(p.numel() for p in model.parameters())
            print(
                f"{name}: step {ckpt.step} loaded from {ckpt.path} ({params:,} parameters, "
                f"vocabulary {len(tokenizer)}, sha256 {ckpt.sha256[:12]})"
            )

    names = list(finished)
    width = max(len(label) for label, _ in ROWS)
    print(f"\n{'':{width}}  " + "  ".join(f"{n:>12}" for n in names))
    for label, get in ROWS:
        cells = "  ".join(f"{fmt(get(finished[n], reports[n])):>12}" for n in names)
        print(f"{label:{width}}  {cells}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except StareError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
