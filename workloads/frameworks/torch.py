"""Placeholder for the pytorch and pytorch-elastic adapters (the torch helper's file)."""

from __future__ import annotations

from workloads.frameworks import Launch, TaskContext
from workloads.spec import JobSpec, TaskGroup


def pytorch(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    raise NotImplementedError("framework: pytorch")


def pytorch_elastic(spec: JobSpec, group: TaskGroup, ctx: TaskContext) -> Launch:
    raise NotImplementedError("framework: pytorch-elastic")


def ports_for(spec: JobSpec, group: TaskGroup, index: int) -> tuple[str, ...]:
    return ()


def rendezvous(spec: JobSpec) -> tuple[str, int] | None:
    return None


def primary(spec: JobSpec) -> tuple[str, int] | None:
    return None
