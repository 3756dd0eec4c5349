#!/usr/bin/env bash
# The main job: set up, then embed every file of the Debian fortunes corpus as a Dagster backfill
# through gpu_executor, with progress and a per-partition summary. Local backend by default;
# --backend slurm|kubernetes|auto first starts what that backend needs (pipelines/demo_backends.py);
# --slurm-version 24.11 uses the Slurm 24.11 cluster (resources/slurm/trixie.sh) instead of 22.05.
source "$(dirname "${BASH_SOURCE[0]}")/../resources/lib/errtrap.sh"
cd "$(dirname "$0")/.."
dg_step "set-up (scripts/setup.sh)"
bash scripts/setup.sh
dg_step "demo (python -m pipelines.demo)"
exec .venv/bin/python -m pipelines.demo "$@"   # --backend local|slurm|kubernetes|auto, --slurm-version 22.05|24.11, --transport local|ssh|rest, --events direct|relay, --limit N, ...
