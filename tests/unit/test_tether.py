"""The pure parts of mesh.cli.tether: the reaper's line format and stop order, and
where the kernel's death signal is asked for."""

from __future__ import annotations

import sys
import threading

from mesh.cli.tether import Child, death_signal_preexec, stop_order


def test_a_child_line_round_trips_names_with_spaces_and_exact_start_times():
    child = Child("nats-server 1", 4242, 1733090000.123456)
    assert Child.parse(child.line()) == child


def test_agents_and_fleets_stop_before_the_server_they_report_to():
    kids = [
        Child("nats-server-1", 1, 1.0),
        Child("coordinator-1", 2, 1.0),
        Child("agent", 3, 1.0),
        Child("hollow", 4, 1.0),
    ]
    first, rest = stop_order(kids)
    assert [c.name for c in first] == ["agent", "hollow"]
    assert [c.name for c in rest] == ["nats-server-1", "coordinator-1"]


def test_the_death_signal_is_only_asked_for_from_the_main_thread():
    # prctl's death signal fires when the forking *thread* exits: a child spawned from a
    # worker thread would die with that thread, so only the reaper answers for it.
    from_thread = []
    t = threading.Thread(target=lambda: from_thread.append(death_signal_preexec()))
    t.start()
    t.join()
    assert from_thread == [None]
    assert (death_signal_preexec() is not None) == sys.platform.startswith("linux")
