"""What the API shows of partitions: plain dicts from the fold and the cluster view.
Pure (time passed in)."""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.cluster import DOWN, READY, ClusterView, NodeView
from coordinator.partitions.hotness import UNKNOWN, PartitionHotness
from coordinator.partitions.membership import Membership, allocatable
from coordinator.state import RegionState
from workloads.resources import Resources

HOUR_S = 3600.0


def node_partition(m: Membership, view: NodeView) -> dict:
    """A node's partition, desired partition and drain state (`mesh node get`)."""
    node_id, labels = view.state.node_id, view.state.labels
    rec = m.nodes.get(node_id)
    draining = m.draining(node_id)
    return {
        "partition": m.partition_of(node_id, labels),
        "desired_partition": m.desired_of(node_id, labels),
        "drain": "draining" if draining else "none",
        "move_reason": rec.reason if rec is not None and draining else "",
        "home": rec.home if rec is not None else "",
    }


def glass_dict(m: Membership) -> dict | None:
    g = m.glass
    if g is None:
        return None
    return {
        "to": g.to,
        "nodes": list(g.nodes),
        "reason": g.reason,
        "by": g.by,
        "since": g.started,
        "until": g.until_ts or None,
    }


def hotness_dict(ph: PartitionHotness | None) -> dict | None:
    """A partition's hotness as the controller reads it (its windows), or None when
    none is kept (an undivided region)."""
    if ph is None:
        return None
    return {
        "state": ph.state,
        "known": ph.known,
        "hot": ph.hot,
        "hot_fraction": round(ph.hot_fraction, 4),
        "forecast_fraction": round(ph.forecast_fraction, 4),
        "p50": round(ph.p50, 4),
        "p90": round(ph.p90, 4),
        "trend": round(ph.trend, 6),
    }


def partition_rows(
    state: RegionState,
    cluster: ClusterView,
    now: float,
    hotness: Mapping[str, PartitionHotness] | None = None,
) -> list[dict]:
    """Per configured partition: its settings, nodes, capacity, allocatable (its
    oversubscribed cpu), allocation, measured CPU busy now (mean over its ready nodes),
    its hotness over the window and trend (busy per second) when `hotness` has it,
    nodes draining out of it and coming in, and moves in or out in the last hour."""
    m = state.partitions
    rows = {}
    for spec in m.config.partitions:
        rows[spec.name] = {
            "name": spec.name,
            "min_nodes": spec.min_nodes,
            "oversubscribe": spec.oversubscribe,
            "protected": spec.protected,
            "nodes": 0,
            "ready": 0,
            "draining": 0,
            "incoming": 0,
            "_cap": Resources(),
            "_alloc": Resources(),
            "_allocated": Resources(),
            "_busy": [],
            "node_ids": [],
        }
    for node_id in sorted(cluster.nodes):
        view = cluster.nodes[node_id]
        if view.status == DOWN:
            continue
        labels = view.state.labels
        part, desired = m.partition_of(node_id, labels), m.desired_of(node_id, labels)
        row = rows.get(part)
        if row is None:
            continue
        row["nodes"] += 1
        row["node_ids"].append(node_id)
        row["_cap"] = row["_cap"] + view.state.capacity
        row["_alloc"] = row["_alloc"] + allocatable(view.state.capacity, m.spec(part))
        row["_allocated"] = row["_allocated"] + state.allocated(node_id)
        if view.status == READY:
            row["ready"] += 1
            row["_busy"].append(view.state.cpu_percent / 100.0)
        if desired != part:
            row["draining"] += 1
            if desired in rows:
                rows[desired]["incoming"] += 1
    recent = m.moves_since(now - HOUR_S)
    out = []
    for name, row in rows.items():
        busy = row.pop("_busy")
        row["capacity"] = row.pop("_cap").to_dict()
        row["allocatable"] = row.pop("_alloc").to_dict()
        row["allocation"] = row.pop("_allocated").to_dict()
        row["busy"] = round(sum(busy) / len(busy), 4) if busy else None
        ph = (hotness or {}).get(name)
        row["hotness"] = hotness_dict(ph)
        row["trend"] = None if ph is None or ph.state == UNKNOWN else round(ph.trend, 6)
        row["moves_last_hour"] = sum(
            1 for mv in recent if mv.converged and name in (mv.source, mv.target)
        )
        out.append(row)
    return out
