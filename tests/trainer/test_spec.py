"""The job spec: defaults, rejection of unknown fields and out-of-range values with the field named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from contract.spec import TrainSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]


def _error_locs(data: dict) -> list[str]:
    with pytest.raises(ValidationError) as info:
        TrainSpec.model_validate(data)
    return [".".join(str(x) for x in e["loc"]) for e in info.value.errors()]


def test_defaults_resolve_loss_parameters():
    resolved = TrainSpec().resolved()
    assert resolved["algorithm"]["name"] == "stare"
    assert resolved["algorithm"]["advantage"] == "grpo"
    assert resolved["algorithm"]["params"]["top_ratio"] == 0.1
    assert resolved["algorithm"]["params"]["clip_high"] == 0.28
    dr = TrainSpec.model_validate({"algorithm": {"name": "dr_grpo"}}).resolved()
    assert dr["algorithm"]["advantage"] == "dr_grpo"
    assert dr["algorithm"]["params"]["agg_mode"] == "seq-mean-token-sum-norm"


@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"bogus": 1}, "bogus"),
        ({"optim": {"lr": -1}}, "optim.lr"),
        ({"optim": {"steps": 0}}, "optim.steps"),
        ({"optim": {"momentum": 0.9}}, "optim.momentum"),
        ({"sampling": {"temperature": 0}}, "sampling.temperature"),
        ({"sampling": {"top_p": 1.5}}, "sampling.top_p"),
        ({"sampling": {"group_size": 0}}, "sampling.group_size"),
        ({"model": {"dtype": "float8"}}, "model.dtype"),
        ({"task": {"source": "sql"}}, "task.source"),
        ({"algorithm": {"gate": {"m_min": 0}}}, "algorithm.control.m_min"),
    ],
)
def test_bad_values_name_the_field(data, loc):
    assert loc in _error_locs(data)


@pytest.mark.parametrize(
    ("algorithm", "needle"),
    [
        ({"name": "ppo_magic"}, "unknown algorithm 'ppo_magic'"),
        ({"name": "stare", "params": {"reweight_w": 0.9}}, "reweight_w"),
        ({"name": "stare", "params": {"reweight_m": 1.2}}, "reweight_m"),
        ({"name": "stare", "params": {"top_ratio": 1.5}}, "top_ratio"),
        ({"name": "rsi_s", "params": {"r_lo": 3.0, "r_hi": 2.0}}, "r_lo"),
        ({"name": "grpo", "params": {"warp": 1}}, "warp"),
        ({"name": "grpo", "advantage": "gae"}, "advantage estimator 'gae'"),
        ({"name": "stare", "params": {"gate_on": False}}, "gate_on"),
        (
            {"name": "grpo", "params": {"kl_beta": 0.1}},
            "algorithm.params.kl_beta: set the KL penalty's weight with optim.kl_beta",
        ),
    ],
)
def test_bad_algorithm_parameters_are_named(algorithm, needle):
    with pytest.raises(ValidationError) as info:
        TrainSpec.model_validate({"algorithm": algorithm})
    errors = info.value.errors()
    assert any(e["loc"][0] == "algorithm" for e in errors)
    assert needle in str(info.value)


def test_cross_field_rules():
    with pytest.raises(ValidationError, match=r"task\.name is required"):
        TrainSpec.model_validate({"task": {"source": "reasoning_gym"}})
    with pytest.raises(ValidationError, match=r"entropy_band\.low"):
        TrainSpec.model_validate({"entropy_band": {"low": 2.0, "high": 1.0}})
    with pytest.raises(ValidationError, match="sft warm-start"):
        TrainSpec.model_validate({"model": {"name": "smollm2-135m-instruct"}, "sft": {"steps": 10}})
    with pytest.raises(ValidationError, match="verifier"):
        TrainSpec.model_validate({"verifier": {"name": "no-such-verifier"}})
    with pytest.raises(ValidationError, match="prompt_template"):
        TrainSpec.model_validate({"task": {"prompt_template": "no placeholder"}})


def test_lora_takes_either_checkpoint_form_under_either_strategy():
    # Every checkpoint has adapter/; merge_on_save adds the merged model/, under ddp and fsdp2 alike.
    for strategy in ("ddp", "fsdp2"):
        distributed = {"strategy": strategy, "processes_per_node": 2}
        for merge in (False, True):
            spec = TrainSpec.model_validate(
                {"model": {"lora": {"r": 4, "merge_on_save": merge}}, "distributed": distributed}
            )
            assert spec.model.lora is not None and spec.model.lora.merge_on_save is merge
    default = TrainSpec.model_validate({"model": {"lora": {"r": 4}}, "distributed": {"strategy": "fsdp2"}})
    assert default.model.lora is not None and not default.model.lora.merge_on_save


def test_demo_spec_is_valid():
    spec = load_spec(ROOT / "trainer" / "specs" / "demo.yaml")
    assert spec.algorithm.name == "stare"
    assert spec.sft is not None and spec.sft.steps > 0


def test_spec_module_imports_no_torch():
    code = (
        "import sys, json; import contract.spec; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'accelerate', 'fastapi', 'celery', 'sqlalchemy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == []


def test_resolved_spec_validates_again():
    for name in ("stare", "grpo", "rsi_s", "dr_grpo"):
        resolved = TrainSpec.model_validate({"algorithm": {"name": name}}).resolved()
        assert TrainSpec.model_validate(resolved).resolved() == resolved
