"""The experiment runner behind docs/RESULTS.md: suites of job specs (the format users submit) run by the
trainer's own command line, several at a time, resumable; tables and figures built from their events."""
