"""Throughput into the live controller from the log the job already writes: ``wattflex
control --throughput-log`` follows each job's training log with the command backend's
torchtitan preset. Two FAKE trainers per controller (tests/fakes/fake_trainer.py) on FAKE NVML
GPUs run at throughputs that follow their GPU's power, one job 2.5x the other's; two
controllers on two GPU pairs at once, curve-aware and equal-weight, follow the same 30 % event,
and the tokens the fake trainers count say which split kept more. Without a source, a
policy that needs throughput is refused before anything is read."""

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.nvml_fixture import FAKES, control_popen, fake_nvml, limits_w  # noqa: F401
from wattflex import cli

pytestmark = [pytest.mark.fake_gpu, pytest.mark.slow]

EVENT = {"event_id": "ev", "start_s": 12.0, "end_s": 30.0, "fraction": 0.7}
JOBS = [(20000.0, 0.6), (8000.0, 0.6)]  # FAKE curves per job of a pair: T_max tokens/s, exponent


def tokens_per_s(url):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    fams = text_string_to_metric_families(text)
    return {
        s.labels["workload"]: s.value
        for f in fams
        if f.name == "wattflex_job_tokens_per_second"
        for s in f.samples
    }


def test_curve_aware_on_live_throughput_keeps_more_tokens_than_equal_weight(fake_nvml, tmp_path):
    fake_nvml.reset(n_gpus=4, path=tmp_path / "gpus.json")
    events = tmp_path / "events.json"
    events.write_text(json.dumps({"events": [EVENT]}))
    trainers, logs = [], []
    for gpu in range(4):
        t_max, alpha = JOBS[gpu % 2]
        logs.append(tmp_path / f"train{gpu}.log")
        trainers.append(
            subprocess.Popen(
                [sys.executable, str(FAKES / "fake_trainer.py"), str(gpu), str(t_max), str(alpha)]
                + [str(logs[-1]), str(tmp_path / f"tokens{gpu}"), "34"]
            )
        )
    controls = {
        policy: control_popen(
            tmp_path,
            "--signal",
            str(events),
            "--policy",
            policy,
            "--job",
            str(a),
            "--job",
            str(a + 1),
            "--throughput-log",
            str(logs[a]),
            "--throughput-log",
            str(logs[a + 1]),
            "--throughput-preset",
            "torchtitan",
            "--period-s",
            "0.2",
            "--state-dir",
            str(tmp_path / f"st-{policy}"),
            "--metrics-port",
            "0",
        )
        for policy, a in (("curve-aware", 0), ("equal-weight", 2))
    }
    try:
        urls = {}
        for policy, proc in controls.items():
            assert proc.stdout.readline().startswith("controlling 2 GPU(s)"), proc.stderr.read()
            urls[policy] = proc.stdout.readline().split("metrics at ", 1)[1].strip()
        time.sleep(20)  # inside the event
        live = {p: tokens_per_s(u) for p, u in urls.items()}
        caps = limits_w()
        for t in trainers:
            assert t.wait(timeout=60) == 0
        for proc in controls.values():
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        for p in [*trainers, *controls.values()]:
            if p.poll() is None:
                p.kill()
    # the throughput panel has numbers: each job's logged rate, as the exporter serves it
    assert all(v > 0 for rates in live.values() for v in rates.values()), live
    assert set(live["curve-aware"]) == {"gpu0", "gpu1"} and set(live["equal-weight"]) == {
        "gpu2",
        "gpu3",
    }
    # equal-weight: one cap for both jobs; curve-aware: the job with more tokens per watt first
    assert caps[2] == caps[3] and caps[0] > caps[1], caps
    kept = [float((tmp_path / f"tokens{g}").read_text()) for g in range(4)]
    print(f"caps in the event {caps} W; tokens kept {kept}; live tokens/s {live}")
    assert kept[0] + kept[1] > kept[2] + kept[3], kept
    assert limits_w() == [700.0] * 4


def test_a_throughput_policy_without_a_source_is_refused_before_anything_is_read(
    fake_nvml, tmp_path, capsys
):
    for policy in ("curve-aware", "online-learning"):
        assert cli.main(["control", "--budget-w", "900", "--dry-run", "--policy", policy]) == 2
        err = capsys.readouterr().err
        assert f"--policy {policy} needs each job's tokens/s: give --throughput-log" in err
    assert fake_nvml.state()["set_calls"] == []
