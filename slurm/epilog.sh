#!/bin/bash
# wattflex SLURM epilog: a killed run never leaves a node's GPUs capped.
#
# A capped run records the original power limits in $WATTFLEX_STATE_DIR (default
# /var/tmp/wattflex) and restores them itself on exit, errors and signals; only SIGKILL
# (time limit after KillWait, OOM killer, scancel --signal=KILL) or a crash leaves a record
# behind. This epilog runs after every job on every node of the job and calls
# `wattflex restore-caps`, which restores the records of processes that are gone.
#
# Install (root on each GPU node; see README "Running on a SLURM cluster"):
#   cp slurm/epilog.sh /etc/slurm/epilog.d/50-wattflex.sh    # any path the nodes see
#   slurm.conf: Epilog=/etc/slurm/epilog.d/*                 # or call it from your epilog
#   scontrol reconfigure
# and set WATTFLEX below (or in the environment) to the wattflex command on the nodes.
#
# Exit status: 0 if nothing was left capped or every limit was restored; otherwise that of
# restore-caps (1), which makes SLURM drain the node: a node that may still be capped
# does not silently take the next job. Output goes to $WATTFLEX_EPILOG_LOG if set, else to
# syslog (tag wattflex-epilog).
WATTFLEX=${WATTFLEX:-/opt/wattflex/.venv/bin/wattflex}
# Root runs this, so it trusts nothing another user could write (docs/reliability.md):
# the state folders are root's (/var/tmp/wattflex, create it at install:
#   install -d -m 0755 -o root -g root /var/tmp/wattflex)
# and the job user's own (/var/tmp/wattflex-<uid>); restore-caps reads only records owned by
# root or that user, never runs a command read from one, and the cap command (if the site
# restores through one instead of NVML) comes from here: WATTFLEX_CAP_COMMAND.
if [ -n "${WATTFLEX_STATE_DIR:-}" ]; then
  STATE_DIRS=("$WATTFLEX_STATE_DIR")
else
  STATE_DIRS=(/var/tmp/wattflex)
  [ -n "${SLURM_JOB_UID:-}" ] && [ "$SLURM_JOB_UID" != 0 ] && STATE_DIRS+=("/var/tmp/wattflex-$SLURM_JOB_UID")
fi

# Appending as root to a log another user can replace by a link would write anywhere: the log
# is used only when it is no link and its folder is root's and writable by root alone.
log_is_safe() {
  local log=$1 dir
  dir=$(dirname -- "$log")
  [ ! -L "$log" ] && [ -d "$dir" ] && [ ! -L "$dir" ] && [ "$(stat -c %u -- "$dir")" = 0 ] \
    && [ $(( 0$(stat -c %a -- "$dir") & 022 )) = 0 ] \
    && { [ ! -e "$log" ] || { [ -f "$log" ] && [ "$(stat -c %u -- "$log")" = 0 ]; }; }
}

say() {
  if [ -n "${WATTFLEX_EPILOG_LOG:-}" ] && log_is_safe "$WATTFLEX_EPILOG_LOG"; then
    printf '%s wattflex-epilog job %s: %s\n' "$(date -Is)" "${SLURM_JOB_ID:-?}" "$*" >>"$WATTFLEX_EPILOG_LOG"
  else
    logger -t wattflex-epilog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true
  fi
}

# The common case, kept fast: no records, nothing to restore, no Python started.
args=()
for d in "${STATE_DIRS[@]}"; do
  [ -d "$d" ] && [ -n "$(ls -A "$d" 2>/dev/null)" ] && args+=(--state-dir "$d")
done
[ ${#args[@]} -gt 0 ] || exit 0

if ! command -v "$WATTFLEX" >/dev/null 2>&1; then
  say "cap records in ${STATE_DIRS[*]} but no wattflex command at $WATTFLEX; draining the node"
  exit 1
fi
# Root runs only what root owns end to end (docs/slurm.md "What root trusts"), the way sudo's
# secure_path and SLURM's prolog/epilog rules expect: the wattflex script, each #! interpreter it
# names, every folder on each path from / (through every link and the link's target), and for a
# Python interpreter its own library, the site-packages folders, every .pth file there and each
# folder those add to sys.path, and the wattflex package it imports, file by file. Anything
# another user owns or can write: not run, the node drained.
WHY=""
MAX_LINKS=40          # links one path lookup follows (MAXSYMLINKS, path_resolution(7))
MAX_INTERPRETERS=4    # nested #! interpreters the kernel follows (BINPRM_MAX_RECURSION, fs/exec.c)

# root_only PATH: PATH, and every folder on its way from /, are root's and writable by nobody
# else; a sticky world-writable folder (/tmp) passes on the way only, since another user cannot
# rename or remove the root-owned entry checked next. Else WHY says why, status 1.
root_only() {
  local path=$1 hops=${2:-0} here="" cur uid mode kind target i n
  [[ $path == /* ]] || { WHY="$path is not an absolute path"; return 1; }
  local -a parts
  IFS=/ read -r -a parts <<<"${path#/}"
  n=${#parts[@]}
  for ((i = -1; i < n; i++)); do
    if ((i < 0)); then cur=/; else [ -n "${parts[i]}" ] || continue; cur=$here/${parts[i]}; fi
    if ! IFS=' ' read -r uid mode kind < <(stat -c '%u %a %F' -- "$cur" 2>/dev/null); then
      WHY="$cur does not exist"; return 1
    fi
    [ "$uid" = 0 ] || { WHY="$cur is owned by uid $uid, not by root"; return 1; }
    if [ "$kind" = "symbolic link" ]; then
      ((hops < MAX_LINKS)) || { WHY="$path: more than $MAX_LINKS links"; return 1; }
      target=$(readlink -- "$cur")
      [[ $target == /* ]] || target=$here/$target
      local IFS=/
      root_only "$target/${parts[*]:i+1}" $((hops + 1)) && return 0 || return 1
    fi
    if (( 8#$mode & 8#022 )) && ! { [ "$kind" = directory ] && (( 8#$mode & 8#1000 )) && ((i < n - 1)); }; then
      WHY="$cur is writable by group or others (mode $mode)"; return 1
    fi
    [ "$cur" = / ] || here=$cur
  done
}

# program_ok PATH: PATH is root's end to end (root_only) and so is each #! interpreter, which is
# what runs; a Python interpreter is checked with what it imports (python_ok). Sets PYTHON.
program_ok() {
  local path=$1 line k
  PYTHON=""
  for ((k = 0; k <= MAX_INTERPRETERS; k++)); do
    root_only "$path" || return 1
    line=$(head -c 256 -- "$path" | head -n 1 | tr -d '\0')
    if [[ $line != '#!'* ]]; then
      [[ $(basename -- "$path") == python* ]] && PYTHON=$path
      return 0
    fi
    read -r path _ <<<"${line#\#!}"
    [ -n "$path" ] || { WHY="$1 has an empty #! line"; return 1; }
    [ "$(basename -- "$path")" != env ] || { WHY="$1 names its interpreter through $path, which searches PATH"; return 1; }
  done
  WHY="$1: more than $MAX_INTERPRETERS nested #! interpreters"; return 1
}

# python_ok PYTHON: what PYTHON imports is root's. Without site (-I -S: no .pth file runs, no
# environment is read) it names its own library and its site-packages; each .pth file there and
# each folder it adds are checked before Python runs with them; then sys.path as the script
# sees it (-I: no PYTHONPATH, no user site) and the wattflex package, every file in it.
python_ok() {
  local py=$1 d f line pkg out
  local -a bare site full
  out=$("$py" -I -S -c 'import sys, sysconfig; print(*sys.path, sep="\n"); print(sysconfig.get_path("purelib")); print(sysconfig.get_path("platlib"))') \
    || { WHY="$py -I -S did not start"; return 1; }
  mapfile -t bare <<<"$out"
  site=("${bare[@]: -2}")
  for d in "${bare[@]}"; do
    [ -e "$d" ] || continue
    root_only "$d" || return 1
  done
  for d in "${site[@]}"; do
    [ -d "$d" ] || continue
    for f in "$d"/*.pth; do
      [ -e "$f" ] || continue
      root_only "$f" || return 1
      while IFS= read -r line || [ -n "$line" ]; do
        case $line in "" | "#"* | import* | "	"import* | " "import*) continue ;; esac
        [[ $line == /* ]] || line=$d/$line
        if [ -e "$line" ]; then root_only "$line" || return 1; fi
      done <"$f"
    done
  done
  out=$("$py" -I -c 'import sys, importlib.util as u; s = u.find_spec("wattflex"); print(*sys.path, sep="\n"); print(*(s.submodule_search_locations or [s.origin]) if s else "", sep="\n")') \
    || { WHY="$py -I could not look up the wattflex package"; return 1; }
  mapfile -t full <<<"$out"
  for d in "${full[@]}"; do
    [ -n "$d" ] && [ -e "$d" ] || continue
    root_only "$d" || return 1
  done
  pkg=${full[-1]}
  [ -n "$pkg" ] || { WHY="$py imports no wattflex package"; return 1; }
  f=$(find "$pkg" \( ! -user 0 -o \( ! -type l -perm /022 \) \) -print -quit 2>/dev/null)
  [ -z "$f" ] || { WHY="$f in the wattflex package is not root's, or others can write it"; return 1; }
}

if [ "$WATTFLEX" != "${WATTFLEX#/}" ]; then wf=$WATTFLEX; else wf=$(command -v "$WATTFLEX"); fi
if ! program_ok "$wf" || { [ -n "$PYTHON" ] && ! python_ok "$PYTHON"; }; then
  say "$wf: $WHY: not run as root; draining the node"
  exit 1
fi
[ -n "${SLURM_JOB_UID:-}" ] && args+=(--job-uid "$SLURM_JOB_UID")
[ -n "${WATTFLEX_CAP_COMMAND:-}" ] && args+=(--cap-command "$WATTFLEX_CAP_COMMAND")
[ -n "${SLURM_JOB_GPUS:-}" ] && args+=(--job-gpus "$SLURM_JOB_GPUS")
# a clean environment: nothing from the caller's (PYTHONPATH, LD_PRELOAD, ...) reaches root's run
# SLURMD_NODENAME (slurmd's, not the user's) names this node to `slurmd -G` when restore-caps maps
# the job's GPU indices to UUIDs
out=$(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C SLURMD_NODENAME="${SLURMD_NODENAME:-}" \
  "$wf" restore-caps "${args[@]}" 2>&1)
rc=$?
say "restore-caps (exit $rc): $out"
exit $rc
