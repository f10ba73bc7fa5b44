"""A deadline-ordered request queue shared by the baselines.

Two parallel lists consumed from a head index: O(1) append and pop at the head, O(log n)
search, and arrivals in deadline order (one SLO per model, the usual case) never shift
memory. Our router core inlines the same structure for speed.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right


class DeadlineQueue:
    """Requests ``(deadline_ns, id)`` in deadline order, oldest deadline first."""

    __slots__ = ("dl", "head", "ids")

    def __init__(self) -> None:
        self.dl: list[int] = []
        self.ids: list[int] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.dl) - self.head

    def push(self, deadline_ns: int, rid: int) -> None:
        dl = self.dl
        if len(dl) == self.head or deadline_ns >= dl[-1]:
            dl.append(deadline_ns)
            self.ids.append(rid)
        else:
            i = bisect_right(dl, deadline_ns, self.head)
            dl.insert(i, deadline_ns)
            self.ids.insert(i, rid)

    def head_deadline(self) -> int:
        return self.dl[self.head]

    def first_at_least(self, deadline_ns: int) -> int:
        """Offset from the head of the first request with deadline >= ``deadline_ns``."""
        return bisect_left(self.dl, deadline_ns, self.head) - self.head

    def deadline_at(self, offset: int) -> int:
        return self.dl[self.head + offset]

    def pop_head(self) -> int:
        rid = self.ids[self.head]
        self.head += 1
        self._maybe_compact()
        return rid

    def pop_n(self, n: int) -> tuple[int, ...]:
        h = self.head
        out = tuple(self.ids[h:h + n])
        self.head = h + len(out)
        self._maybe_compact()
        return out

    def _maybe_compact(self) -> None:
        h = self.head
        if h == len(self.dl):
            self.dl.clear()
            self.ids.clear()
            self.head = 0
        elif h > 4096 and 2 * h > len(self.dl):
            del self.dl[:h]
            del self.ids[:h]
            self.head = 0
