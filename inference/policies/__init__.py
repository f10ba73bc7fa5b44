"""The scheduling policies the simulator compares, all behind ``decisions.Policy``.

``ours`` is ``inference.router_core.RouterCore``; the baselines re-implement what each
system does, as described in shared/research/inference.md and docs/inference.md.
``make_policy`` builds any of them by name from the same models, GPUs and seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from inference.decisions import Gpu, ModelSpec, Policy
from inference.policies.clockwork import Clockwork
from inference.policies.eager_edf import EagerEdf
from inference.policies.nexus import Nexus
from inference.policies.rayserve import RayServe
from inference.policies.triton import Triton
from inference.router_core import RouterConfig, RouterCore

POLICIES = ("ours", "eager_edf", "nexus", "clockwork", "rayserve", "triton")
"""The policies of the comparison, ours first."""

EXTRA_POLICIES = ("ours_frontrun", "ours_strict", "clockwork_all")
"""Ablations: ours with no grant window (Symphony's dispatcher as published: a batch
waits for its frontrun exactly); ours dropping only the hopeless (no window drop);
Clockwork allowed every batch size, not just the powers of two it compiles."""


def make_policy(name: str, models: Sequence[ModelSpec], gpus: Sequence[Gpu], *, seed: int = 0,
                rates: Mapping[str, float] | None = None) -> Policy:
    """Build policy ``name``. ``rates`` (mean req/s per model) is what Nexus plans from
    and what sizes Triton's and Ray's replicas; ``seed`` feeds the only policy that
    draws random numbers (Ray's two choices)."""
    if name == "ours":
        return RouterCore(models, gpus)
    if name == "ours_frontrun":
        core = RouterCore(models, gpus, RouterConfig(grant_window=0.0))
        core.name = name
        return core
    if name == "ours_strict":
        core = RouterCore(models, gpus, RouterConfig(drop_policy="strict"))
        core.name = name
        return core
    if name == "eager_edf":
        return EagerEdf(models, gpus)
    if name == "nexus":
        if rates is None:
            raise ValueError("nexus plans from per-model rates; pass rates=")
        return Nexus(models, gpus, rates=rates)
    if name == "clockwork":
        return Clockwork(models, gpus)
    if name == "clockwork_all":
        return Clockwork(models, gpus, batch_sizes="all")
    if name == "rayserve":
        return RayServe(models, gpus, rng=random.Random(seed), rates=rates)
    if name == "triton":
        return Triton(models, gpus, rates=rates)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES + EXTRA_POLICIES)}")


__all__ = ["EXTRA_POLICIES", "POLICIES", "make_policy"]
