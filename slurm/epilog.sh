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
# The command root runs must be root's: one another user can write is not run.
wf=$(command -v "$WATTFLEX")
if [ "$(stat -L -c %u -- "$wf")" != 0 ] || [ $(( 0$(stat -L -c %a -- "$wf") & 022 )) != 0 ]; then
  say "$wf is not root's, or others can write it: not run as root; draining the node"
  exit 1
fi
[ -n "${SLURM_JOB_UID:-}" ] && args+=(--job-uid "$SLURM_JOB_UID")
[ -n "${WATTFLEX_CAP_COMMAND:-}" ] && args+=(--cap-command "$WATTFLEX_CAP_COMMAND")
out=$("$WATTFLEX" restore-caps "${args[@]}" 2>&1)
rc=$?
say "restore-caps (exit $rc): $out"
exit $rc
