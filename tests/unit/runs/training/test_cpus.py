"""Per-rank CPU binding (wattflex.runs.training.cpus): the split of a task's CPUs among a node's
ranks (pure), the socket/core order from a sysfs tree made here, and the config key."""

from pathlib import Path

import pytest

from wattflex.runs.training.cpus import parse_cpu_list, split_cpus, topology_order
from wattflex.runs.training.train_config import TrainConfig


def shares(cpus: list[int], world: int) -> list[list[int]]:
    return [split_cpus(cpus, r, world) for r in range(world)]


def test_split_gives_every_rank_a_disjoint_contiguous_share_that_covers_all():
    assert shares(list(range(8)), 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert shares(list(range(10)), 4) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
        [8, 9],
    ]  # sizes differ by <= 1
    assert shares([3, 7, 9], 1) == [[3, 7, 9]]
    big = shares(list(range(96)), 8)
    assert sorted(c for s in big for c in s) == list(range(96)) and {len(s) for s in big} == {12}


def test_split_with_fewer_cpus_than_ranks_gives_one_cpu_each_in_turn():
    assert shares([4, 5], 4) == [[4], [5], [4], [5]]


@pytest.mark.parametrize(
    "rank, world, message",
    [(2, 2, "local rank 2 of 2"), (-1, 2, "local rank -1"), (0, 0, "local rank 0 of 0")],
)
def test_split_refuses_a_rank_outside_the_node(rank, world, message):
    with pytest.raises(ValueError, match=message):
        split_cpus([0, 1], rank, world)


def test_split_of_no_cpus_is_refused():
    with pytest.raises(ValueError, match="no CPUs"):
        split_cpus([], 0, 1)


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]


def fake_sysfs(root: Path, sockets: int, cores: int) -> Path:
    """Linux's usual numbering: cpu i and i + sockets*cores are one core's two hyperthreads,
    socket s has cores s*cores .. (s+1)*cores - 1."""
    n = sockets * cores
    for cpu in range(2 * n):
        core = cpu % n
        top = root / f"cpu{cpu}" / "topology"
        top.mkdir(parents=True)
        (top / "physical_package_id").write_text(f"{core // cores}\n")
        (top / "thread_siblings_list").write_text(f"{core},{core + n}\n")
    return root


def test_topology_order_keeps_sockets_together_and_hyperthreads_side_by_side(tmp_path):
    sysfs = fake_sysfs(tmp_path, sockets=2, cores=2)  # cpus 0-7: socket 0 = cores 0,1 (+4,5)
    order = topology_order(range(8), sysfs)
    assert order == [0, 4, 1, 5, 2, 6, 3, 7]
    # two ranks: one socket each, no core split between them (a plain id split would give
    # rank 1 the hyperthreads of rank 0's cores)
    assert shares(order, 2) == [[0, 4, 1, 5], [2, 6, 3, 7]]
    assert topology_order([6, 2], sysfs) == [2, 6]


def test_topology_order_without_sysfs_is_by_id(tmp_path):
    assert topology_order([3, 1, 2, 1], tmp_path / "none") == [1, 2, 3]


def test_cpu_binding_is_on_unless_the_cuda_section_turns_it_off(tmp_path):
    assert TrainConfig.from_spec({"cuda": {}}, tmp_path).cpu_binding
    cfg = TrainConfig.from_spec({"cuda": {"cpu_binding": False}}, tmp_path)
    cfg.to_json(tmp_path / "c.json")
    assert TrainConfig.from_json(tmp_path / "c.json").cpu_binding is False
