#!/usr/bin/env bash
# The main job: set up, then embed every file of the Debian fortunes corpus as a Dagster backfill
# through gpu_executor (local backend), with progress and a per-partition summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pipelines.demo "$@"
