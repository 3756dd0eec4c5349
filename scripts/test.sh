#!/usr/bin/env bash
# The test suite on a fresh machine: set up, start every service the tests need, run pytest.
#   PostgreSQL (Dagster instance), a single-host Slurm cluster (slurm-wlm + slurmdbd + MariaDB),
#   a Kubernetes 1.34 control plane (kube-apiserver/scheduler/controller-manager built from Go
#   modules, etcd) with a fake DRA GPU node, and moto's S3 server (started by the tests themselves).
# Extra arguments go to pytest. Services are left running; stop them with their scripts' `stop`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash resources/postgres/postgres.sh start
if [ -x resources/slurm/cluster.sh ]; then bash resources/slurm/cluster.sh start; fi
if [ -x resources/k8s/cluster.sh ]; then bash resources/k8s/build.sh && bash resources/k8s/cluster.sh start; fi
exec .venv/bin/python -m pytest -q -ra "$@"
