"""Partition membership as folded from the job log (coordinator/partitions/membership.py
through RegionState.apply): defaults and labels, moves, home, break-glass and restore,
the config, and what placement asks of jobs and nodes."""

from __future__ import annotations

import pytest

from coordinator.partitions.config import PartitionSpec, parse_partitions_config
from coordinator.partitions.membership import allocatable, placing
from coordinator.partitions.moves import restore_events
from mesh.codec import WireError, decode, encode
from mesh.schema import (
    BreakGlassEnded,
    BreakGlassSet,
    LogEntry,
    NodePartitionChanged,
    NodePartitionSet,
    PartitionsConfigSet,
)
from tests.unit.test_reconcile import Log
from workloads.quantity import SpecError
from workloads.resources import Resources
from workloads.spec import parse_job_spec

CONFIG = """
partitions:
  stateless: {min_nodes: 1}
  batch: {oversubscribe: 1.5}
  batch/critical: {protected: true}
"""


def test_a_node_never_recorded_is_in_the_default_partition_or_its_label_s():
    m = Log().state.partitions
    assert m.partition_of("n1") == "batch" == m.desired_of("n1")
    assert m.partition_of("n1", {"partition": "stateless"}) == "stateless"
    # a label naming no configured partition is not obeyed
    assert m.partition_of("n1", {"partition": "gpu"}) == "batch"
    assert not m.draining("n1")


def test_a_move_cordons_then_converges_and_remembers_home():
    log = Log()
    log.append(NodePartitionSet("n1", "stateless", "hot", False, 10.0, "batch"))
    m = log.state.partitions
    assert (m.partition_of("n1"), m.desired_of("n1"), m.draining("n1")) == (
        "batch",
        "stateless",
        True,
    )
    log.append(NodePartitionChanged("n1", "stateless", 20.0))
    rec = m.nodes["n1"]
    assert (rec.partition, rec.desired, rec.home, rec.last_moved) == (
        "stateless",
        "stateless",
        "batch",
        20.0,
    )
    assert not m.draining("n1")
    # back home: no longer lent
    log.append(NodePartitionSet("n1", "batch", "cold", False, 30.0, "stateless"))
    log.append(NodePartitionChanged("n1", "batch", 40.0))
    assert (rec.partition, rec.home) == ("batch", "")
    assert [(mv.source, mv.target, mv.converged) for mv in m.moves_since(0)] == [
        ("batch", "stateless", False),
        ("batch", "stateless", True),
        ("stateless", "batch", False),
        ("stateless", "batch", True),
    ]


def test_a_labelled_node_s_first_move_starts_from_the_source_the_leader_saw():
    log = Log()
    log.append(NodePartitionSet("n1", "batch", "cold", False, 1.0, "stateless"))
    assert log.state.partitions.nodes["n1"].partition == "stateless"


def test_events_that_do_not_fit_are_ignored():
    log = Log()
    before = log.state.ignored
    log.append(NodePartitionChanged("n1", "stateless", 1.0))  # no move in flight
    log.append(NodePartitionSet("n1", "gpu", "?", False, 1.0, "batch"))  # no such partition
    log.append(NodePartitionSet("n2", "stateless", "", False, 1.0, "batch"))
    log.append(NodePartitionChanged("n2", "batch", 2.0))  # not where it is going
    log.append(PartitionsConfigSet("partitions: [1]", 3.0))  # invalid: kept the old
    log.append(BreakGlassEnded("none in force", 4.0))
    assert log.state.ignored - before == 5
    assert log.state.partitions.draining("n2")


def test_a_new_move_while_one_is_in_flight_redirects_it_and_back_calls_it_off():
    log = Log()
    log.append(NodePartitionSet("n1", "stateless", "", False, 1.0, "batch"))
    log.append(NodePartitionSet("n1", "batch", "called off", False, 2.0, "batch"))
    assert not log.state.partitions.draining("n1")


def test_the_config_sets_partitions_and_oversubscription_cpu_only():
    log = Log()
    log.append(PartitionsConfigSet(CONFIG, 1.0))
    m = log.state.partitions
    assert m.names() == {"stateless", "batch", "batch/critical"}
    assert m.spec("batch").oversubscribe == 1.5
    p = placing(m, "n1", {})
    assert (p.partition, p.draining, p.oversubscribe, p.busy_limit) == ("batch", False, 1.5, 0.7)
    assert placing(m, "n1", {"partition": "stateless"}).busy_limit == 0.0
    cap = Resources(cpu=4000, memory=8 << 30)
    assert allocatable(cap, m.spec("batch")) == Resources(cpu=6000, memory=8 << 30)
    assert allocatable(cap, m.spec("stateless")) == cap


def test_break_glass_keeps_origins_and_restore_sends_them_back():
    log = Log()
    log.append(
        BreakGlassSet("stateless", ("n1", "n2"), "outage", "alice", 500.0, 10.0),
        NodePartitionSet("n1", "stateless", "break-glass: outage", True, 10.0, "batch"),
        NodePartitionSet("n2", "stateless", "break-glass: outage", True, 10.0, "batch"),
    )
    log.append(NodePartitionChanged("n1", "stateless", 11.0))
    m = log.state.partitions
    assert m.glass.by == "alice" and m.glass.origins == {"n1": "batch", "n2": "batch"}
    events = restore_events(log.state, "done", 20.0)
    assert isinstance(events[0], BreakGlassEnded)
    back = {e.node_id: (e.source, e.desired) for e in events[1:]}
    assert back == {"n1": ("stateless", "batch"), "n2": ("batch", "batch")}
    log.append(*events)
    assert m.glass is None
    assert m.draining("n1") and not m.draining("n2")  # n2 was called back mid-drain


def test_partition_events_are_validated_on_decode():
    entry = LogEntry(1, "c1", (NodePartitionSet("n" * 65, "batch"),))
    with pytest.raises(WireError):
        decode(LogEntry, encode(entry))
    ok = LogEntry(1, "c1", (BreakGlassSet("stateless", ("a",), "r", "bob", 0.0, 1.0),))
    assert decode(LogEntry, encode(ok)) == ok


def test_which_partition_a_job_runs_in():
    def spec(**kw):
        return parse_job_spec({"name": "j", "tasks": [{"role": "a", "command": "true"}], **kw})

    assert spec().placement_partition == "batch"
    assert spec(kind="service", restart={"max_retries": 0}).placement_partition == "stateless"
    assert spec(partition="batch/critical").placement_partition == "batch/critical"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("partitions: {batch: {oversubscribe: 0.5}}", "partitions.batch.oversubscribe"),
        ("partitions: {batch: {}, x/y: {}}\ndefault_partition: batch", "partitions.x/y"),
        ("partitions: {batch: {protected: true}}", "partitions.batch.protected"),
        ("default_partition: gpu", "default_partition"),
        ("busy_lines: 1", "busy_lines"),
        ("interval_s: fast", "interval_s"),
        ("partitions: {batch: {min_nodes: -1}}", "partitions.batch.min_nodes"),
    ],
)
def test_the_config_parser_names_the_field(text, field):
    with pytest.raises(SpecError) as exc:
        parse_partitions_config(text)
    assert exc.value.field == field


def test_the_config_parser_defaults():
    cfg = parse_partitions_config(CONFIG)
    assert cfg.partitions[2] == PartitionSpec("batch/critical", protected=True)
    assert cfg.default_partition == "batch" and cfg.interval_s == 10.0
