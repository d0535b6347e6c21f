"""The RL engine: a job spec in, a trained checkpoint, per-step events and an evaluation report out
(`python -m trainer run SPEC --out DIR`). It imports no service, worker or web, queue or database framework.

Its parts, from the top floor down (each imports only the floors below it: import-linter's layers contract
in pyproject.toml, and no import cycle: tests/test_package_shape.py):

- `launch/`: the command line, the `run` command's arguments, the one job entry (`job.run_job`), the Ray
  driver and what runs inside the cluster;
- `engine.py`: one training run (`Engine`: the loop, checkpoints, the report, exit codes);
- `step.py`: one optimiser step (`StepEngine`: the setup, the numbered `train_step`), which `Engine` extends;
- the step's parts: `policy/` (where the policy lives, its scoring pass, its update), `data.py` (the prompt
  order and each step's rollouts), `evaluation.py`, `sft.py` (the warm start), `controllers.py`, and
  `run/` (the event log and stop policies, the step's event metrics, fault injection, the heap setting);
- `rollout/`: sampling streams, the rollout engines (HF generate, vLLM), the mode switch between training
  and sampling, the rollout batch, the sampler/trainer mismatch;
- `envs/`: the tool-use environment and its sandbox;
- `distributed/`: the runtime (the one handle on the processes), the strategy (ddp, fsdp2), checkpoints;
- `models.py` (loading, and the views inside the model's wrappers), `checkpoints.py` (checkpoint folders);
- `tasks/` (task sources and their rewards: verifiers), `algos/` (the tensor math), `report/`.
"""
