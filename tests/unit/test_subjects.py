"""Subject builders: the documented tree, and tokens that could widen a subject refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh import subjects
from mesh.subjects import SubjectError

# --------------------------------------------------------------------------- the tree


def test_agent_subjects_follow_the_documented_tree():
    assert subjects.state("eu1", "node-7") == "mesh.eu1.state.node-7"
    assert subjects.state_all("eu1") == "mesh.eu1.state.*"
    assert subjects.assign("eu1", "node-7") == "mesh.eu1.assign.node-7"
    assert subjects.assign_all("eu1") == "mesh.eu1.assign.>"
    assert subjects.events("eu1", "node-7") == "mesh.eu1.events.node-7"
    assert subjects.events_all("eu1") == "mesh.eu1.events.>"
    assert subjects.task_logs("eu1", "node_7") == "mesh.eu1.logs.node_7"


def test_coordinator_subjects_follow_the_documented_tree():
    assert subjects.job_log("r") == "mesh.r.log"
    assert subjects.api("r", "job.submit") == "mesh.r.api.job.submit"
    assert subjects.api("r", "nodes") == "mesh.r.api.nodes"
    assert subjects.api_prefix("r") == "mesh.r.api"
    assert subjects.leader_api("r", "job.kill") == "mesh.r.leader.job.kill"
    assert subjects.infer("r", "resnet50") == "mesh.r.infer.resnet50"


def test_jetstream_names_have_no_dots():
    names = [
        subjects.log_stream("eu-1"),
        subjects.assign_stream("eu-1"),
        subjects.events_stream("eu-1"),
        subjects.agent_consumer("node-1"),
        subjects.events_consumer(),
        subjects.lease_bucket("eu-1"),
    ]
    assert names == [
        "MESH_LOG_eu-1",
        "MESH_ASSIGN_eu-1",
        "MESH_EVENTS_eu-1",
        "agent_node-1",
        "coordinator",
        "mesh_lease_eu-1",
    ]
    assert not any("." in n or "*" in n or ">" in n for n in names)


def test_streams_of_different_regions_differ():
    assert subjects.log_stream("a") != subjects.log_stream("b")
    assert subjects.lease_bucket("a") != subjects.lease_bucket("b")


def test_wildcards_cover_exactly_one_token_level_per_node():
    # `state.*` must match every node's state subject, which needs node ids to be one token.
    for node in ("n1", "A_b-9", "x" * 64):
        s = subjects.state("r", node)
        assert s.split(".")[:3] == ["mesh", "r", "state"]
        assert len(s.split(".")) == 4


# --------------------------------------------------------------------------- tokens

BAD_TOKENS = [
    "",
    "a.b",
    ".",
    "*",
    ">",
    "a*",
    "a>",
    "node 1",
    " node",
    "node ",
    "\t",
    "x" * 65,
    "ünïcode",
    "a/b",
    "a\x00b",
]


@pytest.mark.parametrize("bad", BAD_TOKENS)
@pytest.mark.parametrize(
    "builder",
    [
        lambda t: subjects.state(t, "n"),
        lambda t: subjects.state("r", t),
        lambda t: subjects.assign("r", t),
        lambda t: subjects.events("r", t),
        lambda t: subjects.task_logs("r", t),
        lambda t: subjects.infer("r", t),
        lambda t: subjects.job_log(t),
        lambda t: subjects.state_all(t),
        lambda t: subjects.api(t, "job.submit"),
        lambda t: subjects.log_stream(t),
        lambda t: subjects.agent_consumer(t),
        lambda t: subjects.lease_bucket(t),
    ],
    ids=[
        "region",
        "state-node",
        "assign",
        "events",
        "logs",
        "infer",
        "job_log",
        "state_all",
        "api-region",
        "log_stream",
        "consumer",
        "lease",
    ],
)
def test_builders_refuse_unsafe_tokens(builder, bad):
    with pytest.raises(SubjectError):
        builder(bad)


@pytest.mark.parametrize("bad", [None, 5, b"node", ["n"]])
def test_token_refuses_non_strings(bad):
    with pytest.raises(SubjectError):
        subjects.token(bad)


def test_token_accepts_the_longest_allowed():
    assert subjects.token("a" * 64) == "a" * 64
    assert subjects.token("A-z_0") == "A-z_0"


def test_subject_error_is_a_value_error_and_names_what():
    with pytest.raises(ValueError, match="node id"):
        subjects.state("r", "a.b")


@pytest.mark.parametrize("bad", ["node\n", "node\r\n", "eu1\n"])
def test_token_refuses_a_trailing_newline(bad):
    # A newline in a subject would end the NATS protocol line (PUB <subject> ...\r\n).
    with pytest.raises(SubjectError):
        subjects.token(bad)
    with pytest.raises(SubjectError):
        subjects.state("r", bad)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "Job",
        "job..submit",
        ".job",
        "job.",
        "job.*",
        "job.>",
        "job submit",
        "1job",
        "a.b.c.d.e",
        "job-submit",
        "job.submit\n",
    ],
)
def test_api_endpoint_must_be_a_dotted_lowercase_name(bad):
    with pytest.raises(SubjectError):
        subjects.api("r", bad)
    with pytest.raises(SubjectError):
        subjects.leader_api("r", bad)


def test_api_endpoint_allows_up_to_four_parts():
    assert subjects.api("r", "a.b.c.d") == "mesh.r.api.a.b.c.d"


@settings(max_examples=300, database=None, deadline=None, derandomize=True)
@given(st.text(max_size=80))
def test_any_token_either_is_safe_or_refused(value):
    try:
        out = subjects.state("r", value)
    except SubjectError:
        return
    node = out.removeprefix("mesh.r.state.")
    assert node == value
    assert 1 <= len(node) <= 64
    assert all(c.isascii() and (c.isalnum() or c in "_-") for c in node), repr(node)
