"""Named ports for placed tasks, picked by the coordinator in the placement decision.

Peers must know each other's ports before any of them starts, and the placement is the
one decision that sees them all (Nomad's model; docs/training.md). A port is picked from
its node's range (`NodeState.port_range`), never one a holding task has on the same
*address*: several agents may share a host, and their ranges with it. The walk starts at
an offset hashed from the task id and attempt (crc32: the same on every candidate and
every run, unlike `hash()`), so a retry after a clash (the agent found a port taken by
something outside Mesh) tries other ports. Pure.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from workloads import frameworks

if TYPE_CHECKING:
    from coordinator.cluster import ClusterView
    from coordinator.placement import Placement
    from coordinator.state import RegionState

NO_RANGE = (0, 0)


class NoPorts(Exception):
    """The node cannot give the task the ports it asks for; the message says why."""


def range_size(port_range: tuple[int, int]) -> int:
    lo, hi = port_range
    return 0 if tuple(port_range) == NO_RANGE or hi < lo else hi - lo + 1


def describe(port_range: tuple[int, int]) -> str:
    """Why a node with this range and too few free ports is turned away."""
    if range_size(port_range) == 0:
        return "offers no ports"
    lo, hi = port_range
    return f"no free ports in {lo}-{hi}"


def pick(
    names: Sequence[str], port_range: tuple[int, int], used: set[int], key: str
) -> dict[str, int]:
    """One distinct port per name, none in `used`, all within `port_range` (inclusive);
    the same arguments give the same ports. Raises NoPorts when the range has too few
    free ports (or none at all: (0, 0))."""
    if not names:
        return {}
    if len(set(names)) != len(names):
        raise ValueError(f"ports: names repeat in {list(names)}")
    size = range_size(port_range)
    lo = port_range[0]
    free = size - sum(1 for p in used if lo <= p < lo + size) if size else 0
    if free < len(names):
        raise NoPorts(describe(port_range))
    start = zlib.crc32(key.encode()) % size
    out: dict[str, int] = {}
    taken: set[int] = set()
    k = 0
    for name in names:
        while True:
            port = lo + (start + k) % size
            k += 1
            if port not in used and port not in taken:
                break
        out[name] = port
        taken.add(port)
    return out


def free_count(port_range: tuple[int, int], held: Iterable[int]) -> int:
    """How many ports of the range are not in `held`."""
    size = range_size(port_range)
    if not size:
        return 0
    lo = port_range[0]
    return size - len({p for p in held if lo <= p < lo + size})


def used_by_address(
    node_ports: Mapping[str, Mapping[str, tuple[int, ...]]],
    address_of: Mapping[str, str],
) -> tuple[dict[str, set[int]], set[int]]:
    """The ports holding tasks have, per address: `node_ports` is the fold's node ->
    task -> ports, `address_of` node -> address (the cluster view's heartbeats). The
    second set: the ports held on nodes whose address is not known (a new leader that
    has not heard them yet), counted as used on every address, so a leader that
    restarts never gives out a port a running task holds."""
    by_address: dict[str, set[int]] = {}
    anywhere: set[int] = set()
    for node_id, tasks in node_ports.items():
        address = address_of.get(node_id)
        into = anywhere if address is None else by_address.setdefault(address, set())
        for ports in tasks.values():
            into.update(ports)
    return by_address, anywhere


def assign(
    state: RegionState, cluster: ClusterView, placed: Sequence[Placement]
) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """The ports of a round's placements (task id -> name -> port; the attempt each is
    placed at is the task's next), and the jobs none of whose placements stand this
    round, with why (job id -> why): a node that had too few free ports on its address
    (placement filters by the node's own holding tasks; agents sharing a host are
    counted here). Ports of the same round are told apart: each is added to its
    address's used set as it is picked."""
    asks = []
    for p in placed:
        t = state.tasks[p.task_id]
        names = frameworks.ports_for(state.jobs[t.job_id].spec, t.group, t.index)
        if names:
            asks.append((p, t.attempt + 1, names))
    if not asks:
        return {}, {}
    # (a node the leader only `expect`s, never heard, has a placeholder of seq 0)
    address_of = {
        n: v.state.address
        for n in state.node_ports
        if (v := cluster.nodes.get(n)) is not None and v.state.seq
    }
    used, anywhere = used_by_address(state.node_ports, address_of)
    out: dict[str, dict[str, int]] = {}
    failed: dict[str, str] = {}
    for p, attempt, names in asks:
        if p.job_id in failed:
            continue
        st = cluster.nodes[p.node_id].state
        at = used.setdefault(st.address, set())
        try:
            taken = at | anywhere if anywhere else at
            got = pick(names, st.port_range, taken, f"{p.task_id}:{attempt}")
        except NoPorts as exc:
            failed[p.job_id] = f"node {p.node_id} {exc}; placing again"
            continue
        at.update(got.values())
        out[p.task_id] = got
    return out, failed
