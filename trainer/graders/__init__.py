"""Tenant graders (contract/graders.py; docs/GRADERS.md): the sandboxed warm pool their code runs in (`pool`,
with `harness` the program inside), grading samples (`grading`), and what training does with the outcomes
and how it watches the grader's health (`health`); `job` ties them to a training job.

Torch-free: the service's routes grade with the same modules (POST /v1/graders/validate and /run)."""
