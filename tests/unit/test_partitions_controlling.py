"""The leader's hotness keeping around the pure controller (coordinator/partitions/
controlling.py): a node's window measures one partition's work, and what the views read
(`measure`) is what a decision sees."""

from __future__ import annotations

from coordinator.partitions.config import PartitionsConfig
from coordinator.partitions.controller import NodeFacts
from coordinator.partitions.controlling import Controlling
from coordinator.partitions.views import hotness_dict
from mesh.schema import NodeState, Resources

CFG = PartitionsConfig(window_s=60.0, stale_after_s=30.0, busy_line=0.7)


def beat(node_id: str, cpu_percent: float, ts: float) -> NodeState:
    cores = 4
    return NodeState(
        node_id=node_id,
        region="r",
        seq=int(ts),
        ts=ts,
        capacity=Resources(cpu=cores * 1000, memory=8 << 30),
        cpu_percent=cpu_percent,
        load1=cores * cpu_percent / 100.0,
    )


def facts(node_id: str, partition: str) -> NodeFacts:
    return NodeFacts(node_id, "zone-a", partition, partition, False, 0.0, "", 0, 0, False, 0)


def test_a_node_that_changes_partition_starts_a_new_window():
    c = Controlling()
    for t in range(10):  # busy with batch work
        c.observe(beat("n1", 100.0, float(t)), float(t), CFG.window_s, "batch")
    _, hot = c.measure(CFG, [facts("n1", "batch")], 10.0)
    assert hot["batch"].hot == 1
    # lent to stateless, its batch tasks drained: it is judged on what it does there
    c.observe(beat("n1", 5.0, 11.0), 11.0, CFG.window_s, "stateless")
    per_node, hot = c.measure(CFG, [facts("n1", "stateless")], 11.0)
    assert per_node["n1"].p90 == 0.05 and hot["stateless"].hot == 0
    assert hot["stateless"].state == "cold"


def test_the_same_partition_keeps_the_window():
    c = Controlling()
    for t in range(10):
        c.observe(beat("n1", 100.0 if t < 5 else 5.0, float(t)), float(t), CFG.window_s, "batch")
    per_node, _ = c.measure(CFG, [facts("n1", "batch")], 10.0)
    assert per_node["n1"].p90 == 1.0  # the busy half is still in the window


def test_measure_is_what_the_views_show():
    c = Controlling()
    for t in range(10):
        c.observe(beat("s1", 90.0, float(t)), float(t), CFG.window_s, "stateless")
        c.observe(beat("b1", 10.0, float(t)), float(t), CFG.window_s, "batch")
    _, hot = c.measure(CFG, [facts("s1", "stateless"), facts("b1", "batch")], 10.0)
    shown = hotness_dict(hot["stateless"])
    assert shown is not None
    assert shown["state"] == "hot" and shown["hot_fraction"] == 1.0 and shown["p90"] == 0.9
    assert hotness_dict(hot["batch"])["state"] == "cold"
    assert hotness_dict(None) is None
    assert c.hotness == {}  # measuring decides nothing


def test_a_flip_seen_by_a_decision_before_any_heartbeat_empties_the_window():
    c = Controlling()
    for t in range(10):
        c.observe(beat("n1", 100.0, float(t)), float(t), CFG.window_s, "batch")
    per_node, hot = c.measure(CFG, [facts("n1", "stateless")], 10.0)  # flipped: no beat yet
    assert per_node["n1"].state == "unknown" and hot["stateless"].hot == 0
    c.observe(beat("n1", 5.0, 10.5), 10.5, CFG.window_s, "stateless")
    per_node, _ = c.measure(CFG, [facts("n1", "stateless")], 11.0)
    assert per_node["n1"].p90 == 0.05


def test_windows_of_nodes_gone_from_the_region_are_dropped():
    c = Controlling()
    cfg = PartitionsConfig()
    for node_id in ("a", "b"):
        c.observe(beat(node_id, 50.0, 100.0), 100.0, cfg.window_s, "batch")
    c.measure(cfg, [facts("a", "batch")], 101.0)
    assert "a" in c.windows and "b" not in c.windows
