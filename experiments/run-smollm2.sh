#!/bin/sh
# The SmolLM2 suite in the background, resumable: rerun this script to continue (finished runs are skipped,
# interrupted ones resume from their last checkpoint). Two one-thread runs at a time, at the lowest priority.
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-.venv/bin/python}
exec nice -n 19 env PYTHONPATH="$PWD" "$PY" -m experiments run --jobs 2 --root results/smollm2 \
  --suite smollm2-add-lr2e-5 --suite smollm2-add-lr3e-6 \
  --md docs/RESULTS-smollm2.md --html build/results-smollm2.html \
  --header experiments/RESULTS_SMOLLM2_HEADER.md --footer experiments/RESULTS_SMOLLM2_FOOTER.md
