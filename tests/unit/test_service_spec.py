"""`kind: service` job specs: their own fields, validated field by field, and the batch
fields that make no sense for a service refused by name."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.quantity import SpecError
from workloads.spec import (
    HealthCheck,
    JobSpec,
    PlacementPolicy,
    RestartPolicy,
    TaskGroup,
    UpdatePolicy,
    parse_job_spec,
)

SERVICE = """
name: web
kind: service
partition: stateless
restart: {backoff: 2s, max_backoff: 30s}
update: {max_unavailable: 1, max_surge: 2}
health: {command: "curl -sf localhost:8080/health", interval: 5s, timeout: 2s,
         healthy_after: 2, unhealthy_after: 4}
tasks:
  - role: web
    count: 3
    command: python -m http.server 8080
"""


def test_a_service_spec_parses_and_round_trips():
    spec = parse_job_spec(SERVICE)
    assert spec.kind == "service" and spec.is_service
    assert spec.partition == "stateless"
    assert spec.restart == RestartPolicy(0, True, 2.0, 30.0)
    assert spec.update == UpdatePolicy(max_unavailable=1, max_surge=2)
    assert spec.health == HealthCheck(
        ("/bin/sh", "-c", "curl -sf localhost:8080/health"), 5.0, 2.0, 2, 4
    )
    assert spec.placement.gang is False  # each replica placed on its own
    assert parse_job_spec(spec.to_dict()) == spec


def test_defaults_of_a_service_and_of_a_batch_job():
    svc = parse_job_spec({"name": "s", "kind": "service", "tasks": [{"role": "a", "command": "x"}]})
    assert svc.update == UpdatePolicy(0, 1)
    assert svc.health is None
    assert (svc.restart.backoff_s, svc.restart.max_backoff_s) == (1.0, 60.0)
    assert svc.partition == "" and svc.placement_partition == "stateless"
    batch = parse_job_spec({"name": "b", "tasks": [{"role": "a", "command": "x"}]})
    assert batch.kind == "batch" and batch.placement_partition == "batch"
    assert batch.placement.gang is True
    named = parse_job_spec(
        {"name": "b", "partition": "batch/critical", "tasks": [{"role": "a", "command": "x"}]}
    )
    assert named.placement_partition == "batch/critical"
    assert parse_job_spec(named.to_dict()) == named


def _svc(**fields) -> dict:
    return {"name": "s", "kind": "service", "tasks": [{"role": "a", "command": "x"}], **fields}


def _batch(**fields) -> dict:
    return {"name": "b", "tasks": [{"role": "a", "command": "x"}], **fields}


@pytest.mark.parametrize(
    "source, field, problem",
    [
        (_svc(kind="daemon"), "kind", "expected one of batch, service"),
        (_svc(max_run_time="1h"), "max_run_time", "does not apply to a service"),
        (_svc(min_tasks=1), "min_tasks", "does not apply to a service"),
        (_svc(placement={"gang": True}), "placement.gang", "placed one by one"),
        (_svc(restart={"max_retries": 3}), "restart.max_retries", "restarted for good"),
        (_svc(restart={"reschedule_on_lost": False}), "restart.reschedule_on_lost", "always"),
        (_svc(restart={"backoff": 0}), "restart.backoff", "more than 0s"),
        (_svc(restart={"backoff": "2d"}), "restart.backoff", "at most 86400s"),
        (_svc(restart={"backoff": "10s", "max_backoff": "5s"}), "restart.max_backoff", "at least"),
        (_svc(update={"max_surge": 0}), "update", "both 0"),
        (_svc(update={"max_surge": -1}), "update.max_surge", "between 0"),
        (_svc(update={"surge": 1}), "update.surge", "unknown field"),
        (_svc(health={"interval": "5s"}), "health.command", "required"),
        (_svc(health={"command": ""}), "health.command", "must not be empty"),
        (_svc(health={"command": "x", "interval": "10ms"}), "health.interval", "at least 0.1s"),
        (
            _svc(health={"command": "x", "interval": 5, "timeout": 6}),
            "health.timeout",
            "at most 5s",
        ),
        (_svc(health={"command": "x", "healthy_after": 0}), "health.healthy_after", "between 1"),
        (
            _svc(health={"command": "x", "unhealthy_after": 101}),
            "health.unhealthy_after",
            "and 100",
        ),
        (_svc(partition="Stateless"), "partition", "expected a partition name"),
        (_svc(partition="a/b/c"), "partition", "at most one '/'"),
        (_svc(partition=3), "partition", "expected a string"),
        (_batch(update={"max_surge": 1}), "update", "only to kind: service"),
        (_batch(health={"command": "x"}), "health", "only to kind: service"),
        (_batch(restart={"backoff": "1s"}), "restart.backoff", "only to kind: service"),
    ],
)
def test_service_validation_names_the_field(source, field, problem):
    with pytest.raises(SpecError) as info:
        parse_job_spec(source)
    assert info.value.field == field, str(info.value)
    assert problem in str(info.value)


_durations = st.floats(0.1, 3600.0).map(lambda x: round(x, 3))


@st.composite
def _services(draw) -> JobSpec:
    roles = draw(st.lists(st.sampled_from(["web", "api", "w-1", "x_2"]), min_size=1, unique=True))
    backoff = draw(_durations)
    interval = draw(_durations)
    health = draw(
        st.one_of(
            st.none(),
            st.builds(
                HealthCheck,
                st.just(("/bin/true",)),
                st.just(interval),
                st.floats(0.01, interval).map(lambda t: min(round(t, 3) or 0.001, interval)),
                st.integers(1, 100),
                st.integers(1, 100),
            ),
        )
    )
    unavailable = draw(st.integers(0, 5))
    return JobSpec(
        name="svc",
        tasks=tuple(TaskGroup(r, draw(st.integers(1, 50)), ("run",)) for r in roles),
        restart=RestartPolicy(0, True, backoff, backoff + draw(_durations)),
        placement=PlacementPolicy(gang=False),
        kind="service",
        partition=draw(st.sampled_from(["", "stateless", "batch/critical"])),
        update=UpdatePolicy(unavailable, draw(st.integers(0 if unavailable else 1, 5))),
        health=health,
    )


@settings(max_examples=60)
@given(_services())
def test_service_round_trip(spec):
    assert parse_job_spec(spec.to_dict()) == spec
