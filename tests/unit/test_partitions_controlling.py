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


def _hot_stateless(asked_in: range, hold: bool) -> list[tuple[int, list[str], str]]:
    """Stateless hot from 0 s to 50 s, beats each second, and the controller asked every
    10 s in `asked_in`; elsewhere (a break-glass in force) not asked, and held if
    `hold`. Its decisions: (time, nodes moved, why)."""
    cfg = PartitionsConfig(
        window_s=10.0, stale_after_s=30.0, busy_line=0.7, borrow_after_s=20.0, spike_fraction=1.0
    )  # no spike rule: it borrows at once, and this reads the dwell
    nodes = [facts("s1", "stateless"), facts("s2", "stateless"), facts("b1", "batch")]
    c = Controlling()
    decisions = []
    for t in range(51):
        for n, busy, partition in (
            ("s1", 100.0, "stateless"),
            ("s2", 100.0, "stateless"),
            ("b1", 5.0, "batch"),
        ):
            c.observe(beat(n, busy, float(t)), float(t), cfg.window_s, partition)
        if t not in asked_in:
            if hold:
                c.hold()
        elif t % 10 == 0:
            moves, why = c(cfg, nodes, float(t))
            decisions.append((t, [m.node_id for m in moves], why))
    return decisions


def test_a_hold_starts_the_dwell_again():
    """While a break-glass is in force the controller is not asked; asked again, it must
    see stateless hot for a whole `borrow_after_s` from then, not from before."""
    glass = [t for t in range(51) if not 1 <= t <= 29]  # a break-glass from 1 s to 29 s
    asked = range(0, 51)
    assert [(t, moved) for t, moved, _ in _hot_stateless(asked, hold=True)][:3] == [
        (0, []),
        (10, []),
        (20, ["b1"]),  # never held: hot for 20 s, it borrows
    ]
    held = _hot_stateless(glass, hold=True)
    assert [(t, moved) for t, moved, _ in held] == [(0, []), (30, []), (40, []), (50, ["b1"])]
    assert "hot: " in held[1][2] and "for 0 s of 20 s" in held[1][2], held[1][2]
    # unheld, the first decision after the break-glass took the dwell from before it
    assert _hot_stateless(glass, hold=False)[1][:2] == (30, ["b1"])
