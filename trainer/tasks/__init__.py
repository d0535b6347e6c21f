"""Tasks: what the model is asked and how its answers are rewarded. Torch-free: the service imports these
modules to check uploads and specs and to run the verifiers' dry run.

- `sources`: where prompts and reference answers come from (arithmetic, reasoning-gym, JSONL), and how a
  prompt becomes model input text (`Example`, `render_prompt`);
- `rg_safety`: reasoning-gym without tenant code (the meta an example carries, the tasks refused);
- `verifiers`: the rewards, a fixed registry of answer checkers (`score`) and the DAPO overlong shaping.
  Reward code of any other kind (graders) belongs beside them, here.
"""
