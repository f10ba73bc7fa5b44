"""A task's `TaskContext`: who its peers are as the job is placed now. Pure.

The leader builds each run's argv, env and files with `workloads.frameworks.launch` at
the moment it sends the run (docs/training.md), from the state and the cluster view: a
gang is placed in one decision, so every peer is known by then; an elastic job's extra
workers are placed later, when its rendezvous task is placed already.
"""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.cluster import NodeView
from coordinator.records import HOLDING, JobRecord, TaskRecord
from coordinator.state import RegionState
from mesh.schema import HealthProbe, TaskSpec
from workloads import frameworks
from workloads.frameworks import Peer, TaskContext


class AddressUnknown(Exception):
    """A peer's node has not been heard by this leader yet (a new leader's first
    moments), or advertises no address: the run is sent once its address is known."""


def peers_of(job: JobRecord, nodes: Mapping[str, NodeView]) -> tuple[Peer, ...]:
    """The job's holding tasks (PLACED, STARTING, RUNNING), in the spec's group order
    and then by index, each with its node's address and the ports it was given."""
    order = {g.role: k for k, g in enumerate(job.spec.tasks)}
    holding = sorted(
        (t for t in job.tasks.values() if t.state in HOLDING),
        key=lambda t: (order.get(t.role, len(order)), t.role, t.index),
    )
    out = []
    for t in holding:
        view = nodes.get(t.node_id)
        if view is None or not view.state.seq or not view.state.address:
            why = "advertises no address" if view and view.state.seq else "not heard yet"
            raise AddressUnknown(f"node {t.node_id} of task {t.task_id}: {why}")
        ports = tuple(sorted(t.ports.items()))
        out.append(Peer(t.role, t.index, view.state.address, ports, t.node_id))
    return tuple(out)


def context(
    job: JobRecord, task: TaskRecord, nodes: Mapping[str, NodeView], peers=None
) -> TaskContext:
    """`task`'s context (it must be holding: it is among its peers). `peers`: the job's
    `peers_of`, when the caller made them already for another of its tasks."""
    if peers is None:
        peers = peers_of(job, nodes)
    return TaskContext(job.job_id, task.role, task.index, job.generation, peers)


def launches(job: JobRecord, task: TaskRecord) -> bool:
    """Whether `task`'s run is made by its framework's adapter: a training job's, or a
    batch task given named ports (which it learns from MESH_PORT_*). Plain batch runs
    share one TaskSpec per group (a 5,000-node region sends thousands a round)."""
    return job.spec.framework != "batch" or bool(task.ports)


def launched_spec(
    job: JobRecord,
    task: TaskRecord,
    nodes: Mapping[str, NodeView],
    probe: HealthProbe | None = None,
    peers: dict[str, tuple[Peer, ...]] | None = None,
) -> TaskSpec:
    """`task`'s run: argv, env and files from its framework's adapter, its ports.
    `peers`: per job, the peers made so far in this send (filled in here)."""
    known = None if peers is None else peers.get(job.job_id)
    if known is None:
        known = peers_of(job, nodes)
        if peers is not None:
            peers[job.job_id] = known
    g = task.group
    run = frameworks.launch(job.spec, g, context(job, task, nodes, known))
    return TaskSpec(
        argv=run.argv,
        env=dict(run.env),
        workdir=g.workdir,
        resources=g.resources,
        simulate=g.simulate,
        max_run_time_s=job.spec.max_run_time_s,
        gpu_uuids=task.gpu_uuids,
        health=probe,
        ports=dict(task.ports),
        files=dict(run.files),
    )


def launchable(
    state: RegionState, batches: list[list[TaskRecord]], nodes: Mapping[str, NodeView]
) -> tuple[list[list[TaskRecord]], dict[tuple[str, int], str]]:
    """The batches less the runs whose peers' addresses are not known yet, and those
    runs ((task, attempt) -> why), to be sent once they are."""
    judged: dict[str, str] = {}  # job -> "" (known) or why not
    out = []
    waiting: dict[tuple[str, int], str] = {}
    for batch in batches:
        keep = []
        for t in batch:
            job = state.jobs[t.job_id]
            if not launches(job, t):
                keep.append(t)
                continue
            why = judged.get(job.job_id)
            if why is None:
                try:
                    peers_of(job, nodes)
                    why = ""
                except AddressUnknown as exc:
                    why = str(exc)
                judged[job.job_id] = why
            if why:
                waiting[(t.task_id, t.attempt)] = why
            else:
                keep.append(t)
        if keep:
            out.append(keep)
    return out, waiting
