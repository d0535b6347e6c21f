"""Rollouts: how the policy's samples are drawn and laid out for training.

- `sampling`: one seeded random stream per prompt, named by what the prompt is in the job;
- `generation`: the rollout engine interface and its HF generate implementation;
- `vllm_engine`: vLLM as the rollout engine, colocated with the trainer;
- `hybrid`: the switch between the policy's training and sampling modes (`Rollouts.rollout_mode`);
- `batch`: G responses per prompt (or tool-use episodes) sampled, rewarded and laid out as a `Rollout`;
- `episodes`: multi-turn tool-use episodes, sampled turn by turn and laid out as token rows;
- `mismatch`: the sampler's log-prob mismatch with the trainer and its truncated importance correction.

This folder sits above the distributed strategy (it reads full weights from it) and below the engine.
"""
