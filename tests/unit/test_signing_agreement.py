"""Signer and verifiers agree, or say why not: which key a process uses by default, the
leader's placement bar for nodes it cannot satisfy, and which refusal reports fail an
attempt (pure decisions in mesh.signing, coordinator.cluster and coordinator.reconcile)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.cluster import DOWN, ClusterView
from coordinator.reconcile import reconcile
from coordinator.state import RegionState
from mesh.codec import decode, encode
from mesh.schema import (
    JobSubmitted,
    LeaderElected,
    LogEntry,
    NodeState,
    TaskEvent,
    TaskPlaced,
)
from mesh.signing import (
    KEY_FILE,
    PUB_FILE,
    AssignmentRefused,
    credit_refusals,
    generate_keypair,
    key_id,
    key_path,
    load_signing_key,
    load_verify_key,
    placement_bar,
    refusal_credited,
    refusal_hint,
)
from workloads.lifecycle import TaskState
from workloads.resources import Resources

GiB = 2**30
K1, K2 = "ed25519:1111111111111111", "ed25519:2222222222222222"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    key, pub = generate_keypair(d)
    return d, load_signing_key(key), load_verify_key(pub)


# ---------------------------------------------------------------- keys


def test_key_id_is_the_same_from_either_half_and_differs_between_pairs(pair, tmp_path):
    _, key, pub = pair
    other = load_signing_key(generate_keypair(tmp_path)[0])
    assert key_id(key) == key_id(pub)
    assert key_id(key).startswith("ed25519:") and len(key_id(key)) == len("ed25519:") + 16
    assert key_id(other) != key_id(key)


def test_key_path_prefers_the_flag_then_the_certs_directory(pair, tmp_path):
    certs, _, _ = pair
    assert key_path("/explicit.pem", str(certs), KEY_FILE) == "/explicit.pem"
    assert key_path(None, str(certs), KEY_FILE) == str(certs / KEY_FILE)
    assert key_path(None, str(certs), PUB_FILE) == str(certs / PUB_FILE)
    # An agent host's bundle has the public half only; no certs: nothing.
    (tmp_path / PUB_FILE).write_bytes((certs / PUB_FILE).read_bytes())
    assert key_path(None, str(tmp_path), KEY_FILE) is None
    assert key_path(None, str(tmp_path), PUB_FILE) == str(tmp_path / PUB_FILE)
    assert key_path(None, None, KEY_FILE) is None
    assert key_path("", None, PUB_FILE) is None


# ---------------------------------------------------------------- the placement bar


def test_placement_bar_names_the_node_the_cause_and_the_fix():
    assert placement_bar("n1", "", None) == ""  # neither side: nothing to agree on
    assert placement_bar("n1", "", K1) == ""  # signed, not verified: it still runs
    assert placement_bar("n1", K1, K1) == ""
    unsigned = placement_bar("n1", K1, None)
    assert "node n1 verifies assignment signatures" in unsigned
    assert "no signing key" in unsigned and "--certs DIR" in unsigned
    assert "--signing-key" in unsigned
    other = placement_bar("n1", K2, K1)
    assert K1 in other and K2 in other and "node n1" in other


@given(
    st.sampled_from(["", K1, K2]),
    st.sampled_from([None, K1, K2]),
)
def test_a_node_is_barred_exactly_when_its_runs_would_be_refused(node_key, signer):
    """Barred iff the node verifies and this coordinator's runs would not verify there:
    unsigned, or signed with another key."""
    would_refuse = bool(node_key) and node_key != signer
    assert bool(placement_bar("n", node_key, signer)) == would_refuse


# ---------------------------------------------------------------- refusal reports


@given(
    st.sampled_from(AssignmentRefused.REASONS),
    st.sampled_from(["", K1, K2]),
    st.sampled_from([None, K1, K2]),
)
def test_a_forged_refusal_never_fails_an_attempt_whose_real_run_verifies(reason, node_key, signer):
    credited = refusal_credited(reason, node_key, signer)
    if reason in ("expired", "future"):
        assert credited  # the signature verified: the coordinator issued that run
    elif reason == "wrong-node":
        assert not credited  # another node's attempt: this node does not speak for it
    elif signer is not None and node_key == signer:
        assert not credited  # this leader's run verifies there: the refused one was not it
    else:
        assert credited  # this leader's run would be refused as well


def test_refusal_hints_say_what_to_do():
    assert "--signing-key" in refusal_hint("unsigned", K1, None)
    assert K1 in refusal_hint("bad-signature", K1, K2) and K2 in refusal_hint(
        "bad-signature", K1, K2
    )
    assert "clock" in refusal_hint("expired", K1, K1)


def test_which_refusals_an_agent_reports():
    assert AssignmentRefused("unsigned").reported
    assert AssignmentRefused("bad-signature").reported
    assert AssignmentRefused("expired").reported and AssignmentRefused("expired").genuine
    assert not AssignmentRefused("wrong-node").reported
    assert not AssignmentRefused("unsigned").genuine


def _event(refused: str = "", key: str = "", message: str = "m") -> TaskEvent:
    return TaskEvent(
        "n1", "j", "j.w.0", 1, TaskState.FAILED, 1.0, message=message, refused=refused,
        verify_key=key,
    )  # fmt: skip


def test_credit_refusals_keeps_reports_and_credited_refusals_with_their_fix():
    plain, unsigned = _event(), _event("unsigned", K1, "refused by node n1: unsigned")
    forged = _event("bad-signature", K1, "refused by node n1: bad-signature")
    kept, doubted = credit_refusals([plain, unsigned], None)
    assert kept[0] == plain and doubted == []
    assert kept[1].message.startswith("refused by node n1: unsigned; this coordinator has no")
    kept, doubted = credit_refusals([forged, plain], K1)  # this leader's runs verify on n1
    assert kept == [plain] and doubted == [forged]
    kept, doubted = credit_refusals([forged], K2)  # n1 verifies with another key
    assert doubted == [] and K1 in kept[0].message and K2 in kept[0].message


def test_the_new_fields_travel_and_old_messages_still_decode():
    ev = _event("unsigned", K1)
    assert decode(TaskEvent, encode(ev)) == ev
    old = {k: v for k, v in dataclasses.asdict(ev).items() if k not in ("refused", "verify_key")}
    old["state"] = str(ev.state)
    assert decode(TaskEvent, encode(old)).refused == ""
    st_ = NodeState("n1", "r", 1, 0.0, verify_key=K1)
    assert decode(NodeState, encode(st_)).verify_key == K1


# ---------------------------------------------------------------- the cluster view and reconcile


def hb(node_id: str, key: str = "", cpu: int = 8000) -> NodeState:
    return NodeState(
        node_id=node_id,
        region="r",
        seq=1,
        ts=0.0,
        capacity=Resources(cpu=cpu, memory=16 * GiB),
        verify_key=key,
    )


def test_a_barred_node_is_watched_but_not_offered_to_placement():
    cv = ClusterView("r", signer=None)
    assert cv.observe(hb("a"), 0.0)
    assert cv.observe(hb("b", K1), 0.0)  # new: worth a reconcile
    assert [v.node_id for v in cv.ready()] == ["a"]
    assert cv.nodes["b"].status == "ready" and "node b verifies" in cv.nodes["b"].barred
    assert cv.barred_reason() == cv.nodes["b"].barred
    assert not cv.observe(hb("b", K1), 1.0)  # the same heartbeat again: nothing changed
    # Its agent restarted without the key: placed on again, and worth a reconcile.
    assert cv.observe(hb("b"), 2.0)
    assert [v.node_id for v in cv.ready()] == ["a", "b"] and cv.barred_reason() == ""


def test_a_coordinator_that_signs_bars_only_nodes_with_another_key():
    cv = ClusterView("r", signer=K1)
    for n, key in (("a", ""), ("b", K1), ("c", K2), ("d", K2)):
        cv.observe(hb(n, key), 0.0)
    assert [v.node_id for v in cv.ready()] == ["a", "b"]
    assert cv.barred_reason().startswith("node c verifies assignments with key " + K2)
    assert cv.barred_reason().endswith("(and 1 more nodes so)")
    cv.sweep(20.0)  # all down: a down node's bar is nobody's reason
    assert cv.nodes["c"].status == DOWN and cv.barred_reason() == ""


def _state_with_job() -> RegionState:
    state = RegionState()
    spec = {"name": "j", "tasks": [{"role": "w", "command": ["true"], "resources": {"cpu": "1"}}]}
    entry = LogEntry(1, "c1", (LeaderElected(1, "c1"), JobSubmitted("j", "client-j", spec, 1.0)))
    assert state.apply(1, entry)
    return state


def test_a_job_whose_only_node_is_barred_waits_naming_the_cause():
    state = _state_with_job()
    cv = ClusterView("r", signer=None)
    cv.observe(hb("n1", K1), 0.0)
    d = reconcile(state, cv, 10.0)
    assert not [e for e in d.events if isinstance(e, TaskPlaced)]
    why = d.unplaced["j"]
    assert "node n1 verifies assignment signatures" in why and "--signing-key" in why


def test_jobs_that_wait_beside_a_barred_node_say_it_too():
    state = _state_with_job()
    cv = ClusterView("r", signer=K1)
    cv.observe(hb("small", K1, cpu=500), 0.0)  # too small for the job's 1 CPU
    cv.observe(hb("big", K2), 0.0)  # would fit, but verifies with another key
    d = reconcile(state, cv, 10.0)
    assert not [e for e in d.events if isinstance(e, TaskPlaced)]
    assert "not placed on: node big verifies assignments with key" in d.unplaced["j"]
    # The same nodes with the right key: placed there.
    cv.observe(hb("big", K1), 1.0)
    d = reconcile(state, cv, 11.0)
    assert [(e.task_id, e.node_id) for e in d.events if isinstance(e, TaskPlaced)] == [
        ("j.w.0", "big")
    ]
