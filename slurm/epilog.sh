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
STATE_DIR=${WATTFLEX_STATE_DIR:-/var/tmp/wattflex}

say() {
  if [ -n "${WATTFLEX_EPILOG_LOG:-}" ]; then
    printf '%s wattflex-epilog job %s: %s\n' "$(date -Is)" "${SLURM_JOB_ID:-?}" "$*" >>"$WATTFLEX_EPILOG_LOG"
  else
    logger -t wattflex-epilog -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true
  fi
}

# The common case, kept fast: no records, nothing to restore, no Python started.
[ -d "$STATE_DIR" ] && [ -n "$(ls -A "$STATE_DIR" 2>/dev/null)" ] || exit 0

if ! command -v "$WATTFLEX" >/dev/null 2>&1; then
  say "cap records in $STATE_DIR but no wattflex command at $WATTFLEX; draining the node"
  exit 1
fi
out=$("$WATTFLEX" restore-caps --state-dir "$STATE_DIR" 2>&1)
rc=$?
say "restore-caps (exit $rc): $out"
exit $rc
