"""The placement core (coordinator/placement/): properties over random clusters, a
brute-force reference for the incremental shape cache, and worked cases."""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator import scheduling
from coordinator.placement import (
    ISOLATION_LEVEL,
    PROFILES,
    GangRequest,
    GpuSlot,
    NodeInfo,
    Placement,
    PlacementResult,
    Placer,
    Profile,
    Shape,
    Snapshot,
    TaskRequest,
    commit,
    core,
    describe,
    place,
    plugins,
)
from coordinator.placement.snapshot import Working
from workloads.resources import Resources

PROPS = settings(
    max_examples=120,
    database=None,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
GiB = 2**30
BINPACK_ONLY = Profile("t", {"binpack": 1.0})
HOLDS_LINE = "holds the line"


def gpu(
    uuid: str,
    memory: int = 80 * GiB,
    *,
    alloc: int = 0,
    mem_alloc: int = 0,
    util: int = 0,
    used: int = 0,
    enforcement: str = "none",
) -> GpuSlot:
    return GpuSlot(uuid, "H100", memory, alloc, mem_alloc, util, used, enforcement)


def node(
    node_id: str,
    cpu: int = 0,
    memory: int = 0,
    *,
    alloc: Resources | None = None,
    simulated: bool = False,
    zone: str = "",
    labels: dict[str, str] | None = None,
    gpus: tuple[GpuSlot, ...] = (),
    load: float = 0.0,
    disk: int = 0,
) -> NodeInfo:
    """A node; its GPU capacity and allocation are the sums over `gpus` unless `alloc`."""
    cap = Resources(cpu, memory, disk, 1000 * len(gpus), sum(g.memory_total for g in gpus))
    if alloc is None:
        alloc = Resources(
            gpu=sum(g.allocated for g in gpus), gpu_memory=sum(g.memory_allocated for g in gpus)
        )
    return NodeInfo(node_id, cap, alloc, simulated, zone, labels or {}, gpus, load)


def shape(
    cpu: int = 0,
    memory: int = 0,
    *,
    disk: int = 0,
    gpu: int = 0,
    gpu_memory: int = 0,
    simulated: bool = False,
    labels: tuple[tuple[str, str], ...] = (),
    isolation: str = "none",
) -> Shape:
    return Shape((cpu, memory, disk, gpu, gpu_memory), simulated, labels, isolation)


def task(task_id: str, cpu: int = 0, memory: int = 0, **kw) -> TaskRequest:
    return TaskRequest(task_id, shape(cpu, memory, **kw))


def gang(job_id: str, *tasks: TaskRequest, **kw) -> GangRequest:
    return GangRequest(job_id, tuple(tasks), **kw)


def tasks(job_id: str, n: int, cpu: int = 0, memory: int = 0, **kw) -> tuple[TaskRequest, ...]:
    s = shape(cpu, memory, **kw)
    return tuple(TaskRequest(f"{job_id}.{k}", s) for k in range(n))


def where(result: PlacementResult) -> dict[str, str]:
    return {p.task_id: p.node_id for p in result.placed}


# --------------------------------------------------------------------------- strategies


class Tape:
    """Reads a cluster off a list of small integers drawn by hypothesis: one draw instead of
    hundreds, and it still shrinks (fewer nodes, smaller amounts)."""

    def __init__(self, numbers: list[int]) -> None:
        self.numbers = numbers
        self.i = 0
        self.mix = 0

    def int(self, hi: int) -> int:
        n = self.numbers[self.i] if self.i < len(self.numbers) else 0
        self.i += 1
        return n % (hi + 1)


ZONES = ("a", "b", "c")
LEVELS = tuple(ISOLATION_LEVEL)  # none, watchdog, mps, mig
GPU_ASKS = (0, 0, 0, 0, 250, 500, 750, 1000, 1000, 2000)
GPU_ALLOCS = (0, 0, 0, 250, 500, 750, 1000)


def tape_sim(tape: Tape) -> bool:
    """Clusters are real (half of them), mixed or simulated: mixing node by node and task by
    task independently would put few simulated tasks anywhere."""
    return tape.mix == 3 or (tape.mix == 2 and tape.int(1) == 0)


def tape_nodes(tape: Tape) -> list[NodeInfo]:
    tape.mix = tape.int(3)
    nodes = []
    for i in range(1 + tape.int(9)):
        gpus = []
        for j in range(tape.int(3)):
            total = 1 + tape.int(8)
            alloc = GPU_ALLOCS[tape.int(6)]
            mem_alloc = tape.int(total) if alloc else 0
            used = tape.int(total) if tape.int(3) == 0 else 0
            level = LEVELS[tape.int(3)]
            gpus.append(
                GpuSlot(
                    f"n{i}g{j}", "H100", total, alloc, mem_alloc, 10 * tape.int(10), used, level
                )
            )
        cap = [tape.int(12) + 4 * (tape.int(5) > 0) for _ in range(3)]
        cap += [1000 * len(gpus), sum(g.memory_total for g in gpus)]
        if not gpus and tape.int(7) == 0:
            cap[3], cap[4] = 1000, 4  # says it has a GPU but no slot backs it: never usable
        used = [tape.int(c) if tape.int(2) == 0 else 0 for c in cap[:3]]
        used += [sum(g.allocated for g in gpus), sum(g.memory_allocated for g in gpus)]
        if tape.int(15) == 0:
            k = tape.int(4)
            used[k] = cap[k] + 1 + tape.int(2)  # overdrawn (allocated above capacity): free < 0
        labels = {"tier": "xy"[tape.int(1)]} if tape.int(1) else {}
        nodes.append(
            NodeInfo(
                f"n{i}",
                Resources(*cap),
                Resources(*used),
                tape_sim(tape),
                ZONES[tape.int(2)],
                labels,
                tuple(gpus),
                tape.int(10) / 10,
            )
        )
    return nodes


def tape_shape(tape: Tape) -> Shape:
    g = GPU_ASKS[tape.int(9)]
    res = tuple(tape.int(6) if tape.int(1) else 0 for _ in range(3))
    res += (g, tape.int(4) if g else 0)
    pick = tape.int(4)
    labels = (("zone", ZONES[tape.int(2)]),) if pick == 0 else (("tier", "x"),) if pick == 1 else ()
    isolation = LEVELS[tape.int(3)] if g and tape.int(1) else "none"
    return Shape(res, tape_sim(tape), labels, isolation)


def build_cluster(numbers: list[int]) -> tuple[list[NodeInfo], list[GangRequest], int]:
    tape = Tape(numbers)
    nodes = tape_nodes(tape)
    gangs = []
    for j in range(1 + tape.int(4)):
        shapes = [tape_shape(tape) for _ in range(1 + (tape.int(3) == 0))]
        ts = tuple(
            TaskRequest(f"j{j}.t{k}", shapes[k % len(shapes)]) for k in range(1 + tape.int(3))
        )
        held = ()
        if tape.int(2) == 0:
            held = tuple(nodes[tape.int(len(nodes) - 1)].node_id for _ in range(1 + tape.int(1)))
        gangs.append(
            GangRequest(
                f"j{j}",
                ts,
                gang=(-1, -1, 0, 1, 2)[tape.int(4)],
                strategy=("binpack", "spread", "pack")[tape.int(2)],
                spread_by=("zone", "node")[tape.int(1)],
                anti_affinity=tape.int(3) == 0,
                held=held,
                holds_line=tape.int(5) == 0,
            )
        )
    return nodes, gangs, tape.int(7)


def uniform_cluster(seed: int):
    rnd = random.Random(seed)
    return build_cluster([rnd.randrange(256) for _ in range(300)])


# Short, shrinkable tapes (hypothesis favours small numbers), and uniform ones from a seed,
# which make busier clusters where gangs compete for the same nodes and GPUs.
clusters = st.one_of(
    st.lists(st.integers(0, 255), max_size=300).map(build_cluster),
    st.integers(0, 2**32 - 1).map(uniform_cluster),
)


def shapes_by_task(gangs) -> dict[str, Shape]:
    return {t.task_id: t.shape for g in gangs for t in g.tasks}


def job_of(gangs) -> dict[str, str]:
    return {t.task_id: g.job_id for g in gangs for t in g.tasks}


# --------------------------------------------------------------------------- checks


def check_never_over_commits(nodes, gangs, result):
    """Node level: what was placed on a node fits in what was free there, kind by kind.
    GPU level: grants on one GPU sum to at most a whole one and fit its free memory; a
    whole GPU goes only to a GPU nobody holds a share of, and to one task only."""
    shapes = shapes_by_task(gangs)
    by_id = {n.node_id: n for n in nodes}
    used: dict[str, list[int]] = defaultdict(lambda: [0] * 5)
    milli: Counter = Counter()
    mem: Counter = Counter()
    grants: Counter = Counter()
    whole: Counter = Counter()
    for p in result.placed:
        s = shapes[p.task_id]
        n = by_id[p.node_id]
        for k in range(5):
            used[p.node_id][k] += s.resources[k]
        if s.gpu == 0:
            assert p.gpu_uuids == (), p
        elif 0 < s.gpu < 1000:
            assert len(p.gpu_uuids) == 1, p
        else:
            assert s.gpu % 1000 == 0
            assert len(p.gpu_uuids) == s.gpu // 1000 == len(set(p.gpu_uuids)), p
        slots = {g.uuid for g in n.gpus}
        for u in p.gpu_uuids:
            assert u in slots, p
            key = (p.node_id, u)
            fractional = s.gpu < 1000
            milli[key] += s.gpu if fractional else 1000
            mem[key] += s.resources[4] if fractional else s.resources[4] // len(p.gpu_uuids)
            grants[key] += 1
            whole[key] += not fractional
    for node_id, amounts in used.items():
        n = by_id[node_id]
        free = n.capacity - n.allocated
        for kind, amount in zip(Resources.KINDS, amounts, strict=True):
            assert amount <= getattr(free, kind), (node_id, kind, amount, free)
    for (node_id, u), m in milli.items():
        g = next(g for g in by_id[node_id].gpus if g.uuid == u)
        assert g.allocated + m <= 1000, (node_id, u)
        assert mem[node_id, u] <= g.memory_total - max(g.memory_allocated, g.memory_used), u
        if whole[node_id, u]:
            assert g.allocated == 0 and grants[node_id, u] == 1, (node_id, u)


def check_gangs_all_or_nothing(nodes, gangs, result):
    placed = where(result)
    assert len(placed) == len(result.placed), "a task placed twice"
    assert {p.job_id for p in result.placed} <= {g.job_id for g in gangs}
    assert all(job_of(gangs)[p.task_id] == p.job_id for p in result.placed)
    blocked = False
    for g in gangs:
        got = [t.task_id in placed for t in g.tasks]
        if blocked:
            assert not any(got), g.job_id
            assert HOLDS_LINE in result.unplaced[g.job_id]
            continue
        n = sum(got)
        assert got == [True] * n + [False] * (len(got) - n), (g.job_id, got)  # in order
        assert n >= g.gang_size or n == 0, (g.job_id, got)  # the gang part whole or nothing
        assert (g.job_id in result.unplaced) == (n < len(g.tasks)), g.job_id
        if g.job_id in result.unplaced and g.holds_line and n < g.gang_size:
            blocked = True  # only a gang whose all-or-nothing part failed holds the line
    assert set(result.unplaced) <= {g.job_id for g in gangs}


def reason_counts(why: str) -> list[tuple[int, str]]:
    _, sep, parts = why.partition(" fits no node: ")
    assert sep, why
    out = []
    for part in parts.split("; "):
        m = re.fullmatch(r"(\d{1,3}(?:,\d{3})*) nodes?: (.+)", part)
        assert m, (part, why)
        out.append((int(m.group(1).replace(",", "")), m.group(2)))
    return out


def check_unplaced_explained(nodes, gangs, result):
    """Each reason names the first task that did not fit, and every node turned it away
    for exactly one reason: the counts sum to the number of nodes."""
    placed = where(result)
    for g in gangs:
        why = result.unplaced.get(g.job_id)
        if why is None or HOLDS_LINE in why:
            continue
        m = re.match(r"(?:gang of (\d+): (\d+) placed, then )?task (\S+) \(", why)
        assert m, why
        if m.group(1):  # the gang part rolled back: it names the task it got stuck on
            k = int(m.group(2))
            assert int(m.group(1)) == g.gang_size > k, why
            assert not any(t.task_id in placed for t in g.tasks), why
            assert m.group(3) == g.tasks[k].task_id, why
        else:
            assert m.group(3) == next(t for t in g.tasks if t.task_id not in placed).task_id
        counts = reason_counts(why)
        assert sum(n for n, _ in counts) == len(nodes), why
        assert [n for n, _ in counts] == sorted((n for n, _ in counts), reverse=True), why


def check_constraints(nodes, gangs, result):
    by_id = {n.node_id: n for n in nodes}
    shapes = shapes_by_task(gangs)
    for p in result.placed:
        s, n = shapes[p.task_id], by_id[p.node_id]
        assert s.simulated == n.simulated, (p, n)
        for key, value in s.labels:
            assert (n.zone if key == "zone" else n.labels.get(key)) == value, (p, key)
        levels = {g.uuid: ISOLATION_LEVEL[g.enforcement] for g in n.gpus}
        for u in p.gpu_uuids:
            assert levels[u] >= ISOLATION_LEVEL[s.isolation], (p, u)
    for g in gangs:
        if g.anti_affinity:
            mine = [p.node_id for p in result.placed if p.job_id == g.job_id]
            assert len(mine) == len(set(mine)), (g.job_id, mine)
            assert not set(mine) & set(g.held), (g.job_id, mine, g.held)


# --------------------------------------------------------------------------- properties


@PROPS
@given(clusters)
def test_never_over_commits_any_node_or_gpu(cluster):
    nodes, gangs, seed = cluster
    check_never_over_commits(nodes, gangs, place(Snapshot(nodes), gangs, seed=seed))


@PROPS
@given(clusters)
def test_gang_is_all_or_nothing_and_explained(cluster):
    nodes, gangs, seed = cluster
    result = place(Snapshot(nodes), gangs, seed=seed)
    check_gangs_all_or_nothing(nodes, gangs, result)
    check_unplaced_explained(nodes, gangs, result)


@PROPS
@given(clusters)
def test_constraints_always_hold(cluster):
    nodes, gangs, seed = cluster
    for profile in (PROFILES["default"], PROFILES["balanced"]):
        check_constraints(nodes, gangs, place(Snapshot(nodes), gangs, profile, seed))


@PROPS
@given(clusters)
def test_deterministic(cluster):
    nodes, gangs, seed = cluster
    snap = Snapshot(nodes)
    first = place(snap, gangs, seed=seed)
    assert isinstance(first, PlacementResult)
    assert place(snap, gangs, seed=seed) == first  # the snapshot was not changed
    assert place(Snapshot(list(nodes)), list(gangs), seed=seed) == first


def reference_binpack(nodes, gangs, seed):
    """Greedy binpack from scratch: every task scans every node; ties by the core's jitter.
    For CPU-only shapes, all-or-nothing gangs, binpack strategy."""
    jitter = np.random.default_rng(seed).random(len(nodes)) * core.TIE_BREAK
    cap = [[getattr(n.capacity, k) for k in Resources.KINDS] for n in nodes]
    free = [[getattr(n.capacity - n.allocated, k) for k in Resources.KINDS] for n in nodes]
    placed, unplaced = [], set()
    for g in gangs:
        saved = [list(f) for f in free]
        picks = []
        for t in g.tasks:
            req, s = t.shape.resources, t.shape
            best, best_score = None, -np.inf
            for i, n in enumerate(nodes):
                if n.simulated != s.simulated or any(free[i][k] < req[k] for k in range(5)):
                    continue
                if any((n.zone if k == "zone" else n.labels.get(k)) != v for k, v in s.labels):
                    continue
                kinds = [k for k in range(5) if cap[i][k] > 0]
                left = sum((free[i][k] - req[k]) * (1.0 / cap[i][k]) for k in kinds)
                score = 1.0 - left * (1.0 / max(len(kinds), 1)) + jitter[i]
                if score > best_score:
                    best, best_score = i, score
            if best is None:
                free, picks = saved, []
                unplaced.add(g.job_id)
                break
            free[best] = [f - r for f, r in zip(free[best], req, strict=True)]
            picks.append((g.job_id, t.task_id, nodes[best].node_id))
        placed += picks
    return placed, unplaced


def build_cpu_cluster(numbers: list[int]):
    """Up to 12 nodes and 8 gangs drawing on 3 shapes: enough changed nodes per refresh to
    take each path of the change log (one node, some nodes, all nodes)."""
    tape = Tape(numbers)
    nodes = []
    for i in range(1 + tape.int(11)):
        cap = [8 + tape.int(8), tape.int(16), tape.int(3), tape.int(2) * 1000, 0]
        alloc = [tape.int(c) if tape.int(1) else 0 for c in cap]
        nodes.append(
            NodeInfo(
                f"n{i}",
                Resources(*cap),
                Resources(*alloc),
                tape.int(5) == 0,
                ZONES[tape.int(2)],
                {"tier": "x"} if tape.int(1) else {},
            )
        )
    pool = []
    for _ in range(3):
        res = (1 + tape.int(5), tape.int(6), tape.int(1), 0, 0)
        pick = tape.int(5)
        labels = (("zone", ZONES[tape.int(2)]),) if pick == 0 else (("tier", "x"),) * (pick == 1)
        pool.append(Shape(res, tape.int(6) == 0, labels))
    gangs = []
    for j in range(1 + tape.int(7)):
        ts = tuple(TaskRequest(f"j{j}.t{k}", pool[tape.int(2)]) for k in range(1 + tape.int(3)))
        gangs.append(GangRequest(f"j{j}", ts))
    return nodes, gangs, tape.int(3)


def uniform_cpu_cluster(seed: int):
    rnd = random.Random(seed)
    return build_cpu_cluster([rnd.randrange(256) for _ in range(200)])


cpu_clusters = st.one_of(
    st.lists(st.integers(0, 255), max_size=200).map(build_cpu_cluster),
    st.integers(0, 2**32 - 1).map(uniform_cpu_cluster),
)


@PROPS
@given(cpu_clusters)
def test_binpack_matches_a_brute_force_reference(cluster):
    nodes, gangs, seed = cluster
    result = place(Snapshot(nodes), gangs, BINPACK_ONLY, seed)
    placed, unplaced = reference_binpack(nodes, gangs, seed)
    assert [(p.job_id, p.task_id, p.node_id) for p in result.placed] == placed
    assert set(result.unplaced) == unplaced


class UncachedPlacer(Placer):
    """Recomputes every shape's arrays from scratch for every task: no change log."""

    def _arrays(self, shape):
        self.shapes.clear()
        return super()._arrays(shape)


@PROPS
@given(st.one_of(clusters, cpu_clusters))
def test_incremental_refresh_matches_a_fresh_computation(cluster):
    nodes, gangs, seed = cluster
    snap = Snapshot(nodes)
    for profile in (PROFILES["default"], PROFILES["balanced"]):
        got = place(snap, gangs, profile, seed)
        assert UncachedPlacer(snap, profile, seed).place(gangs) == got
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(core, "FULL_REFRESH", -1)  # every multi-node refresh rescores all
            assert place(snap, gangs, profile, seed) == got


def live_view(nodes: list[NodeInfo], numbers: list[int]) -> dict[str, NodeInfo]:
    """The nodes as they are by commit time: some shrank, took on other work, or left."""
    tape = Tape(numbers)
    live = {}
    for n in nodes:
        cap, alloc, gpus = n.capacity, n.allocated, n.gpus
        change = tape.int(5)
        if change == 1:  # smaller
            k = Resources.KINDS[tape.int(4)]
            cap = Resources(**{**_as_dict(cap), k: getattr(cap, k) - 1 - tape.int(4)})
        elif change == 2:  # another plan landed on it
            k = Resources.KINDS[tape.int(4)]
            alloc = Resources(**{**_as_dict(alloc), k: getattr(alloc, k) + 1 + tape.int(4)})
        elif change == 3 and gpus:  # a GPU got a share or its memory filled up
            j = tape.int(len(gpus) - 1)
            g = gpus[j]
            g = GpuSlot(
                g.uuid,
                g.model,
                g.memory_total,
                g.allocated + 250 * tape.int(1),
                g.memory_allocated,
                g.utilization,
                g.memory_used + tape.int(g.memory_total),
                g.enforcement,
            )
            gpus = gpus[:j] + (g,) + gpus[j + 1 :]
        elif change == 4:  # gone
            continue
        live[n.node_id] = NodeInfo(
            n.node_id, cap, alloc, n.simulated, n.zone, n.labels, gpus, n.load
        )
    return live


def _as_dict(r: Resources) -> dict[str, int]:
    return {k: getattr(r, k) for k in Resources.KINDS}


@PROPS
@given(clusters, st.lists(st.integers(0, 255), max_size=30))
def test_commit_never_over_commits_the_live_view_nor_splits_a_job(cluster, changes):
    nodes, gangs, seed = cluster
    plan = place(Snapshot(nodes), gangs, seed=seed)
    assert commit(plan, gangs, {n.node_id: n for n in nodes}) == plan  # nothing moved
    live = live_view(nodes, changes)
    result = commit(plan, gangs, live)
    check_never_over_commits(list(live.values()), gangs, result)
    assert set(result.placed) <= set(plan.placed)
    for g in gangs:
        planned = [p for p in plan.placed if p.job_id == g.job_id]
        kept = [p for p in result.placed if p.job_id == g.job_id]
        assert kept in ([], planned), g.job_id
        if planned and not kept:
            assert "changed since the placement snapshot" in result.unplaced[g.job_id]
    kept_jobs = {p.job_id for p in result.placed}
    for job_id, why in plan.unplaced.items():
        if job_id in kept_jobs or not any(p.job_id == job_id for p in plan.placed):
            assert result.unplaced[job_id] == why


def test_the_strategy_makes_interesting_clusters():
    # guard against a generator that only ever makes trivial cases
    rnd = random.Random(0)
    seen: Counter = Counter()
    for _ in range(150):
        nodes, gangs, seed = build_cluster([rnd.randrange(256) for _ in range(300)])
        r = place(Snapshot(nodes), gangs, seed=seed)
        shapes = shapes_by_task(gangs)
        seen["placed"] += bool(r.placed)
        seen["unplaced"] += any(HOLDS_LINE not in why for why in r.unplaced.values())
        seen["held line"] += any(HOLDS_LINE in why for why in r.unplaced.values())
        seen["sim"] += any(shapes[p.task_id].simulated for p in r.placed)
        seen["fraction"] += any(0 < shapes[p.task_id].gpu < 1000 for p in r.placed)
        seen["whole"] += any(shapes[p.task_id].gpu >= 1000 for p in r.placed)
        seen["isolated"] += any(shapes[p.task_id].isolation != "none" for p in r.placed)
        seen["multi"] += any(len(g.tasks) > 1 and g.job_id not in r.unplaced for g in gangs)
        seen["partial"] += any(
            g.job_id in r.unplaced and any(p.job_id == g.job_id for p in r.placed) for g in gangs
        )
    assert all(seen[k] >= 10 for k in seen) and len(seen) == 9, seen


# --------------------------------------------------------------------------- worked cases


def test_binpack_picks_the_tightest_node():
    nodes = [node("big", cpu=8000), node("tight", cpu=2000), node("mid", cpu=4000)]
    result = place(Snapshot(nodes), [gang("j", task("j.0", cpu=2000))])
    assert where(result) == {"j.0": "tight"}
    assert result.unplaced == {}


def test_binpack_uses_what_is_free_not_the_capacity():
    nodes = [
        node("a", cpu=8000, memory=8 * GiB, alloc=Resources(cpu=7000, memory=7 * GiB)),
        node("b", cpu=2000, memory=2 * GiB),
    ]
    result = place(Snapshot(nodes), [gang("j", task("j.0", cpu=1000, memory=GiB))])
    assert where(result) == {"j.0": "a"}  # leaves 0 on a, half of b on b


def test_binpack_weighs_every_kind_by_its_capacity():
    # after the task: a leaves 0/4 cpu + 3/4 memory, b leaves 2/4 + 0/4: b is tighter
    a = node("a", cpu=4000, memory=4 * GiB, alloc=Resources(cpu=3000))
    b = node("b", cpu=4000, memory=4 * GiB, alloc=Resources(cpu=1000, memory=3 * GiB))
    w = Working(Snapshot([a, b]))
    scores = plugins.binpack(w, np.arange(2), shape(1000, GiB))
    assert scores.tolist() == pytest.approx([1 - 0.75 / 2, 1 - 0.5 / 2])
    result = place(Snapshot([a, b]), [gang("j", task("j.0", cpu=1000, memory=GiB))])
    assert where(result) == {"j.0": "b"}


def test_cpu_only_tasks_keep_off_gpu_nodes_when_a_cpu_node_fits():
    gpus = (gpu("g0"), gpu("g1"))
    nodes = [node("gpu", cpu=4000, memory=16 * GiB, gpus=gpus), node("cpu", 16000, 64 * GiB)]
    gangs = [gang("j", task("j.0", cpu=2000, memory=GiB))]
    assert where(place(Snapshot(nodes), gangs)) == {"j.0": "cpu"}
    # binpack alone prefers the tighter GPU node: it is the GPU score that keeps it off
    assert where(place(Snapshot(nodes), gangs, BINPACK_ONLY)) == {"j.0": "gpu"}
    # and when only the GPU node fits, the task goes there
    small_cpu = [node("gpu", cpu=4000, memory=16 * GiB, gpus=gpus), node("cpu", 1000, 64 * GiB)]
    assert where(place(Snapshot(small_cpu), gangs)) == {"j.0": "gpu"}


def test_tasks_of_one_gang_see_each_others_reservations():
    # two 3-core tasks, one 4-core node: the second must not see the first one's room
    result = place(Snapshot([node("n", cpu=4000)]), [gang("j", *tasks("j", 2, cpu=3000))])
    assert result.placed == ()
    assert result.unplaced["j"].startswith("gang of 2: 1 placed, then task j.1 ")


def test_a_gang_spreads_over_nodes_when_it_must():
    result = place(
        Snapshot([node("a", cpu=4000), node("b", cpu=4000)]), [gang("j", *tasks("j", 2, 3000))]
    )
    assert sorted(where(result).values()) == ["a", "b"]


def test_a_gang_that_does_not_fit_reserves_nothing():
    gangs = [
        gang("big", *tasks("big", 2, cpu=3000)),  # does not fit
        gang("small", task("small.0", cpu=4000)),  # fits only if big reserved nothing
    ]
    result = place(Snapshot([node("a", cpu=4000)]), gangs)
    assert where(result) == {"small.0": "a"}
    assert set(result.unplaced) == {"big"}


def test_a_shape_found_unplaceable_inside_a_failed_gang_fits_again_after_its_undo():
    """Within a round a shape that fits nowhere is not looked at again, but only until an
    undo gives back what was taken after that finding."""
    gangs = [
        # Takes both nodes' CPU, then its third task fits nowhere: "cpu=2000" is found
        # unplaceable mid-gang, and the undo must forget that.
        gang("big", *tasks("big", 3, cpu=2000)),
        gang("one", task("one.0", cpu=2000)),
        gang("two", task("two.0", cpu=2000)),
        gang("three", task("three.0", cpu=2000)),  # fits nowhere, before any undo
        gang("four", task("four.0", cpu=2000)),  # the same: no fresh look needed
    ]
    result = place(Snapshot([node("a", cpu=2000), node("b", cpu=2000)]), gangs)
    assert sorted(where(result)) == ["one.0", "two.0"]
    assert set(result.unplaced) == {"big", "three", "four"}
    assert "2 nodes: insufficient cpu" in result.unplaced["four"]


def test_gangs_are_served_in_the_order_given():
    snap = Snapshot([node("a", cpu=4000)])
    x, y = gang("x", task("x.0", cpu=3000)), gang("y", task("y.0", cpu=3000))
    first, second = place(snap, [x, y]), place(snap, [y, x])
    assert where(first) == {"x.0": "a"} and set(first.unplaced) == {"y"}
    assert where(second) == {"y.0": "a"} and set(second.unplaced) == {"x"}


def test_placed_work_reduces_free_for_later_gangs():
    snap = Snapshot([node("a", cpu=4000), node("b", cpu=2000)])
    result = place(snap, [gang(f"j{i}", task(f"j{i}.0", cpu=2000)) for i in range(4)])
    assert sorted(where(result).values()) == ["a", "a", "b"]
    assert set(result.unplaced) == {"j3"}


def test_pack_puts_a_16_task_gang_on_the_fewest_nodes():
    # 8 equal nodes of 8 cores, 16 tasks of 2: it fits only 4 to a node, on 4 nodes, and
    # the balanced profile (least allocated first) would scatter it if pack did not hold
    nodes = [node(f"n{i}", cpu=8000, memory=16 * GiB) for i in range(8)]
    balanced = PROFILES["balanced"]
    ts = tasks("j", 16, cpu=2000, memory=GiB)
    packed = place(Snapshot(nodes), [gang("j", *ts, strategy="pack")], balanced)
    assert sorted(Counter(where(packed).values()).values()) == [4, 4, 4, 4]
    scattered = place(Snapshot(nodes), [gang("j", *ts)], balanced)
    assert len(set(where(scattered).values())) == 8
    # with room for exactly 16 left, in 4 nodes' worth of whole holes, every task fits
    tight = [
        node(f"n{i}", cpu=8000, memory=16 * GiB, alloc=Resources(cpu=7000 if i % 2 else 0))
        for i in range(8)
    ]
    result = place(Snapshot(tight), [gang("j", *ts, strategy="pack")], balanced)
    assert result.unplaced == {}
    assert set(where(result).values()) == {"n0", "n2", "n4", "n6"}


def test_pack_keeps_a_gang_in_one_zone_when_it_can():
    nodes = [node(f"{z}{i}", cpu=4000, zone=z) for z in "ab" for i in range(3)]
    result = place(Snapshot(nodes), [gang("j", *tasks("j", 8, cpu=1000), strategy="pack")])
    assert Counter(n[0] for n in where(result).values()) in (Counter(a=8), Counter(b=8))


def test_spread_by_zone_balances_the_zones():
    nodes = [node(f"{z}{i}", cpu=16000, zone=z) for z in "abc" for i in range(2)]
    result = place(Snapshot(nodes), [gang("j", *tasks("j", 6, cpu=1000), strategy="spread")])
    assert Counter(n[0] for n in where(result).values()) == Counter(a=2, b=2, c=2)
    # binpack, for contrast, keeps them together
    packed = place(Snapshot(nodes), [gang("j", *tasks("j", 6, cpu=1000))])
    assert len(set(where(packed).values())) == 1


def test_spread_counts_what_the_job_already_holds():
    nodes = [node(f"{z}0", cpu=16000, zone=z) for z in "abc"]
    g = gang("j", *tasks("j", 3, cpu=1000), strategy="spread", held=("a0", "a0", "b0"))
    result = place(Snapshot(nodes), [g])
    # it holds a:2 b:1 c:0, so the 3 new tasks even it out at 2 a zone
    assert Counter(where(result).values()) == Counter(b0=1, c0=2)


def test_spread_by_node_uses_distinct_nodes_while_it_can():
    nodes = [node(f"n{i}", cpu=16000, zone="a") for i in range(4)]
    three = place(
        Snapshot(nodes),
        [gang("j", *tasks("j", 3, cpu=1000), strategy="spread", spread_by="node")],
    )
    assert len(set(where(three).values())) == 3
    six = place(
        Snapshot(nodes),
        [gang("j", *tasks("j", 6, cpu=1000), strategy="spread", spread_by="node")],
    )
    assert sorted(Counter(where(six).values()).values()) == [1, 1, 2, 2]


def test_anti_affinity_one_task_per_node_counting_held_and_explained():
    nodes = [node(f"n{i}", cpu=16000) for i in range(3)]
    g = gang("j", *tasks("j", 2, cpu=1000), anti_affinity=True, held=("n1",))
    result = place(Snapshot(nodes), [g])
    assert sorted(where(result).values()) == ["n0", "n2"]
    g3 = gang("j", *tasks("j", 3, cpu=1000), anti_affinity=True, held=("n1",))
    result = place(Snapshot(nodes), [g3])
    assert result.placed == ()
    assert result.unplaced["j"].endswith(
        "fits no node: 3 nodes: already run a task of this job (anti_affinity)"
    )


def test_a_fractional_task_goes_to_the_gpu_with_room_by_measured_utilisation():
    g = (gpu("GPU-0", util=90), gpu("GPU-1", util=20))
    snap = Snapshot([node("n", cpu=8000, memory=64 * GiB, gpus=g)])
    t = task("j.0", cpu=1000, memory=GiB, gpu=250, gpu_memory=10 * GiB)
    result = place(snap, [gang("j", t)])
    assert [p.gpu_uuids for p in result.placed] == [("GPU-1",)]
    # the other way round, the other GPU
    g = (gpu("GPU-0", util=20), gpu("GPU-1", util=90))
    result = place(Snapshot([node("n", 8000, 64 * GiB, gpus=g)]), [gang("j", t)])
    assert [p.gpu_uuids for p in result.placed] == [("GPU-0",)]


def test_the_gpu_score_is_not_always_zero():
    # Alnair divides integers and its utilisation term is always 0; ours is not
    g = (gpu("GPU-0", util=90), gpu("GPU-1", util=20))
    w = Working(Snapshot([node("n", 8000, 64 * GiB, gpus=g)]))
    s = shape(1000, GiB, gpu=250, gpu_memory=10 * GiB)
    scores = plugins.gpu_slot_scores(w, slice(0, 1), s)[0]
    assert scores[1] > scores[0] and scores[1] != 0 and np.isfinite(scores).all()
    assert scores.tolist() == pytest.approx([0.25 - 2.0 * 0.15, 0.25])


def test_fractions_pack_onto_a_shared_gpu_and_keep_whole_gpus_whole():
    g = (gpu("GPU-0"), gpu("GPU-1", alloc=500, mem_alloc=20 * GiB), gpu("GPU-2"))
    snap = Snapshot([node("n", cpu=8000, memory=64 * GiB, gpus=g)])
    frac = tasks("f", 3, 1000, GiB, gpu=250, gpu_memory=10 * GiB)
    result = place(snap, [gang("f", *frac)])
    # two fill GPU-1 up to a whole one; the third has to start a fresh GPU
    uuids = [p.gpu_uuids for p in result.placed]
    assert uuids[:2] == [("GPU-1",), ("GPU-1",)]
    assert uuids[2] in (("GPU-0",), ("GPU-2",))
    # and then a 1-GPU task still finds a whole GPU
    whole = task("w.0", 1000, GiB, gpu=1000, gpu_memory=40 * GiB)
    result = place(snap, [gang("f", *frac), gang("w", whole)])
    assert where(result)["w.0"] == "n" and result.unplaced == {}
    grants = Counter(u for p in result.placed for u in p.gpu_uuids)
    assert sorted(grants.values()) == [1, 1, 2]


def test_a_whole_gpu_task_is_not_placed_on_shared_gpus_and_says_so():
    shared = tuple(gpu(f"s{j}", alloc=250, mem_alloc=GiB) for j in range(4))
    t = task("w.0", 1000, GiB, gpu=2000, gpu_memory=40 * GiB)
    snap = Snapshot([node("shared", 16000, 64 * GiB, gpus=shared)])  # 3 GPUs free, node-wide
    result = place(snap, [gang("w", t)])
    assert result.placed == ()
    assert result.unplaced["w"] == (
        "task w.0 (cpu=1 memory=1Gi gpu=2 gpu_memory=40Gi) fits no node: "
        "1 node: fewer than 2 unshared GPUs, 20Gi each free"
    )
    free = (gpu("f0", util=50), gpu("f1", util=10), gpu("f2", util=30))
    snap = Snapshot(
        [node("shared", 16000, 64 * GiB, gpus=shared), node("free", 16000, 64 * GiB, gpus=free)]
    )
    result = place(snap, [gang("w", t)])
    # the two least busy free GPUs, least busy first
    assert [(p.node_id, p.gpu_uuids) for p in result.placed] == [("free", ("f1", "f2"))]


def test_gpu_memory_measured_in_use_is_not_free():
    g = (gpu("busy", 16 * GiB, used=12 * GiB), gpu("idle", 16 * GiB, alloc=500, mem_alloc=12 * GiB))
    snap = Snapshot([node("n", 8000, 64 * GiB, gpus=g)])
    result = place(snap, [gang("j", task("j.0", 1000, gpu=250, gpu_memory=6 * GiB))])
    assert result.placed == ()
    assert "1 node: no single GPU with 0.25 GPU, 6Gi each free" in result.unplaced["j"]
    result = place(snap, [gang("j", task("j.0", 1000, gpu=250, gpu_memory=4 * GiB))])
    assert [p.gpu_uuids for p in result.placed] == [("idle",)]  # fuller, and 4Gi fits both


def test_gpu_grants_of_one_round_add_up():
    g = (gpu("g0", 16 * GiB),)
    snap = Snapshot([node("g", cpu=8000, gpus=g)])
    gangs = [
        gang("a", task("a.0", 100, gpu=500, gpu_memory=8 * GiB)),
        gang("b", task("b.0", 100, gpu=500, gpu_memory=10 * GiB)),
        gang("c", task("c.0", 100, gpu=500, gpu_memory=8 * GiB)),
        gang("d", task("d.0", 100, gpu=250)),
    ]
    result = place(snap, gangs)
    assert where(result) == {"a.0": "g", "c.0": "g"}
    assert "insufficient gpu_memory" in result.unplaced["b"]
    assert "insufficient gpu" in result.unplaced["d"]


def test_isolation_mps_lands_only_on_gpus_that_deliver_it():
    g = (
        gpu("none", alloc=500, enforcement="none"),  # the fullest: packing alone picks it
        gpu("watchdog", alloc=500, enforcement="watchdog"),
        gpu("mps", enforcement="mps"),
        gpu("mig", enforcement="mig"),
    )
    snap = Snapshot([node("n", 16000, 64 * GiB, gpus=g)])
    ts = tasks("j", 4, 100, gpu=500, gpu_memory=GiB, isolation="mps")
    result = place(snap, [gang("j", *ts, gang=0)])
    assert {u for p in result.placed for u in p.gpu_uuids} == {"mps", "mig"}
    assert len(result.placed) == 4
    plain = place(snap, [gang("p", task("p.0", 100, gpu=500, gpu_memory=GiB))])
    assert plain.placed[0].gpu_uuids[0] in ("none", "watchdog")
    weak = Snapshot([node("w", 16000, 64 * GiB, gpus=g[:2]), node("c", 16000)])
    result = place(weak, [gang("j", *ts[:1])])
    assert result.placed == ()
    assert result.unplaced["j"].endswith(
        "fits no node: 1 node: insufficient gpu; 1 node: no GPU delivering mps isolation"
    )


def test_explanation_counts_nodes_per_reason_most_common_first():
    nodes = [
        node(f"b{i:04}", 8000, 16 * GiB, zone="b", gpus=(gpu(f"b{i}", 8 * GiB),))
        for i in range(1200)
    ] + [node(f"a{i:03}", 8000, 16 * GiB, zone="a", gpus=(gpu(f"a{i}"),)) for i in range(100)]
    t = task("j.0", 1000, GiB, gpu=500, gpu_memory=10 * GiB, labels=(("zone", "b"),))
    result = place(Snapshot(nodes), [gang("j", t)])
    assert result.unplaced["j"] == (
        "task j.0 (cpu=1 memory=1Gi gpu=0.5 gpu_memory=10Gi zone=b) fits no node: "
        "1,200 nodes: insufficient gpu_memory; 100 nodes: label zone≠b"
    )


def test_unplaced_reason_counts_nodes_per_reason():
    nodes = [
        node("m1", cpu=8000, memory=1 * GiB),
        node("m2", cpu=8000, memory=2 * GiB),
        node("sim", cpu=8000, memory=64 * GiB, simulated=True),
        node("c", cpu=500, memory=64 * GiB),
    ]
    result = place(Snapshot(nodes), [gang("j", task("j.w.0", cpu=1000, memory=4 * GiB))])
    assert result.unplaced["j"] == (
        "task j.w.0 (cpu=1 memory=4Gi) fits no node: 2 nodes: insufficient memory; "
        "1 node: insufficient cpu; 1 node: simulated node (task runs a real command)"
    )


def test_unplaced_reason_for_a_simulated_task_on_real_nodes():
    snap = Snapshot([node("r1", cpu=1000), node("r2", cpu=1000)])
    result = place(snap, [gang("s", task("s.0", cpu=1, simulated=True))])
    assert result.unplaced["s"].endswith("fits no node: 2 nodes: real node (task is simulated)")


def test_no_nodes_at_all():
    result = place(Snapshot([]), [gang("j", task("j.0", cpu=1))])
    assert result.placed == ()
    assert result.unplaced["j"].endswith("no ready nodes")


def test_reason_names_the_first_task_that_did_not_fit():
    result = place(
        Snapshot([node("a", cpu=2000)]),
        [gang("j", task("j.0", cpu=1000), task("j.1", cpu=5000), task("j.2", cpu=9000))],
    )
    assert result.unplaced["j"].startswith("gang of 3: 1 placed, then task j.1 (cpu=5 ")


def test_zero_resource_tasks_fit_on_a_full_node():
    full = node("a", cpu=1000, alloc=Resources(cpu=1000))
    assert where(place(Snapshot([full]), [gang("j", task("j.0"))])) == {"j.0": "a"}


def test_an_overdrawn_node_takes_nothing():
    over = node("a", cpu=4000, memory=4 * GiB, alloc=Resources(cpu=5000))
    result = place(Snapshot([over]), [gang("j", task("j.0", memory=GiB))])
    assert result.placed == ()  # it asks for no cpu, but 0 > -1000 is still a shortfall
    assert "insufficient cpu" in result.unplaced["j"]


def test_holds_line_blocks_the_gangs_behind_it_only_when_it_does_not_fit():
    snap = Snapshot([node("a", cpu=4000), node("b", cpu=4000)])
    small = [gang(f"s{i}", task(f"s{i}.0", cpu=1000)) for i in range(2)]
    big = gang("big", *tasks("big", 3, cpu=4000), holds_line=True)
    result = place(snap, [big, *small])
    assert result.placed == ()
    assert set(result.unplaced) == {"big", "s0", "s1"}
    assert result.unplaced["s0"] == (
        "waiting: job big has waited long and holds the line until it fits"
    )
    assert result.unplaced["big"].startswith("gang of 3: 2 placed, then task big.2 ")
    # not holding the line, the small jobs behind it are placed
    result = place(snap, [gang("big", *tasks("big", 3, cpu=4000)), *small])
    assert set(where(result)) == {"s0.0", "s1.0"} and set(result.unplaced) == {"big"}
    # a starving gang that fits holds nothing up
    fits = gang("big", *tasks("big", 2, cpu=3000), holds_line=True)
    result = place(snap, [fits, *small])
    assert len(result.placed) == 4 and result.unplaced == {}
    # and the gangs before it are placed as usual
    result = place(snap, [small[0], big, small[1]])
    assert set(where(result)) == {"s0.0"} and HOLDS_LINE in result.unplaced["s1"]


def test_a_starving_gang_whose_gang_part_fits_does_not_hold_the_line():
    # An elastic job (min_tasks=2 of 4) that has waited long: its gang part fits and
    # starts; only its optional extras wait for room. It no longer starves, so the jobs
    # behind it should be placed as usual (GangRequest.holds_line: "if it does not fit,
    # nothing after it is placed"; scheduling.gang_request sets it for such a job).
    snap = Snapshot([node("a", cpu=4000), node("b", cpu=4000)])
    elastic = gang("e", *tasks("e", 4, cpu=3000), gang=2, holds_line=True)
    result = place(snap, [elastic, gang("s", task("s.0", cpu=1000))])
    assert set(where(result)) == {"e.0", "e.1", "s.0"}
    assert set(result.unplaced) == {"e"}


def test_gang_zero_places_tasks_one_by_one_without_rollback():
    snap = Snapshot([node("a", cpu=4000)])
    result = place(snap, [gang("j", *tasks("j", 3, cpu=2000), gang=0)])
    assert set(where(result)) == {"j.0", "j.1"}
    assert result.unplaced["j"].startswith("task j.2 (cpu=2 memory=0) fits no node: ")
    # and what it placed counts against later gangs
    result = place(snap, [gang("j", *tasks("j", 3, cpu=2000), gang=0), gang("k", task("k.0", 1))])
    assert "k" in result.unplaced


def test_gang_n_places_the_first_n_together_and_the_rest_as_room_allows():
    snap = Snapshot([node("a", cpu=4000)])
    result = place(snap, [gang("j", *tasks("j", 3, cpu=2000), gang=2)])
    assert set(where(result)) == {"j.0", "j.1"}  # the third, not part of the gang, waits
    assert result.unplaced["j"].startswith("task j.2 ")
    # the first N do not fit: none is placed, though the first alone would fit
    result = place(
        snap, [gang("j", *tasks("j", 4, cpu=1500), gang=3), gang("k", task("k.0", 4000))]
    )
    assert where(result) == {"k.0": "a"}
    assert result.unplaced["j"].startswith("gang of 3: 2 placed, then task j.2 ")
    # gang larger than the job is the whole job
    assert GangRequest("j", tasks("j", 2), gang=5).gang_size == 2
    assert GangRequest("j", tasks("j", 2), gang=-1).gang_size == 2


def test_a_tie_between_identical_nodes_is_broken_by_the_seed():
    nodes = [node(f"n{i}", cpu=4000) for i in range(4)]
    snap = Snapshot(nodes)
    g = [gang("j", task("j.0", cpu=1000))]
    chosen = {}
    for seed in range(8):
        chosen[seed] = where(place(snap, g, BINPACK_ONLY, seed))["j.0"]
        assert where(place(Snapshot(nodes), g, BINPACK_ONLY, seed))["j.0"] == chosen[seed]
        jitter = np.random.default_rng(seed).random(len(nodes))
        assert chosen[seed] == f"n{int(np.argmax(jitter))}"
    assert len(set(chosen.values())) > 1, chosen
    # ties only: a strictly tighter node wins under every seed
    tighter = Snapshot([*nodes, node("t", cpu=2000)])
    assert {where(place(tighter, g, BINPACK_ONLY, s))["j.0"] for s in range(8)} == {"t"}


def test_describe():
    s = shape(1500, 2 * GiB, disk=GiB, gpu=250, gpu_memory=GiB, labels=(("zone", "a"),))
    assert describe(s) == "cpu=1500m memory=2Gi disk=1Gi gpu=0.25 gpu_memory=1Gi zone=a"
    assert describe(shape(2000, isolation="mps")) == "cpu=2 memory=0 isolation>=mps"


def test_profile_rejects_unknown_scores():
    with pytest.raises(ValueError, match="unknown score plugins"):
        Profile("x", {"nope": 1.0})


def test_commit_drops_a_job_whose_node_shrank_and_keeps_the_rest():
    nodes = [node("a", cpu=4000), node("b", cpu=4000), node("c", cpu=4000)]
    gangs = [
        gang("x", *tasks("x", 2, cpu=3000)),  # on two nodes
        gang("y", task("y.0", cpu=3000)),
    ]
    plan = place(Snapshot(nodes), gangs, BINPACK_ONLY)
    assert len(plan.placed) == 3 and plan.unplaced == {}
    shrunk = where(plan)["x.1"]
    live = {n.node_id: n for n in nodes}
    live[shrunk] = node(shrunk, cpu=2000)
    result = commit(plan, gangs, live)
    assert where(result) == {"y.0": where(plan)["y.0"]}
    assert result.unplaced == {
        "x": f"node {shrunk} changed since the placement snapshot; placing again"
    }
    # a node that left is a change too; and an unchanged view keeps the whole plan
    del live[shrunk]
    assert set(commit(plan, gangs, live).unplaced) == {"x"}
    assert commit(plan, gangs, {n.node_id: n for n in nodes}) == plan


def test_a_job_the_commit_drops_gives_back_what_it_had_taken_for_the_next():
    x0, x1, y0 = task("x.0", cpu=3000), task("x.1", cpu=3000), task("y.0", cpu=4000)
    gangs = [gang("x", x0, x1), gang("y", y0)]
    plan = PlacementResult(
        (Placement("x", "x.0", "a"), Placement("x", "x.1", "b"), Placement("y", "y.0", "a")),
        {},
    )
    live = {"a": node("a", cpu=5000), "b": node("b", cpu=2000)}  # b shrank: x fails there
    result = commit(plan, gangs, live)
    assert result.placed == (Placement("y", "y.0", "a"),)  # fits only with x's share back
    assert set(result.unplaced) == {"x"}


def test_commit_checks_each_gpu_not_just_the_node():
    g = (gpu("g0", 16 * GiB), gpu("g1", 16 * GiB))
    nodes = [node("n", cpu=8000, gpus=g)]
    gangs = [gang("j", task("j.0", 100, gpu=1000, gpu_memory=8 * GiB))]
    plan = place(Snapshot(nodes), gangs)
    (p,) = plan.placed
    # another plan took a quarter of the very GPU this one chose: node-wide it still fits
    taken = tuple(gpu(x.uuid, 16 * GiB, alloc=250 if x.uuid == p.gpu_uuids[0] else 0) for x in g)
    live = {"n": node("n", cpu=8000, gpus=taken)}
    assert commit(plan, gangs, live).placed == ()


def test_commit_refuses_a_gpu_that_no_longer_delivers_the_isolation_asked():
    mps = (gpu("g0", 16 * GiB, enforcement="mps"),)
    gangs = [gang("j", task("j.0", 100, gpu=500, gpu_memory=GiB, isolation="mps"))]
    plan = place(Snapshot([node("n", cpu=8000, gpus=mps)]), gangs)
    assert len(plan.placed) == 1
    assert commit(plan, gangs, {"n": node("n", cpu=8000, gpus=mps)}) == plan
    # the MPS daemon went away since the snapshot: only the watchdog is delivered now
    watchdog = (gpu("g0", 16 * GiB, enforcement="watchdog"),)
    assert commit(plan, gangs, {"n": node("n", cpu=8000, gpus=watchdog)}).placed == ()


@given(
    a=st.tuples(st.integers(0, 3), st.booleans(), st.sampled_from(["", "a"]), st.booleans()),
    b=st.tuples(st.integers(0, 3), st.booleans(), st.sampled_from(["", "a"]), st.booleans()),
)
def test_a_shape_s_kept_hash_agrees_with_its_equality(a, b):
    """Shapes key the core's maps by a hash computed once: equal shapes (however made,
    replace included) must hash equal, and the scheduler hands out one object each."""

    def make(cpu, simulated, label, isolated):
        labels = (("k", label),) if label else ()
        return Shape((cpu, 0, 0, 0, 0), simulated, labels, "mps" if isolated else "none")

    x, y = make(*a), make(*b)
    assert (x == y) == (a == b)
    if x == y:
        assert hash(x) == hash(y)
    moved = dataclasses.replace(x, simulated=not x.simulated)
    assert moved == make(a[0], not a[1], a[2], a[3]) and hash(moved) == hash(
        make(a[0], not a[1], a[2], a[3])
    )
    fields = (x.resources, x.simulated, x.labels, x.isolation)
    assert scheduling._shape(*fields) is scheduling._shape(*fields) == x


def check_scalar_twins(snap: Snapshot, shapes: list[Shape], bookings: list[int]) -> int:
    """After `bookings` (node, shape) picks, each dynamic pipeline's scalar twin agrees
    with its vector form on every node, for every profile. Returns the nodes checked."""
    w = Working(snap)
    n = len(snap)
    for k in bookings:  # unchecked: nodes may be overdrawn, GPUs over-shared
        i, shape = k % n, shapes[k % len(shapes)]
        slots = ()
        if shape.gpu and int(snap.gpu_count[i]):
            slots = tuple(range(min(max(shape.whole_gpus, 1), int(snap.gpu_count[i]))))
        plugins.book(w, i, shape, slots)
    checked = 0
    for profile in (*PROFILES.values(), BINPACK_ONLY):
        for shape in shapes:
            p = plugins.pipeline(shape, profile, dynamic=True)
            assert p.scalar
            ok, values = p.run(w, np.arange(n), shape)
            for i in range(n):
                got = p.run_one(w.row(i), shape)
                assert p.fits_one(w.row(i), shape) == bool(ok[i])
                if ok[i]:
                    assert got == values[i], (shape, i, got, values[i])
                else:
                    assert got is None
                checked += 1
    return checked


@PROPS
@given(clusters, st.lists(st.integers(0, 10_000), max_size=30))
def test_scalar_twins_give_the_vector_plugins_numbers(cluster, bookings):
    """The core rescores a few changed nodes with the dynamic plugins' scalar twins and
    whole regions with the vector plugins: they must agree exactly, or a node's score
    would depend on how it was last refreshed."""
    nodes, gangs, _ = cluster
    shapes = sorted({t.shape for g in gangs for t in g.tasks}, key=repr)
    assert check_scalar_twins(Snapshot(nodes), shapes, bookings)


def test_scalar_twins_agree_on_a_hollow_region_at_real_magnitudes():
    """Byte-sized memory and the generator's shapes: the sums that must come out the same
    to the last bit are of very different magnitudes here."""
    from agent.hollow import HollowNode, inventory_mix
    from coordinator.cluster import ClusterView
    from coordinator.state import RegionState
    from mesh.schema import JobSubmitted, LogEntry
    from workloads.generator import WorkloadConfig, generate

    cluster = ClusterView("r")
    for i, inv in enumerate(inventory_mix(60, seed=5)):
        cluster.observe(HollowNode(f"n{i:02d}", inv).state("r"), 0.0)
    state = RegionState()
    jobs = generate(WorkloadConfig(seed=5, tasks=400))
    events = tuple(JobSubmitted(f"j{k}", f"c{k}", j.spec, 0.0) for k, j in enumerate(jobs))
    state.apply(1, LogEntry(1, "c", events))
    shapes = sorted(
        {scheduling.shape_of(j, t.group) for j in state.pending_jobs() for t in j.tasks.values()},
        key=repr,
    )
    assert any(s.fractional for s in shapes) and any(s.whole_gpus for s in shapes)
    snap = scheduling.snapshot(cluster, state)
    rnd = random.Random(5)
    assert check_scalar_twins(snap, shapes, [rnd.randrange(10_000) for _ in range(80)])


def test_a_refresh_with_scalar_twins_places_as_the_vector_refresh_does():
    """The whole core, both ways, on a busy hollow backlog: the same decision."""
    from bench.placement import backlog_state, hollow_cluster
    from workloads.generator import WorkloadConfig, generate

    cluster = hollow_cluster(150, 9)
    state = backlog_state([j.spec for j in generate(WorkloadConfig(seed=9, tasks=3000))])
    config = scheduling.PlacementConfig(max_tasks_per_round=10_000)
    got = scheduling.place_jobs(state, cluster, state.pending_jobs(), 1e9, config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core, "SCALAR_REFRESH", 0)
        want = scheduling.place_jobs(state, cluster, state.pending_jobs(), 1e9, config)
    assert len(got.placed) > 500 and got == want


def test_fits_nowhere_on_no_nodes_and_after_the_room_is_taken():
    s = shape(cpu=2)
    assert Placer(Snapshot([])).fits_nowhere(s)
    placer = Placer(Snapshot([node("a", cpu=2)]))
    assert not placer.fits_nowhere(s)
    placer.place([gang("j", task("t", cpu=2))])
    assert placer.fits_nowhere(s)
