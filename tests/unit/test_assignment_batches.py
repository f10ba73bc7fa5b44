"""How the leader packs a round's runs into assignment messages (`run_batches`): one
message per node, in order, within the count and size bounds."""

from __future__ import annotations

from coordinator.leader import BATCH_BYTES, run_batches
from coordinator.records import TaskRecord
from mesh.schema import MAX_ASSIGNMENT_BATCH
from workloads.spec import MAX_COMMAND_BYTES, TaskGroup

SMALL = TaskGroup("w", 1000, ("true",))
BIG = TaskGroup("b", 100, ("x" * (MAX_COMMAND_BYTES - 100),), (("E", "y" * 60_000),))


def tasks(node: str, n: int, group: TaskGroup = SMALL, start: int = 0) -> list[TaskRecord]:
    return [
        TaskRecord(f"j.{group.role}.{i}", "j", group.role, i, group, node_id=node)
        for i in range(start, start + n)
    ]


def test_one_message_per_node_in_order():
    a, b = tasks("a", 3), tasks("b", 2, start=3)
    mixed = [a[0], b[0], a[1], b[1], a[2]]
    assert run_batches(mixed) == [a, b]
    assert run_batches([]) == []


def test_a_node_with_many_runs_gets_full_messages():
    many = tasks("a", 2 * MAX_ASSIGNMENT_BATCH + 1)
    out = run_batches(many)
    assert [len(b) for b in out] == [MAX_ASSIGNMENT_BATCH, MAX_ASSIGNMENT_BATCH, 1]
    assert [t for b in out for t in b] == many


def test_big_runs_are_split_by_size_and_never_dropped():
    big = tasks("a", 12, BIG)
    out = run_batches(big)
    per_run = len(BIG.command[0]) + len(BIG.env[0][1])
    assert all(len(b) * per_run <= BATCH_BYTES for b in out)
    assert len(out) > 1 and [t for b in out for t in b] == big
