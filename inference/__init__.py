"""Inference routing: latency profiles, the deadline-aware router core, its simulator.

The decision core (``RouterCore``) is pure: requests, GPU free times and the clock go in,
``Dispatch``/``Drop`` decisions come out. The NATS router/worker shell applies them;
``inference.sim`` runs it and the baselines in ``inference.policies`` on the same inputs.
See README.md beside this file and docs/inference.md.
"""

from inference.decisions import (
    Decision,
    Dispatch,
    Drop,
    DropReason,
    Gpu,
    ModelSpec,
    Policy,
    Request,
)
from inference.profile import (
    RESNET50_V100,
    SOURCED_PROFILES,
    SYMPHONY_HARNESS,
    VGG16_TITANX,
    LatencyProfile,
)
from inference.router_core import RouterConfig, RouterCore, target_batch

__all__ = [
    "RESNET50_V100",
    "SOURCED_PROFILES",
    "SYMPHONY_HARNESS",
    "VGG16_TITANX",
    "Decision",
    "Dispatch",
    "Drop",
    "DropReason",
    "Gpu",
    "LatencyProfile",
    "ModelSpec",
    "Policy",
    "Request",
    "RouterConfig",
    "RouterCore",
    "target_batch",
]
