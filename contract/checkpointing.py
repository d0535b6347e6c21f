"""What a checkpoint folder holds, what each part is for, and which checkpoints keep which part (issue 46).

A checkpoint (`OUT/checkpoints/step-NNNNNN/`, trainer/checkpoints.py, docs/DISTRIBUTED.md) holds two kinds
of thing:
- what users load (`MODEL_DIRS`): `model/`, a Hugging Face folder (weights, config, tokenizer), and for
  LoRA `adapter/`. A model-only download holds these alone (GET .../download?model_only=true);
- what only a resume reads (`TRAINING_STATE`): `sharded/` (the DCP shards: the trainable weights again,
  AdamW's two moments and the scheduler: about 3 × the weights in float32), `rng/`, and an older run
  folder's `trainer_state.pt`.
`state.json` and `model_config/` (a few KB) stay in every checkpoint: they name its step and let the folder
be listed.

Which checkpoints keep their training state on the server is `checkpoint.training_state`
(`TrainingStateKept`), applied by the worker once a checkpoint's row is recorded (worker/retention.py):
- "resume" (the default): only the latest recorded checkpoint, the one a resume starts from, while the job
  can still resume (running, paused, cancelled, failed); none once the job has succeeded;
- "latest": as "resume", and a succeeded job's last checkpoint keeps it (to continue training from it
  outside the service);
- "all": every checkpoint the job keeps (`keep_last`) keeps it, as before issue 46.
The training itself is the same under every value; only what stays on disk differs. The engine alone
(`python -m trainer run`) keeps every checkpoint whole: its run folder is its user's.
Standard library only.
"""

from __future__ import annotations

from typing import Literal

MODEL_DIRS = ("model", "adapter")  # what `from_pretrained` / peft load: a model-only download
TRAINING_STATE = ("sharded", "rng", "trainer_state.pt")  # what only a resume reads
TrainingStateKept = Literal["resume", "latest", "all"]
DEFAULT_TRAINING_STATE: TrainingStateKept = "resume"


def model_part(relative: str) -> bool:
    """Whether a file, by its path relative to the checkpoint folder, belongs to what users load."""
    return relative.split("/", 1)[0] in MODEL_DIRS


def keeps_state_after_success(kept: str) -> bool:
    return kept in ("latest", "all")
