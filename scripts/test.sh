#!/usr/bin/env bash
# The test suite on a fresh machine: set up, start every service the tests need, run pytest.
#   PostgreSQL (Dagster instance), two single-host Slurm clusters (slurm-wlm + slurmdbd + MariaDB: 22.05 from
#   Debian bookworm on the host, 24.11 from a Debian trixie root in a chroot with slurmrestd (JWT) beside it,
#   resources/slurm/trixie.sh),
#   a Kubernetes 1.34 control plane (kube-apiserver/scheduler/controller-manager built from Go
#   modules, etcd) with a fake DRA GPU node, a private OpenSSH server on 127.0.0.1 in front of the Slurm
#   clusters (the ssh transport's login node, resources/ssh/sshd.sh), and moto's S3 server (started by the tests themselves).
# Extra arguments go to pytest. Services are left running; stop them with their scripts' `stop`.
#
# Every service must start: one that cannot stops this script at that step with its log's tail (no
# service is optional here), and DAGSTER_GPU_REQUIRE_SERVICES=1 makes tests/conftest.py turn any skip
# of an end-to-end test (markers e2e, slurm, k8s, postgres) into a failure that quotes the skip reason.
source "$(dirname "${BASH_SOURCE[0]}")/../resources/lib/errtrap.sh"
cd "$(dirname "$0")/.."
export DAGSTER_GPU_REQUIRE_SERVICES=1

# The Go build of the control plane (the longest cold step) runs while the rest is set up.
K8S_BUILD_LOG=$(mktemp /tmp/dagster-gpu-k8s-build.XXXXXX.log)
bash resources/k8s/build.sh >"$K8S_BUILD_LOG" 2>&1 &
K8S_BUILD_PID=$!
# What only the tests use: the browser test's Chromium (tests/test_ui_browser.py), the Slurm ssh transport's login
# node (openssh-server, resources/ssh/sshd.sh), the test extra; the demo's set-up installs none of them.
test_pkgs=()
command -v chromium >/dev/null 2>&1 || test_pkgs+=(chromium)
[ -x /usr/sbin/sshd ] || test_pkgs+=(openssh-server)
if [ ${#test_pkgs[@]} -gt 0 ]; then
  dg_step "apt-get install ${test_pkgs[*]} (the tests' own)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${test_pkgs[@]}" >/dev/null
fi
dg_step "set-up (scripts/setup.sh with the test and demo extras)"
DAGSTER_GPU_EXTRAS=test,demo bash scripts/setup.sh
dg_step "PostgreSQL (resources/postgres/postgres.sh start)" "${DAGSTER_GPU_PG_DIR:-/tmp/dagster-gpu-pg}/server.log" notail
bash resources/postgres/postgres.sh start
dg_step "OpenSSH login node for the Slurm ssh transport (resources/ssh/sshd.sh start)" "${DAGSTER_GPU_SSHD_DIR:-/tmp/dagster-gpu-sshd}/sshd.log" notail
bash resources/ssh/sshd.sh start
dg_step "Slurm cluster (resources/slurm/cluster.sh start)" "${DAGSTER_GPU_SLURM_DIR:-/tmp/dagster-gpu-slurm}/log" notail
bash resources/slurm/cluster.sh start
# The Slurm 24.11 cluster (a debootstrapped Debian trixie root, cached under ~/.cache/dagster-gpu) starts in
# the background from here, after the last apt-get of the steps above, while the control plane is built.
TRIXIE_LOG=$(mktemp /tmp/dagster-gpu-slurm-trixie.XXXXXX.log)
bash resources/slurm/trixie.sh start >"$TRIXIE_LOG" 2>&1 &
TRIXIE_PID=$!
dg_step "Kubernetes binaries (resources/k8s/build.sh, in the background since the start)" "$K8S_BUILD_LOG"
wait "$K8S_BUILD_PID"
cat "$K8S_BUILD_LOG"
dg_step "Kubernetes control plane (resources/k8s/cluster.sh start)" "${DAGSTER_GPU_K8S_DIR:-/tmp/dagster-gpu-k8s}/logs" notail
bash resources/k8s/cluster.sh start
dg_step "Slurm 24.11 cluster (resources/slurm/trixie.sh start, in the background since the Slurm 22.05 cluster)" "$TRIXIE_LOG"
wait "$TRIXIE_PID"
cat "$TRIXIE_LOG"
dg_step "both ends of the dagster range from the built wheel (scripts/compat.sh)"
bash scripts/compat.sh
# pytest's own summary can scroll out of a log's tail (what its interpreter prints at exit comes after it), so the
# failures, one line each (tests/failure_summary.py), are printed again as this script's last lines.
DAGSTER_GPU_PYTEST_FAILURES=$(mktemp /tmp/dagster-gpu-pytest-failures.XXXXXX.txt)
export DAGSTER_GPU_PYTEST_FAILURES
dg_step "pytest (the failures, one per line; the full reports are in the output above)" "$DAGSTER_GPU_PYTEST_FAILURES"
DG_LOG_TAIL_LINES=60
# DAGSTER_GPU_TEST_WORKERS=N (default 2; 0: the tests in this one process) runs them on N pytest-xdist workers, a
# file's tests in one worker, the files in tests/host_locks.py's order; each cluster, the login node and the fork
# server then serve one test at a time, and tests that time this host's CPU run alone (tests/host_locks.py).
XDIST=()
if (( ${DAGSTER_GPU_TEST_WORKERS:-2} > 0 )); then
  XDIST=(-n "${DAGSTER_GPU_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
fi
.venv/bin/python -m pytest -q -ra --durations=40 "${XDIST[@]}" "$@"
