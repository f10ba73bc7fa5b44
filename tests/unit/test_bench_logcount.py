"""The placement bench's log counter reads entries as plain data: it must count what a
full decode of the same entries shows."""

from types import SimpleNamespace

from bench.placement import LogCount
from mesh.codec import encode
from mesh.schema import (
    JobSubmitted,
    LeaderElected,
    LogEntry,
    TaskPlaced,
    TaskState,
    TaskUpdated,
)


def _msg(entry) -> SimpleNamespace:
    return SimpleNamespace(data=encode(entry) if isinstance(entry, LogEntry) else entry)


async def test_counts_placements_running_submits_and_elections():
    events = (
        LeaderElected(2, "c1", 1.0),
        JobSubmitted("j1", "c-1", {"tasks": [{"role": "w"}]}, 1.0),
        JobSubmitted("j2", "c-2", {"tasks": [{"role": "w"}]}, 1.0),
        TaskPlaced("j1", "j1-w-0", 1, "n1", 2.0),
        TaskPlaced("j1", "j1-w-1", 1, "n2", 2.0),
        TaskPlaced("j2", "j2-w-0", 1, "n1", 2.0),
        TaskUpdated("j1", "j1-w-0", 1, TaskState.RUNNING, "n1", 3.0),
        TaskUpdated("j1", "j1-w-1", 1, TaskState.SUCCEEDED, "n2", 3.0),
        TaskUpdated("j2", "j2-w-0", 1, TaskState.RUNNING, "n1", 3.0),
    )
    count = LogCount()
    await count.on_msg(_msg(LogEntry(2, "c1", events)))
    assert (count.placed, count.running, count.elections) == (3, 2, 1)
    assert {job: len(at) for job, at in count.placed_at.items()} == {"j1": 2, "j2": 1}
    assert set(count.logged_at) == {"j1", "j2"}
    assert len(count.running_at) == 2
    assert count.last_placed > 0 and count.last_running > 0


async def test_bad_entries_count_nothing():
    count = LogCount()
    for data in (b"\xc1", encode([1, 2]), encode({"events": "x"}), encode({"events": [7, None]})):
        await count.on_msg(_msg(data))
    assert (count.placed, count.running, count.elections) == (0, 0, 0)
    assert not count.placed_at and not count.logged_at


def test_cpu_share_takes_the_span_between_samples():
    from bench.placement import cpu_share

    def at(leader, fleet):
        return {"leader": leader, "fleet": fleet}

    samples = [(0.0, at(1.0, 0.5)), (1.0, at(1.8, 0.7)), (2.0, at(2.6, 0.9)), (3.0, at(3.0, 1.0))]
    share = cpu_share(samples, 0.0, 1.5, tasks=1000)  # the end: the first sample at or after
    assert share["cpu_s"] == {"leader": 1.6, "fleet": 0.4}
    assert share["us_per_task"] == {"leader": 1600, "fleet": 400}
    assert share["cores"] == round(2.0 / 1.5, 2)
    assert cpu_share(samples, 0.0, 9.0, tasks=1000)["cpu_s"] == {"leader": 2.0, "fleet": 0.5}
    assert cpu_share(samples, 0.0, 1.5, tasks=0) == {}
    assert cpu_share([], 0.0, 1.5, tasks=10) == {}


def test_cpu_seconds_of_this_process_grow_and_a_gone_one_is_zero():
    import os
    import subprocess
    import sys

    from bench._util import cpu_seconds

    before = cpu_seconds(os.getpid(), children=False)
    sum(i * i for i in range(300_000))
    assert cpu_seconds(os.getpid(), children=False) > before
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert cpu_seconds(proc.pid) == 0.0
