"""Where the replica-based baselines (Triton, Ray Serve) put each model's replicas.

Triton and Ray Serve do not decide placement by themselves: an operator (or an
autoscaler) does. Putting every model on every GPU is the worst case for them -- each GPU
then interleaves tiny batches of every model -- so we give them what a sensible operator
would do with the same mean rates Nexus plans from: replicas in proportion to each
model's share of the load (at least one), each placed on the GPU with the least load
so far that does not already host that model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def proportional_replicas(models: Sequence[str], n_gpus: int,
                          rates: Mapping[str, float] | None) -> list[list[int]]:
    """For each model (in order), the GPU indices hosting a replica of it.

    Without rates, every model is on every GPU.
    """
    if not rates:
        return [list(range(n_gpus)) for _ in models]
    total = sum(max(0.0, rates.get(m, 0.0)) for m in models) or 1.0
    load = [0.0] * n_gpus
    hosts: list[list[int]] = [[] for _ in models]
    order = sorted(range(len(models)), key=lambda i: (-rates.get(models[i], 0.0), i))
    for i in order:
        share = max(0.0, rates.get(models[i], 0.0)) / total
        k = min(n_gpus, max(1, round(share * n_gpus)))
        per_replica = share / k
        for _ in range(k):
            g = min((j for j in range(n_gpus) if j not in hosts[i]), key=lambda j: (load[j], j))
            hosts[i].append(g)
            load[g] += per_replica
    for h in hosts:
        h.sort()
    return hosts
