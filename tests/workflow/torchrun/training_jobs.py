"""Helpers of the training-harness tests: real torchrun jobs on CPU (the harness itself, or probe
scripts that build the harness's model in every rank and report what that rank holds)."""

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# A probe's first lines: the harness's model (``model``, ``info``) in this rank, and a whole,
# one-process reference (``ref``, ``ref_params``) built from the same config and seed.
PROBE_PREAMBLE = textwrap.dedent("""
    import json, sys, torch
    from wattflex.runs.training import models, sharded, trainer
    from wattflex.runs.training.train_config import TrainConfig
    torch.set_num_threads(1)
    cfg = TrainConfig.from_json(sys.argv[1])
    dist = trainer.init_distributed(cfg)
    model, info = trainer.prepare_model(cfg, dist)
    torch.manual_seed(cfg.seed)
    ref = models.build_model(cfg, torch.float32, ep=cfg.ep)
    if cfg.task == "lora":
        ref = models.apply_lora(ref, cfg)
    ref_params = dict(ref.named_parameters())
""")


def torchrun(
    args: list[str], nproc: int = 2, timeout_s: float = 300.0
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )


def train_torchrun(cfg, nproc: int = 2) -> subprocess.CompletedProcess:
    """The harness (``python -m wattflex.runs.training``) on ``cfg`` in ``nproc`` ranks; the
    config goes to cfg.json in ``cfg.outdir``."""
    Path(cfg.outdir).mkdir(parents=True, exist_ok=True)
    path = Path(cfg.outdir) / "cfg.json"
    cfg.to_json(path)
    return torchrun(["-m", "wattflex.runs.training", "--config", str(path)], nproc)


# One torchrun job for many probes: each rank imports torch, transformers and peft once (~3.6 s
# of CPU), then runs each case's script in a process forked from it, so that every case starts
# from a state no other case touched (torch caches DTensor layouts across process groups).
PROBE_DRIVER = textwrap.dedent("""
    import ctypes, json, os, runpy, signal, sys, traceback
    import peft, torch, transformers
    from torch.distributed import distributed_c10d
    from wattflex.runs.training import models, sharded, trainer
    rank = os.environ["RANK"]
    for i, (case, script, cfg_path, outdir) in enumerate(json.loads(open(sys.argv[1]).read())):
        print(f"rank {rank}: probe case {case}", file=sys.stderr, flush=True)
        pid = os.fork()
        if pid == 0:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: dies with its rank
            # the store still holds the last case's connection keys under the group names "0", ...
            distributed_c10d._world.group_count = 1000 * i
            code = 0
            try:
                sys.argv = [script, cfg_path]
                runpy.run_path(script, run_name="__main__")
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
            sys.exit(f"rank {rank}: probe case {case} failed")
        open(f"{outdir}/done{rank}", "w").close()
""")


@dataclass
class ProbeJob:
    """The reports of one torchrun job that ran several probe cases in turn."""

    result: subprocess.CompletedProcess
    outdirs: dict[str, Path]
    nproc: int

    def reports(self, case: str) -> list[dict]:
        """Every rank's report of ``case``; fails, naming the case and with the rank logs, unless
        every rank finished it (a case that failed stops the job), or if the job failed after
        its last case."""
        outdir = self.outdirs[case]
        unfinished = [rank for rank in range(self.nproc) if not (outdir / f"done{rank}").exists()]
        log = self.result.stderr
        log = log[log.rfind("\n", 0, max(log.find(f": probe case {case}\n"), 0)) + 1 :][
            -4000:
        ]  # from this case on
        assert not unfinished, (
            f"probe case {case}: rank(s) {unfinished} did not finish it "
            f"(the job exited {self.result.returncode}):\n{log}"
        )
        finished_all = all(
            (d / f"done{rank}").exists()
            for d in self.outdirs.values()
            for rank in range(self.nproc)
        )
        assert self.result.returncode == 0 or not finished_all, (
            f"the probe job failed after its last case:\n{log}"
        )
        return [
            json.loads((outdir / f"probe{rank}.json").read_text()) for rank in range(self.nproc)
        ]


def run_probes(
    cases: dict[str, tuple[str, object]], workdir: Path, nproc: int = 2, timeout_s: float = 300.0
) -> ProbeJob:
    """One job of ``nproc`` ranks that runs ``PROBE_PREAMBLE + body`` for each case ``name: (body,
    cfg)`` in turn; ``body`` writes ``probe<rank>.json`` into its ``cfg.outdir`` (one per case)."""
    plan = []
    outdirs = {case: Path(cfg.outdir) for case, (_, cfg) in cases.items()}
    assert len(set(outdirs.values())) == len(outdirs), "each case needs its own outdir"
    for case, (body, cfg) in cases.items():
        outdirs[case].mkdir(parents=True, exist_ok=True)
        # the case's name as a file name, e.g. "random_init-Llama-3.1-70B-pt"
        script, cfg_path = workdir / f"probe-{case}.py", workdir / f"cfg-{case}.json"
        script.write_text(PROBE_PREAMBLE + textwrap.dedent(body))
        cfg.to_json(cfg_path)
        plan.append((case, str(script), str(cfg_path), cfg.outdir))
    (workdir / "probes.json").write_text(json.dumps(plan))
    (workdir / "probes.py").write_text(PROBE_DRIVER)
    r = torchrun([str(workdir / "probes.py"), str(workdir / "probes.json")], nproc, timeout_s)
    return ProbeJob(r, outdirs, nproc)
