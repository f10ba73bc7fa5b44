"""The federation shell's pure parts: the spec fields, the wire encoding of the core's
messages, and the fold of the federation's log events (a job away leaves its home's
queue and comes back; a held job's origin; a guest never spills on)."""

from __future__ import annotations

import pytest

from coordinator.federation.epochs import Phase, new_job, nominate
from coordinator.federation.fold import hold_event, hold_of, home_event, policy_of
from coordinator.federation.holder import Hold, HolderRecord
from coordinator.federation.link import to_core, to_wire
from coordinator.federation.messages import (
    Admitted,
    Confirm,
    Finished,
    GaveUp,
    Nominate,
    Refused,
    Revoke,
)
from coordinator.federation.model import FedPolicy
from coordinator.state import RegionState
from coordinator.views import job_federation
from mesh.codec import WireError, encode
from mesh.fedschema import FedMessage, decode_fed
from mesh.schema import FedHomeRecorded, JobSubmitted, LogEntry
from workloads.lifecycle import JobState
from workloads.quantity import SpecError
from workloads.spec import parse_job_spec

BASE = {"name": "j", "tasks": [{"role": "w", "command": ["true"]}]}


def spec(**fed):
    return parse_job_spec({**BASE, **fed})


# ------------------------------------------------------------------ spec fields


def test_spec_fields_parse_build_the_policy_and_round_trip():
    s = spec(regions=["eu", "us"], spill={"after": "30s"}, lost_after="10m")
    assert (s.regions, s.spill_after_s, s.lost_after_s) == (("eu", "us"), 30.0, 600.0)
    assert policy_of(s) == FedPolicy(("eu", "us"), 30.0, 600.0)
    assert parse_job_spec(s.to_dict()) == s


def test_a_spec_naming_no_regions_is_as_before():
    s = spec()
    assert (s.regions, s.spill_after_s, s.lost_after_s) == ((), None, None)
    assert not {"regions", "spill", "lost_after"} & set(s.to_dict())
    assert spec(regions=["eu"], spill="never", lost_after="never").spill_after_s is None


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"regions": "eu"}, "regions"),
        ({"regions": ["eu", "eu"]}, "regions[1]"),
        ({"regions": ["e.u"]}, "regions[0]"),
        ({"regions": ["fed"]}, "regions[0]"),
        ({"regions": ["eu"], "spill": "soon"}, "spill"),
        ({"regions": ["eu"], "spill": {"afterwards": "1s"}}, "spill.afterwards"),
        ({"regions": ["eu"], "spill": {}}, "spill.after"),
        ({"regions": ["eu"], "spill": {"after": "-1s"}}, "spill.after"),
        ({"spill": {"after": "1s"}}, "spill"),
        ({"lost_after": 0}, "lost_after"),
        ({"lost_after": "400d"}, "lost_after"),
    ],
)
def test_bad_spec_fields_name_the_field(fields, where):
    with pytest.raises(SpecError) as err:
        spec(**fields)
    assert str(err.value).startswith(where + ":") or err.value.field == where


# ------------------------------------------------------------------ wire


SPEC = spec(regions=["eu", "us"], spill={"after": 1}).to_dict()
MESSAGES = [
    Nominate("j", 1, "eu", "us"),
    Confirm("j", 1, "eu", "us"),
    Revoke("j", 1, "eu", "us", "timed out"),
    Admitted("j", 1, "eu", "us", running=True),
    Refused("j", 1, "eu", "us", "no room"),
    GaveUp("j", 1, "eu", "us", "drained"),
    Finished("j", 1, "eu", "us", "SUCCEEDED"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_core_messages_cross_the_wire_unchanged(msg):
    wire = to_wire(msg, SPEC)
    back = decode_fed(encode(wire))
    assert to_core(back) == msg
    assert (back.spec is not None) == isinstance(msg, Nominate | Confirm)


@pytest.mark.parametrize(
    "bad",
    [
        FedMessage("nominate", "j", 1, "eu", "us"),  # no spec
        FedMessage("revoke", "j", 1, "eu", "eu"),  # to itself
        FedMessage("revoke", "j", 1, "e.u", "us"),  # not a region name
    ],
)
def test_bad_messages_raise_wire_error(bad):
    with pytest.raises(WireError):
        decode_fed(encode(bad))
    with pytest.raises(WireError):
        decode_fed(b"\x93garbage")


# ------------------------------------------------------------------ fold


def submitted(state, job_id, seq, **fed):
    entry = LogEntry(1, "c", (JobSubmitted(job_id, job_id, {**BASE, **fed}, 1.0),))
    state.apply(seq, entry)


def test_a_job_away_leaves_the_home_queue_and_comes_back():
    state = RegionState()
    submitted(state, "a", 1, regions=["eu", "us"], spill={"after": 1})
    assert "a" in state.federated and "a" in state.waiting
    rec = nominate(new_job("a", "eu", policy_of(state.jobs["a"].spec), 1.0), "us", 2.0).record
    state.apply(2, LogEntry(1, "c", (home_event(rec, "nominated us", 2.0),)))
    assert "a" not in state.waiting and not state.queue and state.jobs["a"].away
    assert state.pool_pending == {}
    assert job_federation(state, "eu", "a")["region"] == "us"
    back = FedHomeRecorded("a", "eu", "local", 2, "", 3.0, 1.0, ("us",), 3.0)
    state.apply(3, LogEntry(1, "c", (back,)))
    assert "a" in state.waiting and not state.jobs["a"].away and state.pool_pending
    done = FedHomeRecorded("a", "eu", "done", 3, "us", 4.0, 1.0, (), None, "SUCCEEDED")
    state.apply(4, LogEntry(1, "c", (done,)))
    assert state.jobs["a"].state == JobState.SUCCEEDED and "a" not in state.waiting
    assert state.job_counts.get("SUCCEEDED") == 1


def test_a_job_held_for_another_region_shows_its_origin_and_never_spills_on():
    state = RegionState()
    rec = HolderRecord("g", "eu", "us", 2, Hold.RUNNING, 5.0)
    event = hold_event(rec, "confirmed", 5.0)
    assert hold_of(event) == rec
    guest = JobSubmitted(
        "g", "fed:eu:g:2", {**BASE, "regions": ["eu", "us"], "spill": {"after": 1}}
    )
    state.apply(1, LogEntry(1, "c", (event, guest)))
    assert "g" in state.jobs and "g" not in state.federated
    assert job_federation(state, "us", "g") == {
        "origin": "eu",
        "epoch": 2,
        "hold": "running",
        "note": "",
    }


def test_the_logs_phases_are_the_cores():
    from mesh.schema import FED_HOLD_PHASES, FED_HOME_PHASES

    assert FED_HOME_PHASES == tuple(str(p) for p in Phase)
    assert FED_HOLD_PHASES == tuple(str(h) for h in Hold)
