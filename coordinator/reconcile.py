"""What the leader should do next, given the region's state and its nodes. Pure.

One call looks at the state once and returns log events to append, kills to send and
why jobs wait. The shell appends the events, applies them, and calls again until
nothing changes, so each rule here only needs to take one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator import elastic
from coordinator.changes import Mark
from coordinator.cluster import DOWN, HEARD, ClusterView, NodeView
from coordinator.fitting import region_fit
from coordinator.parking import gang_due, park, park_never, park_unfit, parked
from coordinator.partitions.drain import drain_moves, vacating
from coordinator.placement import GangRequest, Placement, Snapshot
from coordinator.pooling import PoolView, admitted_jobs, pool_view
from coordinator.ports import assign as assign_ports
from coordinator.records import HOLDING, JobRecord
from coordinator.reports import Kill
from coordinator.scheduling import (
    PlacementConfig,
    hopeless,
    new_placer,
    place_jobs,
    snapshot,
    window,
)
from coordinator.services import keep_services, restart_delay
from coordinator.state import RegionState
from edge.sites import forwarded_since, lost_why, may_declare_lost
from mesh.schema import (
    DuplicateStopped,
    JobKillRequested,
    LogEvent,
    TaskPlaced,
    TaskPreemptRequested,
    TaskUpdated,
)
from workloads.lifecycle import TaskState
from workloads.resources import Resources

DEFAULT_PLACEMENT = PlacementConfig()


@dataclass(slots=True)
class Decisions:
    events: list[LogEvent] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    unplaced: dict[str, str] = field(default_factory=dict)
    pools: PoolView | None = None  # this round's pool figures, when jobs were waiting


def reconcile(
    state: RegionState,
    nodes: ClusterView,
    now: float,
    config: PlacementConfig = DEFAULT_PLACEMENT,
    draining: frozenset[str] = frozenset(),
) -> Decisions:
    """`draining`: nodes to vacate besides those a partition move drains (the state's
    own, `drain.vacating`): nothing new is placed on them, and service replicas on them
    are replaced elsewhere first (surge)."""
    d = Decisions()
    _lose_tasks_on_down_nodes(state, nodes, now, d)
    _lose_tasks_a_node_forgot(state, nodes, now, d)
    _requeue_or_settle(state, now, d)
    if state.primary_ended:
        _end_with_primary(state, now, d)
    _kill_requested_jobs(state, now, d)
    _kill_stale_copies(state, nodes, now, d)
    if state.partitions.moving:
        d.events.extend(drain_moves(state, now))  # docs/partitions.md
    _reclaim_preempted(state, d)
    _stop_replicas(state, now, d)
    if state.elastic:
        d.events.extend(resize_events(state, now, config))
    if not d.events and state.services:
        # A partition move's nodes are cordoned by placement itself (and still count in
        # the pools' capacity); here only their replicas are moved off, with surge.
        vacate = draining | vacating(state) if state.partitions.moving else draining
        d.events.extend(keep_services(state, vacate, now))
    if not d.events:
        # Place only from a settled state: a task being requeued this round is placed next.
        _place_waiting(state, nodes, now, config, d, draining)
    return d


def _lose_tasks_on_down_nodes(
    state: RegionState, nodes: ClusterView, now: float, d: Decisions
) -> None:
    # The shell `expect`s nodes it never heard from, so their silence ends in DOWN too.
    for node_id in sorted(n for n in nodes.down if n in state.node_tasks):
        for tid in sorted(state.node_tasks[node_id]):
            d.events.append(_lost(state, tid, node_id, now, "stopped heartbeating"))
    # A cut-off site's nodes keep running their tasks: LOST only past its autonomy
    # (`now` is the wall clock, as the sites' `last_heard`: edge/sites.py).
    for node_id in sorted(n for n in nodes.disconnected if n in state.node_tasks):
        site = nodes.sites.get(nodes.nodes[node_id].state.site)
        if site is not None and may_declare_lost(site, now):
            why = lost_why(site, now)
            for tid in sorted(state.node_tasks[node_id]):
                d.events.append(_lost(state, tid, node_id, now, why))


FORGOTTEN_AFTER_S = 10.0  # missing from a node's heartbeats this long (its clock): LOST


def _lose_tasks_a_node_forgot(
    state: RegionState, nodes: ClusterView, now: float, d: Decisions
) -> None:
    """A RUNNING task its node's heartbeats have stopped listing for FORGOTTEN_AFTER_S is
    LOST: the agent restarted without it (a corrupt store, a hollow fleet restarted inside
    the down deadline) and nobody would ever report its end. A node keeps listing a task
    that ended until its outcome is stored in the events stream (even while JetStream is
    away), so the wait only has to cover a heartbeat crossing that outcome, and agents
    older than that. Stored is not logged: while the log cannot take the leader's
    appends (its stream's server died), or after a failover, the outcome waits in the
    events stream, and a task declared LOST meanwhile ran again after it had succeeded.
    So a task is also only LOST once every event stored before the node stopped listing
    it was handled: a check of the events stream begun after that (the cluster's
    `events_*`, kept by the leader) read its last sequence, and a later one found the
    leaders' consumer acknowledged up to it. Times are the agent's own clock (heartbeat
    and task events alike), so only nodes that heartbeat since the last round (the
    cluster's journal) are looked at.

    An edge site's node drops a task from its heartbeats once the outcome is stored on
    the site, and the site link forwards it to the events stream later (a backlog after
    a cut takes seconds): there the wait above starts only once the site's beats show
    that what it held when the task was missed has been forwarded
    (`edge.sites.forwarded_since`)."""
    missing: dict[tuple[str, int], _Missed] = state.memo.setdefault("forgot_missing", {})
    gates: dict[tuple[str, int], list[int]] = state.memo.setdefault("forgot_site_gate", {})
    for key in [k for k in missing if _not_running(state, k)]:
        del missing[key]
    for key in [k for k in gates if _not_running(state, k)]:
        del gates[key]
    heard = nodes.changes.since(state.memo.get("forgot_mark"))
    state.memo["forgot_mark"] = nodes.changes.mark()
    tasks_of = state.node_tasks
    # (set.intersection(dict) would walk the dict: every node, every round)
    looked = tasks_of.keys() if heard is None else [n for n in heard if n in tasks_of]
    for node_id in sorted(looked):
        view = nodes.nodes.get(node_id)
        if view is None or view.status not in HEARD or view.state.seq == 0:
            continue
        live, ts, lost = view.live_tasks, view.state.ts, []
        for tid in state.node_tasks[node_id]:  # tens of thousands a second: keep it lean
            t = state.tasks[tid]
            if t.state != TaskState.RUNNING or t.started_at is None:
                continue
            if f"{tid}#{t.attempt}" in live or ts <= t.started_at:
                if missing:
                    missing.pop((tid, t.attempt), None)
                if gates:
                    gates.pop((tid, t.attempt), None)
                continue
            key = (tid, t.attempt)
            seen = missing.get(key)
            if seen is None:
                site = nodes.sites.get(view.state.site) if view.state.site else None
                if site is not None:
                    gate = gates.setdefault(key, [site.beats, -1])
                    if not forwarded_since(gate, site):
                        continue  # its outcome may still be on the site, not forwarded
                    del gates[key]
                seen = missing[key] = _Missed(ts, nodes.events_checks)
            if seen.upto is None and nodes.events_checked > seen.checks:
                seen.upto = nodes.events_last
            if ts - seen.since >= FORGOTTEN_AFTER_S and _events_handled(seen.upto, nodes):
                del missing[key]
                lost.append(tid)
        why = f"has not reported it for {FORGOTTEN_AFTER_S:.0f}s (restarted without it?)"
        d.events.extend(_lost(state, tid, node_id, now, why) for tid in sorted(lost))


@dataclass(slots=True)
class _Missed:
    """A RUNNING attempt its node's heartbeats no longer list."""

    since: float  # the agent's clock when first missed
    checks: int  # events checks begun by then
    upto: int | None = None  # the stream's last sequence, per the first check begun after


def _events_handled(upto: int | None, nodes: ClusterView) -> bool:
    """Every task event up to sequence `upto` of the events stream was acknowledged by
    the leaders' consumer (logged, or found to need no entry). A stream that went back
    (deleted and made again) lost what it held: what it holds now is what counts."""
    return upto is not None and nodes.events_floor >= min(upto, nodes.events_last)


def _lost(state: RegionState, tid: str, node_id: str, now: float, why: str) -> TaskUpdated:
    t = state.tasks[tid]
    return TaskUpdated(
        t.job_id,
        tid,
        t.attempt,
        TaskState.LOST,
        node_id,
        now,
        message=f"lost: node {node_id} {why}",
    )


def _not_running(state: RegionState, key: tuple[str, int]) -> bool:
    t = state.tasks.get(key[0])
    return t is None or t.attempt != key[1] or t.state != TaskState.RUNNING


def _requeue_or_settle(state: RegionState, now: float, d: Decisions) -> None:
    """FAILED, LOST and PREEMPTED attempts either go back to PENDING or end the task."""
    for tid in sorted(state.unsettled):
        t = state.tasks[tid]
        job = state.jobs[t.job_id]
        nxt, why = job.settles_to(t)
        if nxt is None:
            continue
        if (
            job.spec.is_service
            and nxt == TaskState.PENDING
            and t.state != TaskState.PREEMPTED
            and not (job.kill_requested or t.stop_reason)
        ):
            # A replica that ended waits out its backoff (a round runs at least every
            # RECONCILE_EVERY_S, so it is started again within that of it).
            delay = restart_delay(job, t)
            if now < (t.finished_at or 0.0) + delay:
                continue
            why = f"{why} (backoff {delay:g}s)"
        d.events.append(TaskUpdated(job.job_id, tid, t.attempt, nxt, "", now, message=why))


def _end_with_primary(state: RegionState, now: float, d: Decisions) -> None:
    """A job whose primary task (workloads.frameworks.primary_task: the Spark driver,
    torchrun's task 0) ended for good ends with it: its other tasks are stopped as a
    kill stops them (logged once, as `mesh job kill` logs it), and the job reports the
    primary's outcome, not KILLED (JobRecord.state)."""
    for job_id in sorted(state.primary_ended):
        job = state.jobs[job_id]
        outcome = job.primary_outcome()
        if outcome is None or job.kill_requested:
            continue  # (a failure with restarts left is requeued above)
        why = f"primary task {job.primary} {str(outcome).lower()}: the job ends with it"
        d.events.append(JobKillRequested(job_id, now, why))


def _stop_replicas(state: RegionState, now: float, d: Decisions) -> None:
    """Service replicas being stopped for good: a running one is sent a kill (resent
    like a job's), a waiting one is KILLED at once; an ended one settles to KILLED."""
    for tid in sorted(state.stopping):
        t = state.tasks[tid]
        if t.state in HOLDING:
            d.kills.append(Kill(t.node_id, t.job_id, tid, t.attempt, t.stop_reason))
        elif t.state == TaskState.PENDING:
            d.events.append(
                TaskUpdated(
                    t.job_id, tid, t.attempt, TaskState.KILLED, "", now, message=t.stop_reason
                )
            )


def _kill_requested_jobs(state: RegionState, now: float, d: Decisions) -> None:
    for job_id in sorted(state.killing):
        job = state.jobs[job_id]
        for t in job.tasks.values():
            if t.state == TaskState.PENDING:
                d.events.append(
                    TaskUpdated(
                        job.job_id,
                        t.task_id,
                        t.attempt,
                        TaskState.KILLED,
                        "",
                        now,
                        message=job.kill_reason or "job killed",
                    )
                )
            elif t.state in HOLDING:
                d.kills.append(
                    Kill(
                        t.node_id, job.job_id, t.task_id, t.attempt, job.kill_reason or "job killed"
                    )
                )


@dataclass(slots=True)
class _StaleCopies:
    heard: Mark  # where the cluster's journal of heartbeats stood
    granted: Mark  # where the fold's journal of grants stood
    found: dict[str, list[Kill]] = field(default_factory=dict)  # node -> kills it needs
    lists: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> tasks looked at
    moved: set[str] = field(default_factory=set)  # nodes whose grants moved since


def _kill_stale_copies(state: RegionState, nodes: ClusterView, now: float, d: Decisions) -> None:
    """A node that reports a task attempt it should not be running (it was declared
    LOST and rescheduled while the node was away) must stop it: never run both.

    Looked at once per heartbeat (the cluster's journal), not every round: a region's
    nodes report tens of thousands of tasks, and rounds follow each other while events
    flow. A heartbeat listing the same tasks as the last one looked at (the decoder
    keeps the same tuple) is passed over unless the node's grants moved since: a copy
    only becomes stale when its attempt leaves the node, which gives back its grant.
    The kills found stand (and are sent again, as the shell decides) until the node's
    next heartbeat; a copy made stale between heartbeats is found at the next."""
    memo = state.memo.get("stale")
    marks = nodes.changes.mark(), state.node_changes.mark()
    heard = None if memo is None else nodes.changes.since(memo.heard)
    granted = None if memo is None else state.node_changes.since(memo.granted)
    if memo is None or heard is None or granted is None:
        memo = state.memo["stale"] = _StaleCopies(*marks)
        heard = set(nodes.nodes)
    else:
        memo.heard, memo.granted = marks
        memo.moved |= granted
    for node_id in heard:
        view = nodes.nodes[node_id]
        listed = view.state.tasks
        if view.status == DOWN:
            memo.found.pop(node_id, None)
            memo.lists.pop(node_id, None)
        elif memo.lists.get(node_id) is not listed or node_id in memo.moved:
            memo.lists[node_id] = listed
            memo.moved.discard(node_id)
            kills = _stale_on(state, view)
            if kills:
                memo.found[node_id] = kills
            else:
                memo.found.pop(node_id, None)
    for node_id in sorted(memo.found):
        d.kills.extend(memo.found[node_id])
        if nodes.nodes[node_id].state.site:
            d.events.extend(_duplicates(state, memo.found[node_id], now))


def _duplicates(state: RegionState, kills: list[Kill], now: float) -> list[DuplicateStopped]:
    """A site's node came back running an attempt that was run again meanwhile (its site
    was cut off past its autonomy): the kill stops it, and this logs it, once per copy."""
    out = []
    for k in kills:
        t = state.tasks[k.task_id]
        if t.attempt <= k.attempt or (k.task_id, k.attempt, k.node_id) in state.duplicates:
            continue
        why = (
            f"duplicate run of attempt {k.attempt} stopped: attempt {t.attempt} "
            f"ran after the site's autonomy"
        )
        out.append(DuplicateStopped(k.job_id, k.task_id, k.attempt, k.node_id, t.attempt, why, now))
    return out


def _stale_on(state: RegionState, view: NodeView) -> list[Kill]:
    found = []
    for key in view.live_tasks:
        tid, _, attempt_s = key.rpartition("#")
        t = state.tasks.get(tid)
        if t is None or not (attempt_s.isascii() and attempt_s.isdigit()):
            continue
        attempt = int(attempt_s)
        if t.state in HOLDING and t.node_id == view.node_id and t.attempt == attempt:
            continue
        found.append(
            Kill(
                view.node_id,
                t.job_id,
                tid,
                attempt,
                "stale copy: this attempt is no longer assigned to this node",
            )
        )
    return found


def resize_events(state: RegionState, now: float, config: PlacementConfig) -> list[LogEvent]:
    """Elastic jobs (coordinator/elastic.py): the tasks a shrink to the target stops,
    and the requeue of a job the watchdog found stalled. Both go back to PENDING
    through preemption (TaskPreemptRequested: the attempt is stopped and requeued). A
    requeue counts against the job's max_restarts (state.WATCHDOG): a job found stalled
    with none left is killed, its reason saying why."""
    out: list[LogEvent] = []
    for job_id in sorted(state.elastic):
        job = state.jobs[job_id]
        if job.kill_requested or job.away:
            continue
        f = elastic.facts(job, now, config.resize_every_s)
        by_index = {t.index: t for t in job.tasks.values()}
        why = elastic.stalled(f, config.progress_timeout_s)
        ends = elastic.hung(why, job.failures, job.spec.max_restarts)
        if ends is not None:
            out.append(JobKillRequested(job_id, now, ends))
            continue
        if why is not None:
            victims = [t for t in by_index.values() if t.state in HOLDING]
        else:
            why = f"resize to {f.target}"
            victims = [by_index[i] for i in elastic.stops(f)]
        out.extend(
            TaskPreemptRequested(job_id, t.task_id, t.attempt, why, now)
            for t in sorted(victims, key=lambda t: -t.index)
        )
    return out


def _reclaim_preempted(state: RegionState, d: Decisions) -> None:
    """Attempts chosen for preemption are stopped like killed ones (and resent alike)."""
    for tid in sorted(state.preempting):
        t = state.tasks[tid]
        if t.state in HOLDING:
            d.kills.append(Kill(t.node_id, t.job_id, tid, t.attempt, t.preempt_reason))


def _place_waiting(
    state: RegionState,
    nodes: ClusterView,
    now: float,
    config: PlacementConfig,
    d: Decisions,
    draining: frozenset[str] = frozenset(),
) -> None:
    if not state.queue:
        return
    barred = nodes.barred_reason()
    if not nodes.ready():
        causes = "; ".join(c for c in (barred, nodes.refusals()) if c)
        why = f"no node to place on: {causes}" if causes else "no ready nodes"
        d.unplaced.update({job.job_id: why for job in state.pending_jobs()})
        return
    snap = snapshot(nodes, state, draining)
    fit = region_fit(state, snap)  # what can ever fit the ready nodes
    capacity = Resources(*(int(x) for x in snap.cap_total))  # kept by the snapshot
    key = (state.epoch, capacity)
    pools = state.memo.get("pool_view")
    if pools is None or pools[0] != key:
        pools = state.memo["pool_view"] = (key, pool_view(state, capacity, now))
    d.pools = pools[1]
    # Nothing placed last time and nothing changed since (the state's epoch, ready
    # capacity, the last IDLE_S, no parked gang come to hold the line): the same inputs
    # would give the same answer, so skip it. Time moves what heartbeats measured and
    # the starvation guard; a backlog that admission holds back (30,000 jobs) took a 1 s
    # round every second.
    idle_key = (
        key,
        fit.version,
        int(now / IDLE_S),
        gang_due(state, now),
        _elastic_due(state, now, config) if state.elastic else None,
    )
    idle = state.memo.get("placement_idle")
    if idle is not None and idle[0] == idle_key:
        d.unplaced.update(idle[1])
        return
    # A long queue is looked at one window per round. A window where nothing could be
    # placed says nothing of the next, so go on to the next at once, on the same figures
    # and snapshot (nothing changed), until something is placed, the whole queue has been
    # looked at, or `windows_per_round` windows were; only a whole queue with nothing
    # placed makes the round idle. (Else a 100,000-job queue took a window per wake-up.)
    parking = parked(state, snap, now, fit.version)
    d.unplaced.update(parking.why)
    # The queue positions of the jobs looked at: their keys list in C (the values view
    # walks in Python, and listing 70,000 ids took 16 ms a round where a window needs
    # 4,000); a window's ids come from the state's queue, which parking does not change.
    waiting = list(parking.looking.keys())
    cursor = state.memo.get("window_cursor", 0)
    rest = len(waiting) - config.window_jobs  # the rotating part: the head is in each
    covered = 0
    placed: tuple[Placement, ...] = ()
    for _ in range(config.windows_per_round if waiting else 0):
        orders, cursor = window(waiting, cursor, config.window_jobs)
        covered = len(waiting) if len(orders) == len(waiting) else covered + config.window_jobs
        looked = list(map(state.jobs.__getitem__, map(state.queue.__getitem__, orders)))
        # Jobs that can never fit the region as it is are set aside before admission:
        # counted in its look-ahead, or holding the line, they would block the rest.
        unfit = fit.never(looked, len(state.waiting))
        if unfit:
            park_unfit(parking, unfit, state)
            d.unplaced.update(unfit)
            looked = [j for j in looked if j.job_id not in unfit]
        why, placed, misfits, never = _place_window(
            state, nodes, snap, looked, d.pools, now, config
        )
        d.unplaced.update(why)
        park(parking, misfits, state, now, config, why)
        park_never(parking, never, state, why)
        if placed or covered >= rest:
            break
    state.memo["window_cursor"] = cursor
    if barred:
        # Those that wait might have fit there: say so, or the operator looks elsewhere.
        d.unplaced.update({j: f"{why}; not placed on: {barred}" for j, why in d.unplaced.items()})
    ports, no_ports = assign_ports(state, nodes, placed)
    if no_ports:
        d.unplaced.update(no_ports)
        placed = tuple(p for p in placed if p.job_id not in no_ports)
    for p in placed:
        t = state.tasks[p.task_id]
        d.events.append(
            TaskPlaced(
                t.job_id, p.task_id, t.attempt + 1, p.node_id, now, p.gpu_uuids,
                ports.get(p.task_id, {}),
            )
        )  # fmt: skip
    if not placed and covered >= rest:
        state.memo["placement_idle"] = (idle_key, dict(d.unplaced))


def _elastic_offers(
    state: RegionState, waiting: list[JobRecord], now: float, config: PlacementConfig
) -> tuple[list[JobRecord], dict[str, Resources], dict[str, str]]:
    """An elastic job waits in the queue with tasks it may not place now (above its
    target, or a grow not yet due): those jobs are left out of this window (why they
    wait), and the others are admitted for what `elastic.offer` allows, not for every
    waiting task."""
    if not state.elastic:
        return waiting, {}, {}
    keep, asks, resting = [], {}, {}
    for job in waiting:
        if job.job_id not in state.elastic:
            keep.append(job)
            continue
        o = elastic.offer(elastic.facts(job, now, config.resize_every_s))
        if not o.indexes:
            resting[job.job_id] = f"elastic: {o.why}"
            continue
        tasks = {t.index: t for t in job.tasks.values()}
        asks[job.job_id] = Resources.total([tasks[i].resources for i in o.indexes])
        keep.append(job)
    return keep, asks, resting


def _elastic_due(state: RegionState, now: float, config: PlacementConfig) -> frozenset[str]:
    """Waiting elastic jobs whose next resize is due: a new one makes a round that
    placed nothing worth running again (else a grow waits for the idle memo)."""
    out = []
    for job_id in state.elastic & state.waiting:
        changed = state.jobs[job_id].changed_at
        if changed is None or now >= changed + config.resize_every_s:
            out.append(job_id)
    return frozenset(out)


IDLE_S = 5.0  # how long a round with nothing to place stands while nothing changes


def _place_window(
    state: RegionState,
    nodes: ClusterView,
    snap: Snapshot,
    waiting: list[JobRecord],
    pools: PoolView,
    now: float,
    config: PlacementConfig,
) -> tuple[dict[str, str], tuple[Placement, ...], frozenset[str], frozenset[str]]:
    """Admission and placement for one window of the queue: why jobs wait, what placed,
    which admitted jobs were looked at and fit no node (none of their tasks placed, no
    gang holding the line in front of them), and which jobs can never be admitted as
    the pools stand."""
    waiting, asks, resting = _elastic_offers(state, waiting, now, config)
    admitted, blocked, never = admitted_jobs(state, pools, waiting, asks=asks)
    blocked.update(resting)
    if not admitted:
        return blocked, (), frozenset(), never
    placer = new_placer(state, snap, config)
    requests: dict[str, GangRequest] = {}  # made once a round, for both passes
    skip: frozenset[str] = frozenset()
    if blocked:
        # Admitted jobs that fit no node even before anything is placed would hold no
        # budget below: admit without them at once, and place them only to say why
        # (each fails at its first task). A backlog's windows were placed twice a round.
        looked = [j for j in waiting if j.job_id in admitted]
        skip = hopeless(placer, looked, now, config, requests)
        if skip:
            admitted, blocked, _ = admitted_jobs(state, pools, waiting, skip, asks)
            blocked.update(resting)
    result = place_jobs(
        state,
        nodes,
        [j for j in waiting if j.job_id in admitted or j.job_id in skip],
        now,
        config,
        snap,
        placer,
        requests,
    )
    misfits = frozenset(j for j in result.unplaced if j in admitted or j in skip)
    if misfits - skip and blocked and not result.line_held_by:
        # Admitted gangs that fit no node hold no budget: admit again without them,
        # so the jobs behind them in their pool can use what they could not.
        again, still_blocked, _ = admitted_jobs(state, pools, waiting, misfits, asks)
        if again - admitted:
            why = {j: result.unplaced[j] for j in misfits}
            jobs = [j for j in waiting if j.job_id in again]
            result = place_jobs(state, nodes, jobs, now, config, snap, requests=requests)
            blocked = {j: r for j, r in still_blocked.items() if j not in misfits} | why
            misfits = misfits | frozenset(j for j in result.unplaced if j in again)
    if result.line_held_by:
        misfits = frozenset()
    elif misfits:
        misfits = misfits - {p.job_id for p in result.placed}
    return {**blocked, **result.unplaced}, result.placed, misfits, never
