#!/usr/bin/env bash
# One-time (idempotent) set-up on a fresh Debian machine: system packages, the venv, the project.
# Heavy downloads are cached under $DAGSTER_GPU_CACHE (default ~/.cache/dagster-gpu) and reused
# when present; nothing depends on the cache being there.
source "$(dirname "${BASH_SOURCE[0]}")/../resources/lib/errtrap.sh"
cd "$(dirname "$0")/.."
CACHE=${DAGSTER_GPU_CACHE:-$HOME/.cache/dagster-gpu}
PY=${PYTHON:-python3}
mkdir -p "$CACHE/pip"

apt_pkgs=()
[ -d /usr/share/games/fortunes ] || apt_pkgs+=(fortunes)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || apt_pkgs+=(postgresql)
command -v chromium >/dev/null 2>&1 || apt_pkgs+=(chromium)   # the browser test (tests/test_ui_browser.py)
[ -x /usr/sbin/sshd ] || apt_pkgs+=(openssh-server)   # the Slurm ssh transport's login node (resources/ssh/sshd.sh)
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
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  dg_step "pip install -e .[test,demo] into .venv"
  echo "setup: installing Python packages (pip cache: $CACHE/pip)"
  .venv/bin/pip install -q --upgrade --cache-dir "$CACHE/pip" pip setuptools wheel
  .venv/bin/pip install -q --cache-dir "$CACHE/pip" -c constraints.txt -e ".[test,demo]"
  echo "$want" > "$stamp"
fi
dg_step "checking the venv imports dagster and torch"
echo "setup: ready ($(.venv/bin/python -c 'import dagster, torch; print("dagster", dagster.__version__, "torch", torch.__version__)'))"
