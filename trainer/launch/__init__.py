"""Launching a job: the command line (`cli`, behind `python -m trainer`), the `run` command's arguments and
spec (`command`), the one job entry every launch calls (`job.run_job`), and the Ray driver (`ray_driver`)
with what runs inside the cluster (`ray_worker`). The top floor of the trainer: nothing below imports it."""
