"""What a process holds in memory: the estimator's inputs from a live model, and the measured peak RSS.

`model_shape` reads what contract.fleet.estimate_memory needs from an HF causal LM (before wrapping).
`reset_peak_rss` / `peak_rss_bytes` bracket a measurement with Linux's per-process high-water mark
(VmHWM in /proc/self/status, reset by writing 5 to /proc/self/clear_refs), so a peak reached while importing
torch does not hide the training step's; elsewhere they fall back to getrusage's lifetime maximum.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

from torch import nn

from contract.catalog import ModelShape
from trainer.models import decoder_layers, hf_model

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def model_shape(model: nn.Module) -> ModelShape:
    config = hf_model(model).config
    params = list(model.parameters())  # tied parameters once
    layers = decoder_layers(model)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    root_parameters = sum(p.numel() for p in params if id(p) not in in_layers)
    largest_layer = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    return ModelShape(
        parameters=sum(p.numel() for p in params),
        trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=len(layers),
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        vocab_size=config.vocab_size,
        largest_layer_parameters=max(largest_layer, root_parameters),
    )


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def reset_peak_rss() -> bool:
    """Resets the high-water mark to the current RSS; False where the platform cannot."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int:
    if _STATUS.is_file():
        return _status_kib("VmHWM") * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{_STATUS} has no {field}")
