#!/usr/bin/env bash
# One-time (idempotent) set-up on a fresh Debian machine: what the demo uses (system packages, the venv, the
# project with the extras in $DAGSTER_GPU_EXTRAS, default "demo"). scripts/test.sh adds what only the tests use
# (Chromium, openssh-server, the test extra). Heavy downloads are cached under $DAGSTER_GPU_CACHE (default
# ~/.cache/dagster-gpu) and reused when present; nothing depends on the cache being there.
source "$(dirname "${BASH_SOURCE[0]}")/../resources/lib/errtrap.sh"
cd "$(dirname "$0")/.."
CACHE=${DAGSTER_GPU_CACHE:-$HOME/.cache/dagster-gpu}
PY=${PYTHON:-python3}
EXTRAS=${DAGSTER_GPU_EXTRAS:-demo}
mkdir -p "$CACHE/pip"

apt_pkgs=()
[ -d /usr/share/games/fortunes ] || apt_pkgs+=(fortunes)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || apt_pkgs+=(postgresql)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  dg_step "apt-get install ${apt_pkgs[*]}"
  echo "setup: apt-get install ${apt_pkgs[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  dg_step "creating the venv (.venv) with $PY"
  "$PY" -m venv .venv
fi
stamp=".venv/.dagster-gpu-installed"
want=$( (cat pyproject.toml constraints.txt; echo "$EXTRAS") | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  dg_step "pip install -e .[$EXTRAS] into .venv"
  echo "setup: installing Python packages (pip cache: $CACHE/pip)"
  .venv/bin/pip install -q --upgrade --cache-dir "$CACHE/pip" pip setuptools wheel
  .venv/bin/pip install -q --cache-dir "$CACHE/pip" -c constraints.txt -e ".[$EXTRAS]"
  echo "$want" > "$stamp"
fi
dg_step "checking the venv imports dagster and torch"
echo "setup: ready ($(.venv/bin/python -c 'import dagster, torch; print("dagster", dagster.__version__, "torch", torch.__version__)'))"
