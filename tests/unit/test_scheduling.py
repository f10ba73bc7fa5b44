"""coordinator.scheduling: the queue window, the starvation guard's schedule, and how a
job becomes a gang request."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.scheduling import PlacementConfig, holds_line, window


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 500), st.integers(1, 40))
def test_the_window_keeps_the_head_and_reaches_every_job(n, size):
    jobs = list(range(n))
    seen: set[int] = set()
    cursor = 0
    rounds = math.ceil(n / size) + 1
    for _ in range(rounds):
        picked, cursor = window(jobs, cursor, size)
        assert len(picked) == len(set(picked)) <= max(2 * size, n)
        assert picked[: min(size, n)] == jobs[: min(size, n)]  # the head, always
        seen.update(picked)
    assert seen == set(jobs)


def test_a_short_queue_is_looked_at_whole():
    assert window([1, 2, 3], 7, 2) == ([1, 2, 3], 0)


def test_a_starving_gang_holds_the_line_in_windows():
    c = PlacementConfig(starve_after_s=30, hold_s=60, release_s=15)
    assert not holds_line(29.9, c)
    assert holds_line(30, c) and holds_line(89.9, c)
    assert not holds_line(90, c) and not holds_line(104.9, c)
    assert holds_line(105, c)


LABELS = [("rack", "x"), ("rack", "y"), ("zone", "zone-a"), ("zone", "zone-b")]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_the_kept_snapshot_is_the_one_a_full_build_gives(seed):
    """Rounds reuse the last snapshot and rebuild only the rows whose heartbeat or grants
    changed: after random heartbeats, placements and ends, every array must equal a full
    build."""
    import dataclasses
    import random

    import numpy as np

    from agent.hollow import HollowNode, inventory_mix
    from coordinator.cluster import ClusterView
    from coordinator.placement.snapshot import Snapshot
    from coordinator.scheduling import node_info, snapshot
    from coordinator.state import RegionState
    from mesh.schema import JobSubmitted, LogEntry, TaskPlaced, TaskUpdated
    from workloads.lifecycle import TaskState

    rnd = random.Random(seed)
    cluster = ClusterView("r", suspect_after=3.0, down_after=10.0)
    for i, inv in enumerate(inventory_mix(12, seed % 7)):
        cluster.observe(HollowNode(f"n{i:02d}", inv).state("r"), 0.0)
    clock = 0.0
    state = RegionState()
    spec = {
        "name": "j",
        "tasks": [
            {
                "role": "w",
                "count": 60,
                "resources": {"cpu": 1, "memory": "1Gi"},
                "simulate": {"duration": 1.0},
            }
        ],
    }
    gpu_spec = {
        "name": "g",
        "tasks": [
            {
                "role": "w",
                "count": 60,
                "resources": {"gpu": 0.25, "gpu_memory": "1Gi"},
                "simulate": {"duration": 1.0},
            }
        ],
    }
    state.apply(1, LogEntry(1, "c", (JobSubmitted("j", "c1", spec, 0.0),)))
    state.apply(2, LogEntry(1, "c", (JobSubmitted("g", "c2", gpu_spec, 0.0),)))
    shares = {**gpu_spec, "name": "h"}  # a share of a GPU and none of its memory
    shares["tasks"] = [{**gpu_spec["tasks"][0], "resources": {"gpu": 0.25}}]
    state.apply(3, LogEntry(1, "c", (JobSubmitted("h", "c3", shares, 0.0),)))
    seq, placed, journaled = 3, 0, 0
    for _ in range(10):
        before = snapshot(cluster, state)  # the kept one, updated below
        for label in LABELS:  # masks asked for, so the next snapshot carries them over
            before.label_mask(*label)
        for i in range(len(before)):  # and the rows' Python values the same way
            before.fixed_row(i)
        clock += rnd.choice([0.5, 1.0, 4.0])
        if rnd.random() < 0.8:  # all heard (else the silent go suspect: a full build)
            for node in sorted(cluster.nodes):
                st = cluster.nodes[node].state
                if rnd.random() < 0.3:  # GPU memory used by others goes up or down
                    st = dataclasses.replace(
                        st,
                        gpus=tuple(
                            dataclasses.replace(g, memory_used=rnd.randint(0, 8 << 30))
                            for g in st.gpus
                        ),
                    )
                cluster.observe(dataclasses.replace(st, seq=st.seq + 1), clock)
        for _ in range(rnd.randint(0, 6)):  # new heartbeats: load and GPU use move
            st = cluster.nodes[rnd.choice(sorted(cluster.nodes))].state
            gpus = tuple(dataclasses.replace(g, utilization=rnd.randint(0, 100)) for g in st.gpus)
            used = tuple(
                dataclasses.replace(g, memory_used=rnd.randint(0, 8 << 30)) for g in st.gpus
            )
            levels = tuple(
                dataclasses.replace(g, enforcement=rnd.choice(["none", "watchdog", "mps"]))
                for g in st.gpus
            )
            moved = {  # one thing at a time, or only the clock
                "cpu_percent": rnd.uniform(0, 100),
                "gpus": rnd.choice([gpus, used, levels]),
                "labels": {**st.labels, "rack": rnd.choice("xy")},
                "capacity": dataclasses.replace(st.capacity, cpu=rnd.choice([4000, 8000])),
            }
            what = rnd.choice([*moved, "clock"])
            st = dataclasses.replace(
                st, seq=st.seq + 1, **{k: moved[k] for k in moved if k == what}
            )
            cluster.observe(st, clock)
        cluster.sweep(clock)  # the silent go suspect (out of the snapshot) and come back
        views = cluster.ready()
        for _ in range(rnd.randint(0, 4) if views else 0):  # placements: grants move
            v = views[rnd.randrange(len(views))]
            job, uuids = (
                (rnd.choice("gh"), (rnd.choice(v.state.gpus).uuid,)) if v.state.gpus else ("j", ())
            )
            seq += 1
            state.apply(
                seq,
                LogEntry(1, "c", (TaskPlaced(job, f"{job}.w.{placed}", 1, v.node_id, 1.0, uuids),)),
            )
            placed += 1
        for _ in range(rnd.randint(0, 2)):  # ends: grants given back
            holding = sorted(t for t, r in state.tasks.items() if r.state == TaskState.PLACED)
            if holding:
                t = state.tasks[rnd.choice(holding)]
                seq += 1
                ended = TaskUpdated(
                    t.job_id, t.task_id, t.attempt, TaskState.SUCCEEDED, t.node_id, 2.0
                )
                state.apply(seq, LogEntry(1, "c", (ended,)))
        kept = snapshot(cluster, state)
        assert state.ignored == 0  # every placement was folded
        fresh = Snapshot([node_info(v, state) for v in views])
        assert [v.node_id for v in views] == sorted(
            n for n, v in cluster.nodes.items() if v.status == "ready"
        )
        assert kept.ids == fresh.ids and kept.zones == fresh.zones and kept.g_uuid == fresh.g_uuid
        arrays = [k for k, v in vars(fresh).items() if isinstance(v, np.ndarray)]
        assert len(arrays) >= 14  # every array the snapshot has, not a copied list
        for name in arrays:
            assert np.array_equal(getattr(kept, name), getattr(fresh, name)), name
        for label in LABELS:
            assert np.array_equal(kept.label_mask(*label), fresh.label_mask(*label)), label
        for i in range(len(kept)):
            assert kept.fixed_row(i) == fresh.fixed_row(i), i
        # The journal of rows (parking reads it): every row that changed since the
        # earlier snapshot is named; or it says it does not know.
        rows = kept.row_changes.since(before.mark)
        journaled += rows is not None
        if rows is not None:
            assert kept.ids == before.ids
            for i in set(range(len(kept))) - rows:
                assert kept.nodes[i] == before.nodes[i]
                for name in (a for a in arrays if len(getattr(kept, a)) == len(kept)):
                    assert np.array_equal(getattr(kept, name)[i], getattr(before, name)[i])
    assert journaled  # rounds kept their journal, not only full builds


def test_a_snapshot_made_from_an_older_one_starts_a_new_line():
    """Only the newest snapshot of a line goes on with its journal: one made from an
    older one differs from the newest in rows the journal never named after its mark."""
    from coordinator.placement.snapshot import NodeInfo, Snapshot
    from workloads.resources import Resources

    def node(name, cpu):
        return NodeInfo(name, Resources(cpu=cpu, memory=1 << 30))

    s0 = Snapshot([node("a", 1000), node("b", 1000)])
    s1 = s0.with_rows({0: node("a", 2000)})
    assert s1.row_changes.since(s0.mark) == {0}
    s2 = s1.with_rows({1: node("b", 3000)})
    assert s2.row_changes.since(s0.mark) == {0, 1} and s2.row_changes.since(s1.mark) == {1}
    branch = s1.with_rows({0: node("a", 4000)})  # from s1, not the newest (s2)
    assert branch.row_changes.since(s2.mark) is None
    assert branch.row_changes.since(s1.mark) is None
    assert s0.with_rows({}) is s0
