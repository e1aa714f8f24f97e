"""What ``wattflex <command> --help`` shows beside each command's options (wattflex.cli): an
example per command, and the option groups of the commands with many options. Each example
is parsed by the command's own parser in tests/unit/test_cli_help.py, so none can go stale."""

from __future__ import annotations

#: Example command lines per command, shown under "Examples" at the end of its --help.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "allocate": (
        "wattflex allocate results/paper-h200-emulated/runs.parquet --cut 0.3 --policy pfi-aware",
    ),
    "calibrate": (
        "wattflex calibrate --runs my-runs.csv --configfile my.yaml -o calibration.json",
    ),
    "cluster-control": (
        "wattflex cluster-control --signal event.csv --budget-dir /run/wattflex/budgets "
        "--partition gpu --duration-s 3600",
    ),
    "control": (
        "wattflex control --budget-w 4000 --job-gpus 0-3 --job-gpus 4-7 --dry-run",
        "wattflex control --signal event.csv --duration-s 3600 --metrics-port 9400",
    ),
    "doctor": ("wattflex doctor --configfile my.yaml --json",),
    "ingest": ("wattflex ingest sweep-table sweeps.csv -o runs.parquet --pfi pfi.csv",),
    "knobs": (
        "wattflex knobs --curves results/paper-h200-emulated/runs.parquet --jobs jobs.csv "
        "--depth-frac 0.4 --duration-s 7200",
    ),
    "offer": (
        "wattflex offer --configfile config/config.yaml --loss 0.1 --loss 0.25 --hours 4",
        "wattflex offer curves.csv --job dense-ft-llama70b-x16=2 -o offer.csv",
    ),
    "pfi": ("wattflex pfi sweeps.csv -o pfi.csv --mc-samples 2000 --seed 1",),
    "predict": ("wattflex predict telemetry.csv --model results/c/predictor/model.json -o p.csv",),
    "restore-caps": ("wattflex restore-caps --state-dir /run/wattflex --dry-run",),
    "run-at-cap": ("wattflex run-at-cap spec.json results/c/runs/g/cap400 --cap-w 400",),
    "setcap-rule": ("wattflex setcap-rule --part sudoers --group gpu-users",),
    "stats": ("wattflex stats pfi.csv --value-col pfi_ratio --group-col cluster -o tests.csv",),
}

#: Option groups (title: the options' first spellings), in --help order; options not named
#: stay under "options".
GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    "control": {
        "where the budget comes from (one of)": (
            "--budget-w",
            "--signal",
            "--budget-file",
            "--openadr-vtn",
            "--openadr3-vtn",
        ),
        "OpenADR and grid events": (
            "--openadr3-program",
            "--ven-name",
            "--load-file",
            "--budget-stale-s",
            "--ramp-kw-per-s",
            "--response-s",
            "--mv-out",
        ),
        "the jobs on this node and how the budget is split": (
            "--job-gpus",
            "--moe-ft",
            "--model",
            "--policy",
            "--basis",
            "--site",
            "--node",
        ),
        "the jobs' throughput (curve-aware, online-learning)": (
            "--throughput-log",
            "--throughput-preset",
            "--throughput-regex",
            "--throughput-stale-s",
        ),
        "how caps are set and undone": (
            "--cap-control",
            "--cap-command",
            "--state-dir",
            "--restore-stagger-s",
            "--period-s",
            "--duration-s",
        ),
        "trying it out": ("--dry-run", "--at-s"),
        "Prometheus metrics": (
            "--metrics-port",
            "--metrics-addr",
            "--hpc-job-mapping-dir",
            "--hpc-job",
        ),
        "logging": ("--log-level",),
    },
    "cluster-control": {
        "the event and the nodes": (
            "--signal",
            "--budget-dir",
            "--partition",
            "--duration-s",
            "--period-s",
            "--response-s",
            "--mv-out",
        ),
        "how the budget is split": (
            "--policy",
            "--basis",
            "--curves",
            "--job-map",
            "--agent-policy",
            "--gpu",
            "--site",
            "--knob-choice",
            "--agent-state-dir",
        ),
        "Prometheus metrics and logging": (
            "--metrics-port",
            "--metrics-addr",
            "--agent-metrics-addr",
            "--log-level",
        ),
    },
}
