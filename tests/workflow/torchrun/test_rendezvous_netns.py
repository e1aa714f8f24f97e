"""Multi-node rendezvous across a real network whose host names do not resolve.

Two network namespaces made by the test itself, joined by a veth pair with addresses of their
own, each running one node's torchrun in a UTS namespace whose host name resolves nowhere (as on
clusters where a node's name is not in DNS, or resolves to a management interface). The launch
flags and the environment are the real ones: ``real_run.training_command`` (``--local-addr``) and
``real_run.nccl_env`` (``socket_ifname``: GLOO_SOCKET_IFNAME too); only the training module is a
two-line gloo all-reduce, so the test measures the rendezvous and nothing else.

Without ``--local-addr`` the c10d rendezvous names node 0 by its host name, which becomes every
worker's MASTER_ADDR, and init hangs; with it both nodes' ranks meet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from wattflex.runs import real_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "unshare")),
        reason="network namespaces need root, ip (iproute2) and unshare",
    ),
]
SUBNET = "10.213.{}.{}"  # the test's own hosts, inside namespaces this test creates
WORKER = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t.item():g} master {os.environ['MASTER_ADDR']}", flush=True)
dist.destroy_process_group()
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """Two namespaces ``(name, address, interface)`` on one veth link; removed afterwards."""
    tag = f"wf{os.getpid() % 100000}"
    net = os.getpid() % 250
    hosts = [
        (f"{tag}a", SUBNET.format(net, 1), f"{tag}va"),
        (f"{tag}b", SUBNET.format(net, 2), f"{tag}vb"),
    ]
    try:
        for ns, _, _ in hosts:
            ip("netns", "add", ns)
        ip("link", "add", hosts[0][2], "type", "veth", "peer", "name", hosts[1][2])
        for ns, addr, dev in hosts:
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def launch(
    tmp_path: Path, hosts, local_addr: bool, timeout_s: float
) -> list[subprocess.CompletedProcess]:
    """Both nodes' torchrun at once, as the node agents start them; their results."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    rdzv = f"{hosts[0][1]}:29531"
    procs = []
    for rank, (ns, addr, dev) in enumerate(hosts):
        cmd = real_run.training_command(
            tmp_path / "unused.json",
            0.0,
            1,
            nnodes=2,
            node_rank=rank,
            rdzv=rdzv,
            run_id="netns",
            local_addr=addr if local_addr else None,
        )
        cmd = cmd[: cmd.index("-m", 2)] + [
            str(worker)
        ]  # the launch flags, a gloo all-reduce for training
        env = {**os.environ, **real_run.nccl_env({"socket_ifname": dev}), "OMP_NUM_THREADS": "1"}
        host = f"node{rank}-resolves-nowhere"
        procs.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "unshare",
                    "--uts",
                    "sh",
                    "-c",
                    f'hostname {host} && exec "$@"',
                    "sh",
                    "timeout",
                    str(timeout_s),
                    *cmd,
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return [subprocess.CompletedProcess(p.args, p.wait(), p.communicate()[0], "") for p in procs]


def test_nodes_whose_names_do_not_resolve_meet_at_slurms_addresses(tmp_path, two_hosts):
    done = launch(tmp_path, two_hosts, local_addr=True, timeout_s=90)
    for rank, proc in enumerate(done):
        assert proc.returncode == 0, proc.stdout[-2000:]
        assert f"rank {rank} sum 3 master {two_hosts[0][1]}" in proc.stdout


def test_without_local_addr_the_same_launch_does_not_meet(tmp_path, two_hosts):
    """The mechanism the fix removes: node 0 is named by its host name, which resolves nowhere."""
    done = launch(tmp_path, two_hosts, local_addr=False, timeout_s=25)
    assert all(p.returncode != 0 for p in done)
    assert "node0-resolves-nowhere" in done[0].stdout and "rank 0 sum" not in done[0].stdout
