#!/usr/bin/env bash
# Both ends of the declared dagster range, from the built wheel (not this checkout), each in a clean venv:
#   the floor (pyproject.toml's `dagster>=FLOOR`) and the newest dagster on PyPI below the range's cap
#   (`pip index versions dagster`, resolved when this runs; DAGSTER_GPU_COMPAT_VERSIONS="1.13.0 1.13.29" fixes them).
# Per end: pip installs the wheel with [embed,index] and that dagster (pip cache: $DAGSTER_GPU_CACHE/pip), then
#   1. the compatibility subset of tests/ (executor, definitions, policy, the import surface) against the installed
#      wheel: a copy of tests/ and pipelines/ in a folder without dagster_gpu/, so the checkout is not on sys.path;
#   2. `dagster definitions validate` on the demo code location (pipelines.definitions, from that copy);
#   3. the quickstart (docs/getting-started/quickstart.md) as a project of its own (scripts/quickstart_project.py):
#      installed from its pyproject.toml, its corpus and commands run verbatim: `dagster-gpu backfill` on the local
#      backend, then `dagster-gpu search`; the rows and the nearest hit are asserted.
# The two ends run side by side (most of a backfill is waiting). Per-step times are printed; the versions that
# passed, the base and full install sizes and the code location's load time go to bench/results/summary.json
# (compat.*, scripts/compat_summary.py). Called by scripts/test.sh before pytest.
source "$(dirname "${BASH_SOURCE[0]}")/../resources/lib/errtrap.sh"
cd "$(dirname "$0")/.."
REPO=$PWD
CACHE=${DAGSTER_GPU_CACHE:-$HOME/.cache/dagster-gpu}
PIP=(--cache-dir "$CACHE/pip" -q)
PY=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/dagster-gpu-compat.XXXXXX)
SUBSET=(tests/test_policy.py tests/test_policy_ranges.py tests/test_embedding_asset.py tests/test_sensor.py
        tests/test_worker_command.py tests/test_public_api.py tests/test_import_surface.py
        --deselect tests/test_sensor.py::test_sensor_on_s3)  # moto's S3 server: the suite runs it, [s3] is not installed here
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - $1 )) s"; }

dg_step "building the wheel once (pip wheel --no-deps, from a copy of the sources)"
t=$(date +%s)
mkdir -p "$WORK/src" "$WORK/dist"
cp -r dagster_gpu pyproject.toml README.md "$WORK/src/"
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
"$PY" -m pip wheel "${PIP[@]}" --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/dagster_gpu-*.whl)
echo "compat: $(basename "$WHEEL") in $(elapsed "$t")"

# the subset's tree: tests/ and pipelines/ (the demo code location the tests and `validate` import), no dagster_gpu/
mkdir -p "$WORK/tree"
cp -r tests pipelines pyproject.toml "$WORK/tree/"
find "$WORK/tree" -name __pycache__ -prune -exec rm -rf {} +

FLOOR=$("$PY" -c 'import re,sys; m=re.search(r"\"dagster>=([0-9.]+),<([0-9.]+)\"", open("pyproject.toml").read()); print(m[1], m[2])')
CAP=${FLOOR#* }; FLOOR=${FLOOR% *}
if [ -n "${DAGSTER_GPU_COMPAT_VERSIONS:-}" ]; then
  read -r -a VERSIONS <<<"$DAGSTER_GPU_COMPAT_VERSIONS"
else
  NEWEST=$("$PY" -m pip index versions dagster 2>/dev/null | "$PY" -c "
import sys
from itertools import takewhile
line = [l for l in sys.stdin if l.startswith('Available versions:')][0]
vs = [v.strip() for v in line.split(':', 1)[1].split(',')]
t = lambda v: tuple(int(x) for x in v.split('.') if x.isdigit())
print(next(v for v in vs if t(v) < t('$CAP') and all(x.isdigit() for x in v.split('.'))))")
  VERSIONS=("$FLOOR" "$NEWEST")
fi
echo "compat: dagster versions ${VERSIONS[*]} (floor from pyproject.toml, newest below $CAP on PyPI)"

end_to_end() {  # $1: dagster version; writes $WORK/end-$1/{log,ok,load_s}
  local v=$1 d="$WORK/end-$1" t
  mkdir -p "$d" && cd "$d"
  t=$(date +%s)
  "$PY" -m venv venv
  "$PY" "$REPO/scripts/quickstart_project.py" project "$WORK/dist"
  venv/bin/pip install "${PIP[@]}" --find-links "$WORK/dist" "$WHEEL[embed,index]" "dagster==$v" ./project \
    pytest pytest-timeout
  echo "[$v] install (wheel[embed,index], dagster==$v, the quickstart project, pytest): $(elapsed "$t")"
  venv/bin/python -c "import dagster, dagster_gpu, sys; assert dagster.__version__ == '$v', dagster.__version__; \
assert dagster_gpu.__file__.startswith(sys.prefix), dagster_gpu.__file__; print('[$v] dagster', dagster.__version__, 'dagster_gpu', dagster_gpu.__version__, 'from', dagster_gpu.__file__)"

  t=$(date +%s); local t_qs=$t
  (cd project && bash corpus.sh && PATH="$d/venv/bin:$PATH" DAGSTER_HOME="$d/project/.dagster" bash commands.sh) \
    >"$d/quickstart.log" 2>&1 &
  local qs=$!
  (cd "$WORK/tree" && DAGSTER_HOME="$d/home" "$d/venv/bin/python" -m pytest -q -p no:cacheprovider \
    -o cache_dir="$d/.pytest_cache" "${SUBSET[@]}" --basetemp "$d/pytest")
  echo "[$v] compatibility subset (${SUBSET[*]:0:7} of tests/, against the installed wheel): $(elapsed "$t")"
  t=$(date +%s)
  mkdir -p "$d/home"
  (cd "$WORK/tree" && DAGSTER_HOME="$d/home" "$d/venv/bin/dagster" definitions validate -m pipelines.definitions)
  echo "[$v] dagster definitions validate -m pipelines.definitions: $(elapsed "$t")"
  (cd "$WORK/tree" && "$d/venv/bin/python" -c "
import time; t = time.perf_counter(); import pipelines.definitions; print(round(time.perf_counter() - t, 2))") >"$d/load_s"
  wait "$qs" || { tail -40 "$d/quickstart.log"; echo "[$v] the quickstart failed"; return 1; }
  "$d/venv/bin/python" - "$d/quickstart.log" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
done = re.search(r"^│ (\d+)/(\d+) ok +│ +(\d+) │", log, re.M)
assert done and done[1] == done[2] == "2" and int(done[3]) == 4, f"the backfill's summary row: {done and done[0]}"
hit = re.search(r"nearest rows of docs_index.*?^│ (\S+) +│ (\S+) ", log, re.M | re.S)
assert hit and hit[1] == "pets.txt/1", f"the search's nearest row: {hit and hit[0]}"
print(f"quickstart: backfill {done[1]}/{done[2]} partitions, {done[3]} rows; search's nearest row {hit[1]}")
PY
  echo "[$v] quickstart from the wheel (backfill, index, search), beside the subset: $(elapsed "$t_qs")"
  touch "$d/ok"
}

dg_step "both ends side by side: ${VERSIONS[*]} (logs: $WORK/end-*.log)"
pids=()
for v in "${VERSIONS[@]}"; do
  ( end_to_end "$v" ) >"$WORK/end-$v.log" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!VERSIONS[@]}"; do
  wait "${pids[$i]}" || true
  cat "$WORK/end-${VERSIONS[$i]}.log"
  [ -e "$WORK/end-${VERSIONS[$i]}/ok" ] || failed+=("${VERSIONS[$i]}")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "compat: FAILED with dagster ${failed[*]} (work folder kept: $WORK)" >&2
  exit 1
fi
dg_step "bench/results/summary.json (compat.*)"
"$PY" scripts/compat_summary.py --versions "${VERSIONS[@]}"
echo "compat: the demo code location loaded in $(cat "$WORK/end-${VERSIONS[-1]}/load_s") s with dagster ${VERSIONS[-1]} ([embed,index] installed)"
echo "compat: passed with dagster ${VERSIONS[*]} in $(elapsed "$T0")"
rm -rf "$WORK"
