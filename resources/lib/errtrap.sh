# shellcheck shell=bash
# Sourced by every script of the project (scripts/, resources/, .ci/run) right after its header:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib/errtrap.sh"     # path relative to the script
#   dg_step "starting slurmctld" "$D/log/slurmctld.log"              # what runs now, and where its log is
#
# It turns on `set -Eeuo pipefail` and `inherit_errexit` (a failure inside `$(...)` stops the script too),
# and installs two traps. ERR remembers the first command that failed in the script's own shell, with its
# file and line; EXIT, when the script ends with a non-zero status, prints one block to stderr:
#
#   [cluster.sh] FAILED at step 'starting slurmctld' (exit 1)
#   [cluster.sh]   command: wait_for "slurmctld (scontrol ping)" "$TIMEOUT" ctld_up
#   [cluster.sh]   where: start_slurmctld at resources/slurm/cluster.sh:180 <- cmd_start at …:270 <- main at …:320
#   [cluster.sh]   log: /tmp/dagster-gpu-slurm/log/slurmctld.log (last 20 lines below)
#   ...
#
# A step's log may be a file (its last DG_LOG_TAIL_LINES lines are printed, default 20), a directory (the
# last lines of each *.log in it), or empty ("the output above": the step writes to this terminal).
# `dg_quiet` before an exit whose status is an answer rather than a failure (`cluster.sh status`) keeps the
# block from printing. Pipelines: never end one with an early-exiting reader (`| head`, `| grep -q`,
# `| grep -m`); under pipefail the writer's SIGPIPE (exit 141) fails the script depending on timing. Read
# the whole output instead (`grep -q PATTERN <<<"$(cmd)"`, `first_line=$(cmd); first_line=${first_line%%$'\n'*}`);
# tests/test_scripts.py checks every script for both rules.

set -Eeuo pipefail
shopt -s inherit_errexit

DG_SCRIPT_NAME="${DG_SCRIPT_NAME:-$(basename "$0")}"
DG_STEP="${DG_STEP_DEFAULT:-$DG_SCRIPT_NAME ${1:-}}"
DG_STEP_LOG=""
DG_STEP_TAIL=tail
DG_FAILED_CMD=""
DG_FAILED_AT=""
DG_TOP_PID=$$

# dg_step <what> [<log file or directory>] [notail]: name the step that runs now and where its output
# goes; `notail` when the step runs another of our scripts, which prints its own log's tail on failure.
dg_step() {
  DG_STEP="$1"
  DG_STEP_LOG="${2:-}"
  DG_STEP_TAIL="${3:-tail}"
}

# dg_quiet: a non-zero exit from here on is an answer (status queries), not a failure to report.
dg_quiet() { DG_STEP=""; }

# dg_log_tail <file or dir> [lines]: the last lines of a log file, or of each *.log in a directory.
dg_log_tail() {
  local path="$1" n="${2:-${DG_LOG_TAIL_LINES:-20}}" f
  if [[ -f "$path" ]]; then
    printf -- '----- last %s lines of %s -----\n' "$n" "$path"
    tail -n "$n" "$path" || true
  elif [[ -d "$path" ]]; then
    for f in "$path"/*.log; do
      [[ -f "$f" ]] || continue
      printf -- '----- last %s lines of %s -----\n' "$n" "$f"
      tail -n "$n" "$f" || true
    done
  fi
}

_dg_on_err() {  # rc, command: remember the first failure in the script's own shell, with its call chain
  [[ "$BASHPID" == "$DG_TOP_PID" && -z "$DG_FAILED_CMD" ]] || return 0
  DG_FAILED_CMD="$2"
  local i at=""
  for ((i = 1; i < ${#FUNCNAME[@]}; i++)); do
    at+="${at:+ <- }${FUNCNAME[i]} at ${BASH_SOURCE[i]}:${BASH_LINENO[i - 1]}"
  done
  DG_FAILED_AT="$at"
}

_dg_on_exit() {
  local rc=$?
  ((rc != 0)) || return 0
  [[ "$BASHPID" == "$DG_TOP_PID" && -n "$DG_STEP" ]] || return 0
  {
    echo "[$DG_SCRIPT_NAME] FAILED at step '$DG_STEP' (exit $rc)"
    if [[ -n "$DG_FAILED_CMD" ]]; then
      echo "[$DG_SCRIPT_NAME]   command: $DG_FAILED_CMD"
      echo "[$DG_SCRIPT_NAME]   where: $DG_FAILED_AT"
    fi
    if [[ -n "$DG_STEP_LOG" ]]; then
      echo "[$DG_SCRIPT_NAME]   log: $DG_STEP_LOG"
      [[ "$DG_STEP_TAIL" == notail ]] || dg_log_tail "$DG_STEP_LOG"
    else
      echo "[$DG_SCRIPT_NAME]   log: the output above (this step writes to the terminal)"
    fi
  } >&2
  return "$rc"
}

trap '_dg_on_err "$?" "$BASH_COMMAND"' ERR
trap _dg_on_exit EXIT
