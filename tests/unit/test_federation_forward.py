"""Where a submission is made (coordinator/federation/forward.py): here when the spec
names no region or names this one; else in the first region it names, unless the same
client id already made a job here (a retry is answered where the job is)."""

from __future__ import annotations

import pytest

from coordinator.federation.forward import route, with_home
from mesh.cli.jobs import went_elsewhere
from workloads.quantity import SpecError
from workloads.spec import parse_job_spec


def test_a_job_naming_no_region_or_this_one_is_made_here():
    assert route("eu", ()) is None
    assert route("eu", ("eu",)) is None
    assert route("eu", ("us", "eu")) is None  # named, if not first: home is where submitted


def test_a_job_not_naming_this_region_goes_to_the_first_it_names():
    assert route("eu", ("us",)) == "us"
    assert route("eu", ("us", "ap")) == "us"
    assert route("eu", ("ap", "us")) == "ap"  # the order is the preference


def test_the_forward_never_loops_its_target_makes_the_job():
    for regions in (("us",), ("us", "ap"), ("us", "eu")):
        target = route("eu", regions)
        if target is not None:
            assert route(target, regions) is None


def test_a_client_id_that_already_made_a_job_here_is_answered_here():
    assert route("eu", ("us",), made_here=True) is None


def test_a_bad_region_name_is_a_spec_error_not_a_subject():
    with pytest.raises(SpecError, match="regions\\[0\\]"):
        route("eu", ("a.b",))


def test_the_spec_field_is_what_the_route_reads():
    spec = parse_job_spec('name: x\nregions: [us, ap]\ntasks:\n- role: w\n  command: ["true"]\n')
    assert route("eu", spec.regions) == "us"
    assert route("ap", spec.regions) is None


def test_the_reply_says_where_the_job_is_and_errors_pass_as_they_came():
    reply = {"ok": True, "job_id": "x-1", "duplicate": True}
    assert with_home(reply, "us") == {**reply, "home": "us"}
    refused = {"ok": False, "error": {"code": "CONFLICT", "message": "other spec"}}
    assert with_home(refused, "us") == refused


def test_the_cli_line_names_the_region_and_how_to_ask_it():
    line = went_elsewhere("x-1", "us", "eu")
    assert "region us" in line and "not eu" in line
    assert "mesh --region us job status x-1" in line
