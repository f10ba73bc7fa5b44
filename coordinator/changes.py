"""Which keys changed since a reader last looked: a journal for per-round work that
should cost what changed, not what exists.

A 5,000-node region has every node in its snapshot and heartbeats from all of them,
but between two reconcile rounds only a few hundred nodes heartbeat or have tasks
placed on them. Each reader keeps a `Mark` (where it stopped reading) and asks for
the keys added since; a reader too far behind (the journal was trimmed past its
mark) or holding a mark of another journal gets None and must look at everything.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

KEEP = 100_000  # keys kept before the journal is trimmed (readers read every round)


@dataclass(frozen=True, slots=True)
class Mark:
    journal: Changes
    position: int


class Changes:
    def __init__(self, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._keep = keep
        self._keys: list[Hashable] = []
        self._base = 0  # position of _keys[0]

    def add(self, key: Hashable) -> None:
        if len(self._keys) >= self._keep:
            # Trimmed before adding, so a reader that had read everything still sees
            # this key; readers further behind are told to look at everything.
            self._base += len(self._keys)
            self._keys = []
        self._keys.append(key)

    def mark(self) -> Mark:
        return Mark(self, self._base + len(self._keys))

    def since(self, mark: Mark | None) -> set[Hashable] | None:
        """The keys added after `mark`; None if that is not known (no mark, a mark of
        another journal, or one older than what is kept)."""
        if mark is None or mark.journal is not self or mark.position < self._base:
            return None
        return set(self._keys[mark.position - self._base :])
