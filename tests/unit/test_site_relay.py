"""The site link's relay rule (edge/cursor.py): a site node's heartbeat goes on to the
region when it changed in what the region acts on, or a relay period after the last."""

from __future__ import annotations

from edge.cursor import ACTED_ON, acted_on, relay_due

BASE = {
    "node_id": "n1",
    "seq": 1,
    "ts": 100.0,
    "tasks": ["t#1"],
    "capacity": {"cpu": 4000},
    "labels": {},
    "refusing": "",
    "verify_key": "",
    "note": "",
    "site": "s1",
    "load1": 0.5,
    "cpu_percent": 3.0,
}


def test_the_first_heartbeat_is_relayed():
    assert relay_due(None, acted_on(BASE), 0.0, 30.0)


def test_load_and_time_alone_wait_for_the_relay_period():
    last = (10.0, acted_on(BASE))
    later = {**BASE, "seq": 9, "ts": 108.0, "load1": 3.0, "cpu_percent": 90.0}
    assert not relay_due(last, acted_on(later), 39.9, 30.0)
    assert relay_due(last, acted_on(later), 40.0, 30.0)


def test_each_field_the_region_acts_on_is_relayed_at_once():
    last = (10.0, acted_on(BASE))
    changes = {
        "tasks": [],
        "capacity": {"cpu": 2000},
        "labels": {"a": "b"},
        "refusing": "root",
        "verify_key": "k1",
        "note": "store recovered",
        "site": "s2",
    }
    assert set(changes) == set(ACTED_ON)
    for field, value in changes.items():
        assert relay_due(last, acted_on({**BASE, field: value}), 10.1, 30.0), field
