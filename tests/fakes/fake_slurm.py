"""FAKE ``squeue`` and ``srun`` for ``wattflex cluster-control`` tests: :func:`install` writes
both into a folder to put first on PATH.

- ``squeue`` answers, call after call, the next of the answers given (the last one again
  once they run out): ``{"rc": N, "stdout": TEXT, "sleep": S}``; every call is counted in ``squeue.calls``.
- ``srun`` stands in for the agent's job step: it writes its arguments to
  ``srun.<pid>.args``, answers as an agent would (its ``--load-file``, 1300 W, every 0.1 s)
  for as long as the agent's ``--duration-s`` says, and on SIGTERM writes
  ``srun.<pid>.terminated`` and exits 143, as a step that srun signals would.
"""

import json
import sys
from pathlib import Path

SQUEUE = """
import json, sys
from pathlib import Path
here = Path(__file__).resolve().parent
answers = json.loads((here / "squeue.answers").read_text())
calls = here / "squeue.calls"
n = int(calls.read_text()) if calls.exists() else 0
calls.write_text(str(n + 1))
a = answers[min(n, len(answers) - 1)]
__import__("time").sleep(a.get("sleep", 0))  # a squeue that hangs
sys.stdout.write(a.get("stdout", ""))
sys.stderr.write(a.get("stderr", ""))
sys.exit(a.get("rc", 0))
"""

SRUN = """
import json, os, signal, sys, time
from pathlib import Path
here = Path(__file__).resolve().parent
(here / f"srun.{os.getpid()}.args").write_text("\\n".join(sys.argv[1:]))
def on_term(signum, frame):
    (here / f"srun.{os.getpid()}.terminated").write_text("")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
arg = lambda name: sys.argv[sys.argv.index(name) + 1]
load, end = Path(arg("--load-file")), time.time() + float(arg("--duration-s"))
while time.time() < end:
    tmp = load.with_name(f".{load.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"unit": load.name.removesuffix(".load.json"), "load_w": 1300.0,
                               "caps_w": [650.0, 650.0], "t_unix": time.time()}))
    tmp.replace(load)
    time.sleep(0.1)
"""


def install(bin_dir: Path, answers: list[dict]) -> Path:
    """``squeue`` (answering ``answers`` in turn) and ``srun`` in ``bin_dir``; returns it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "squeue.answers").write_text(json.dumps(answers))
    for name, body in (("squeue", SQUEUE), ("srun", SRUN)):
        exe = bin_dir / name
        exe.write_text(f"#!{sys.executable}\n{body}")
        exe.chmod(0o755)
    return bin_dir


def squeue_json(*jobs: dict) -> dict:
    """An answer of ``squeue --json`` listing ``jobs``."""
    return {"stdout": json.dumps({"jobs": list(jobs)})}


def gpu_job(job_id, node="node0", gpus="0-1", **extra) -> dict:
    """A running job holding GPUs ``gpus`` on ``node``, as ``squeue --json`` describes it."""
    return {
        "job_id": job_id,
        "name": f"job{job_id}",
        "job_state": ["RUNNING"],
        "nodes": node,
        "gres_detail": [f"gpu:h200:2(IDX:{gpus})"],
        **extra,
    }


def terminated(bin_dir: Path) -> int:
    return len(list(bin_dir.glob("srun.*.terminated")))


def started(bin_dir: Path) -> int:
    return len(list(bin_dir.glob("srun.*.args")))
