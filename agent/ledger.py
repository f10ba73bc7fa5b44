"""The reliability ledger: every run a node started, as the node itself saw it.

Why it exists: "nothing ran twice" must be checked against what the nodes did, not
against the job log, which only says what the coordinator heard (an event lost, or a
run the log never learnt of, is invisible there). Each node records each run it
starts, independently of the events it reports: (task, attempt, run, node, start,
end, outcome). `run` counts the in-place restarts of one attempt (1 for the first
process; a site agent cut off from its region restarts a failed task in place as 2,
3, ...: agent/autonomy.py).

`count_duplicates` is the one definition of a duplicate, used by the tests and the
benches (bench/chaos.py, bench/federation.py). A duplicate is:

- a run of a task started after one of that task's runs SUCCEEDED (any node, any
  attempt): the work was done and was done again;
- a second run of one (task, attempt, run): the same run started twice (a redelivered
  assignment run again, or one attempt on two nodes);
- two runs of one task overlapping in time (different attempts or nodes): two copies
  at once, whatever their outcome.

>>> a = Run("t1", 1, 1, "n1", 0.0, 5.0, "FAILED")
>>> b = Run("t1", 2, 1, "n2", 6.0, 9.0, "SUCCEEDED")
>>> count_duplicates([a, b]).total
0
>>> count_duplicates([a, b, Run("t1", 3, 1, "n1", 10.0, 11.0, "SUCCEEDED")]).after_success
(Run(task_id='t1', attempt=3, run=1, node_id='n1', start=10.0, end=11.0, outcome='SUCCEEDED'),)
>>> d = count_duplicates([a, Run("t1", 2, 1, "n2", 4.0, None, "")])
>>> len(d.overlapping), sorted(d.tasks)
(1, ['t1'])

`RunBook` is the recording side for the hollow fleet (memory, and optionally a
JSON-lines file so that a fleet process killed with SIGKILL leaves its ledger behind);
the real agent keeps its runs in its SQLite store (agent/store.py, table `runs`).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO

__all__ = ["Duplicates", "Run", "RunBook", "count_duplicates", "read_runs"]

DROPPED = "DROPPED"  # a run that ended unreported: its node crashed or was stopped


@dataclass(frozen=True, slots=True)
class Run:
    """One process (or simulated run) of one attempt of one task on one node.

    `end` None: still running as far as the record goes (a node killed mid-run leaves
    such rows; a reader closes them at the time it knows the node died). `outcome`:
    "SUCCEEDED", "FAILED", "KILLED", DROPPED, or "" while running."""

    task_id: str
    attempt: int
    run: int
    node_id: str
    start: float
    end: float | None = None
    outcome: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Run:
        return cls(
            str(d["task_id"]),
            int(d["attempt"]),
            int(d["run"]),
            str(d["node_id"]),
            float(d["start"]),
            None if d.get("end") is None else float(d["end"]),
            str(d.get("outcome") or ""),
        )


@dataclass(frozen=True, slots=True)
class Duplicates:
    """What `count_duplicates` found, each kind apart (a run is named once per kind)."""

    after_success: tuple[Run, ...] = ()  # runs started after their task had succeeded
    repeated: tuple[Run, ...] = ()  # second and later runs of one (task, attempt, run)
    overlapping: tuple[tuple[Run, Run], ...] = ()  # pairs of one task's runs at once

    @property
    def total(self) -> int:
        return len(self.after_success) + len(self.repeated) + len(self.overlapping)

    @property
    def tasks(self) -> frozenset[str]:
        """The tasks with any duplicate (what "tasks run twice" counts)."""
        found = {r.task_id for r in (*self.after_success, *self.repeated)}
        found.update(a.task_id for a, _ in self.overlapping)
        return frozenset(found)

    def summary(self) -> dict:
        return {
            "tasks": len(self.tasks),
            "after_success": len(self.after_success),
            "repeated": len(self.repeated),
            "overlapping": len(self.overlapping),
        }


def _end(r: Run) -> float:
    return float("inf") if r.end is None else r.end


def _order(r: Run) -> tuple:
    return (r.start, _end(r), r.attempt, r.run, r.node_id, r.outcome)


def count_duplicates(runs: Iterable[Run]) -> Duplicates:
    """The duplicates among `runs` (the module docstring says what counts). Pure: the
    order of `runs` does not matter. Two runs of one (task, attempt, run) are counted
    as `repeated` only, not also as overlapping."""
    by_task: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_task[r.task_id].append(r)
    after: list[Run] = []
    repeated: list[Run] = []
    overlapping: list[tuple[Run, Run]] = []
    for tid in sorted(by_task):
        rs = sorted(by_task[tid], key=_order)
        done = [r.end for r in rs if r.outcome == "SUCCEEDED" and r.end is not None]
        if done:
            first = min(done)
            after.extend(r for r in rs if r.start >= first)
        seen: set[tuple[int, int]] = set()
        for r in rs:
            key = (r.attempt, r.run)
            if key in seen:
                repeated.append(r)
            seen.add(key)
        for i, a in enumerate(rs):
            for b in rs[i + 1 :]:
                if b.start >= _end(a):
                    break  # sorted by start: no later run overlaps `a` either
                if (a.attempt, a.run) != (b.attempt, b.run):
                    overlapping.append((a, b))
    return Duplicates(tuple(after), tuple(repeated), tuple(overlapping))


class RunBook:
    """A fleet's ledger: `started`/`ended` as its runs begin and end, `runs()` for all.

    With `path`, each start and end is also appended to that file as a JSON line and
    flushed (not fsynced: a SIGKILL of the process keeps what the OS was handed), so a
    bench that kills the fleet still reads every run it began (`read_runs`)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._runs: list[Run] = []
        self._open: dict[tuple[str, str, int], int] = {}  # (node, task, attempt) -> index
        self._file: IO[str] | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (lives with the book)

    def started(
        self, task_id: str, attempt: int, node_id: str, ts: float | None = None, run: int = 1
    ) -> None:
        r = Run(task_id, attempt, run, node_id, time.time() if ts is None else ts)
        self._open[(node_id, task_id, attempt)] = len(self._runs)
        self._runs.append(r)
        self._write(r.to_json())

    def ended(
        self, task_id: str, attempt: int, node_id: str, outcome: str, ts: float | None = None
    ) -> None:
        """Close the node's open run of (task, attempt); nothing if none is open."""
        i = self._open.pop((node_id, task_id, attempt), None)
        if i is None:
            return
        r = self._runs[i]
        end = time.time() if ts is None else ts
        self._runs[i] = replace(r, end=end, outcome=outcome)
        row = {"task_id": task_id, "attempt": attempt, "run": r.run, "node_id": node_id}
        self._write(row | {"end": end, "outcome": outcome})

    def dropped(self, node_id: str, keys: Iterable[tuple[str, int]]) -> None:
        """Runs that ended unreported (a crash, a shutdown): (task, attempt) keys."""
        for task_id, attempt in keys:
            self.ended(task_id, attempt, node_id, DROPPED)

    def runs(self) -> list[Run]:
        return list(self._runs)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, row: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()


def read_runs(path: str | os.PathLike[str], closed_at: float | None = None) -> list[Run]:
    """The runs a RunBook file holds. A run with no end line (its process was killed)
    ends at `closed_at` as DROPPED when given (when the reader knows the process died),
    else stays open. A torn last line (killed mid-write) is skipped."""
    runs: list[Run] = []
    where: dict[tuple[str, str, int, int], int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            key = (row["node_id"], row["task_id"], int(row["attempt"]), int(row["run"]))
            if "start" in row:
                where[key] = len(runs)
                runs.append(Run.from_json(row))
            elif key in where:
                i = where.pop(key)
                runs[i] = replace(runs[i], end=float(row["end"]), outcome=str(row["outcome"]))
    if closed_at is not None:
        runs = [
            r if r.end is not None else replace(r, end=max(r.start, closed_at), outcome=DROPPED)
            for r in runs
        ]
    return runs
