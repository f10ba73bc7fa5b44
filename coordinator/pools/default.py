"""The default pool: where a job that names no pool goes once pools are defined. Pure.

A job's `pool` defaults to `/`. While no pool tree has been applied, `/` is the only
pool, a leaf, and such jobs run there. Once a tree is applied, `/` has children and
takes no jobs, so a job that named no pool (the README's `hello.yaml`, every job
`mesh load` generates) was refused with `pool: / has child pools`. So the tree as
applied always has a leaf `/default` (added, with no settings, when the file does not
define it), and a job whose pool is `/` goes to `/default` whenever `/` has children.
A file may define `/default` itself (its reservation, limit, share, type), but not give
it children: it must stay a leaf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coordinator.pools.tree import ROOT, PoolConfigError, PoolSpec, PoolTree

__all__ = ["DEFAULT_POOL", "job_pool", "with_default_pool"]

DEFAULT_POOL = "/default"


def with_default_pool(tree: PoolTree, source: Mapping[str, Any]) -> tuple[PoolTree, Mapping]:
    """The tree (and its document) as `pool apply` applies it: with a leaf `/default`.
    Raises PoolConfigError if the document gives `/default` children."""
    if DEFAULT_POOL in tree:
        if not tree.is_leaf(DEFAULT_POOL):
            raise PoolConfigError(
                [
                    (
                        DEFAULT_POOL,
                        "must be a leaf: it is where jobs that name no pool go "
                        f"(children: {', '.join(tree.children(DEFAULT_POOL))})",
                    )
                ]
            )
        return tree, source
    pools = {**source["pools"], DEFAULT_POOL: {}}
    return PoolTree((*tree.specs, PoolSpec(DEFAULT_POOL))), {**source, "pools": pools}


def job_pool(tree: PoolTree, pool: str) -> str:
    """The pool a job submitted to `pool` goes to: `/` means `/default` once `/` has
    children (and the tree has a `/default`); any other pool is itself."""
    if pool == ROOT and not tree.is_leaf(ROOT) and DEFAULT_POOL in tree:
        return DEFAULT_POOL
    return pool
