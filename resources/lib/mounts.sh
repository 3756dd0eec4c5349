# shellcheck shell=bash
# Sourced by scripts that bind host paths into a root (resources/slurm/trixie.sh):
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib/mounts.sh"
#   unmount_stale "$ROOT/repo" /repo    # a mount an earlier start left that no longer shows /repo
#
# A bind mount keeps the directory it was made from: once that directory is deleted and a new one created at
# the same path (a checkout removed and cloned again), the mount still shows the deleted one (mountinfo's root
# field ends in "//deleted"), and a process whose working directory is in it gets ENOENT from getcwd(3) (sbatch:
# "getcwd failed: No such file or directory"). Compare by device and inode, not by path.

# is_mounted <path>: something is mounted exactly at path (mountinfo field 5, the mount point).
is_mounted() { awk -v d="$1" '$5 == d {f=1} END {exit !f}' /proc/self/mountinfo; }

# mounted_under <dir>: any mount point at or below dir.
mounted_under() { awk -v d="$1" '$5 == d || index($5, d "/") == 1 {f=1} END {exit !f}' /proc/self/mountinfo; }

# same_dir <a> <b>: both paths exist and name the same directory (device and inode).
same_dir() {
  local a b
  a="$(stat -L -c %d:%i "$1" 2>/dev/null)" || return 1
  b="$(stat -L -c %d:%i "$2" 2>/dev/null)" || return 1
  [ "$a" = "$b" ]
}

# unmount_stale <mount point> <host path>: unmount what is mounted at the point unless it shows the host path.
# Returns 0 when nothing stale is left there (nothing mounted, the right mount, or the stale one removed).
unmount_stale() {
  is_mounted "$1" || return 0
  same_dir "$2" "$1" && return 0
  printf '[%s] %s is a stale mount (no longer %s): unmounting it\n' "${DG_SCRIPT_NAME:-mounts.sh}" "$1" "$2" >&2
  umount -R "$1" 2>/dev/null || umount -R -l "$1"
}
