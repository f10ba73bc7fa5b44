"""Hierarchical resource pools: the tree, entitlement, admission and preemption choice.

Pure functions over frozen data (no I/O, no clock, no randomness); the coordinator's
async shell feeds them snapshots and applies what they decide. See docs/pools.md.

    tree = parse_pool_tree(yaml_text)                         # or PoolTree(specs)
    ent = compute_entitlement(tree, capacity, demand, allocation)
    decision = admit(tree, pending, ent, allocation, non_preemptible)
    victims, over_counts = choose_victims(tree, capacity, ent, running, demand,
                                          over_counts, cycles=5)

Amounts are :class:`workloads.resources.Resources` (cpu millicores, memory/disk bytes,
gpu milli-GPUs); pools govern those four kinds, not ``gpu_memory``.
"""

from coordinator.pools.admission import Admission, admit
from coordinator.pools.entitlement import (
    compute_entitlement,
    demand_by_pool,
    reservation_shortfall,
    sum_by_pool,
    wants,
)
from coordinator.pools.jobs import PendingJob, RunningJob
from coordinator.pools.preemption import (
    Victim,
    VictimChoice,
    any_over_entitlement,
    choose_victims,
)
from coordinator.pools.tree import (
    POOL_KINDS,
    ROOT,
    PoolConfigError,
    PoolSpec,
    PoolTree,
    PoolType,
    ResourceSpec,
    format_amount,
    parse_pool_tree,
)

__all__ = [
    "POOL_KINDS",
    "ROOT",
    "Admission",
    "PendingJob",
    "PoolConfigError",
    "PoolSpec",
    "PoolTree",
    "PoolType",
    "ResourceSpec",
    "RunningJob",
    "Victim",
    "VictimChoice",
    "admit",
    "any_over_entitlement",
    "choose_victims",
    "compute_entitlement",
    "demand_by_pool",
    "sum_by_pool",
    "format_amount",
    "parse_pool_tree",
    "reservation_shortfall",
    "wants",
]
