"""Assignment signatures (mesh.signing): what verifies, what is refused and why."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from agent.executor import ExecError, ExecSpec, ProcessExecutor
from mesh.codec import decode, encode, from_wire, to_wire
from mesh.schema import Assignment, AssignmentBatch, Resources, TaskSpec, decode_assignments
from mesh.signing import (
    DEFAULT_MAX_SKEW_S,
    DEFAULT_TTL_S,
    AssignmentRefused,
    generate_keypair,
    load_signing_key,
    load_verify_key,
    open_message,
    sign,
    sign_batch,
    signed_bytes,
    verify,
)
from workloads.spec import SimulatedRun

NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    key_path, pub_path = generate_keypair(tmp_path_factory.mktemp("keys"))
    return load_signing_key(key_path), load_verify_key(pub_path)


@pytest.fixture(scope="module")
def other_keys(tmp_path_factory):
    key_path, pub_path = generate_keypair(tmp_path_factory.mktemp("other"))
    return load_signing_key(key_path), load_verify_key(pub_path)


def run(**over) -> Assignment:
    spec = TaskSpec(
        argv=("sh", "-c", "echo hi"),
        env={"B": "2", "A": "1", "TOKEN": "secret"},
        resources=Resources(cpu=500, memory=1 << 20),
        max_run_time_s=60.0,
    )
    base = Assignment("run", "n1", "j", "j.main.0", 1, 7, NOW, spec)
    return dataclasses.replace(base, **over)


def wire(a: Assignment) -> Assignment:
    """What the agent sees: the assignment after a trip over the wire."""
    return decode(Assignment, encode(a))


def reason(a: Assignment, pub, node_id: str = "n1", now: float = NOW) -> str:
    with pytest.raises(AssignmentRefused) as info:
        verify(a, pub, node_id, now)
    return info.value.reason


def test_round_trip_over_the_wire(keys):
    key, pub = keys
    signed = sign(run(), key)
    assert len(signed.signature) == 64 and signed.expires_at == NOW + DEFAULT_TTL_S
    verify(wire(signed), pub, "n1", NOW + 1)
    kill = sign(Assignment("kill", "n1", "j", "j.main.0", 1, 7, NOW, grace_s=2.0), key)
    verify(wire(kill), pub, "n1", NOW)


def test_canonical_bytes_ignore_env_order_and_number_types(keys):
    key, pub = keys
    a = run()
    reordered = dataclasses.replace(
        a, spec=dataclasses.replace(a.spec, env={"TOKEN": "secret", "A": "1", "B": "2"})
    )
    assert signed_bytes(a) == signed_bytes(reordered)
    # A simulated run written with an int duration decodes as a float: same signature.
    sim = dataclasses.replace(a, spec=TaskSpec(simulate=SimulatedRun(5, 0)))  # type: ignore[arg-type]
    verify(wire(sign(sim, key)), pub, "n1", NOW)
    # The wire map's own order does not matter either.
    raw = to_wire(sign(a, key))
    raw["spec"]["env"] = dict(reversed(list(raw["spec"]["env"].items())))
    verify(from_wire(Assignment, raw), pub, "n1", NOW)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda a: dataclasses.replace(
            a, spec=dataclasses.replace(a.spec, argv=("sh", "-c", "rm -rf /"))
        ),
        lambda a: dataclasses.replace(
            a, spec=dataclasses.replace(a.spec, env={**a.spec.env, "LD_PRELOAD": "x"})
        ),
        lambda a: dataclasses.replace(a, spec=dataclasses.replace(a.spec, workdir="/etc")),
        lambda a: dataclasses.replace(a, spec=dataclasses.replace(a.spec, max_run_time_s=None)),
        lambda a: dataclasses.replace(a, attempt=2),
        lambda a: dataclasses.replace(a, task_id="other"),
        lambda a: dataclasses.replace(a, term=8),
        lambda a: dataclasses.replace(a, expires_at=a.expires_at + 3600),
        lambda a: dataclasses.replace(a, kind="kill"),
        lambda a: dataclasses.replace(a, node_id="n2"),
        lambda a: dataclasses.replace(a, retries_left=a.retries_left + 5),
    ],
    ids=[
        "argv",
        "env",
        "workdir",
        "max_run_time",
        "attempt",
        "task",
        "term",
        "expiry",
        "kind",
        "node",
        "retries_left",
    ],
)
def test_any_change_after_signing_is_a_bad_signature(keys, tamper):
    key, pub = keys
    forged = wire(tamper(sign(run(), key)))
    node = forged.node_id
    assert reason(forged, pub, node_id=node) == "bad-signature"


def test_refusals_name_their_reason(keys, other_keys):
    key, pub = keys
    other_key, _ = other_keys
    assert reason(run(), pub) == "unsigned"
    assert reason(wire(sign(run(), other_key)), pub) == "bad-signature"
    assert reason(wire(sign(run(), key)), pub, node_id="n2") == "wrong-node"
    late = NOW + DEFAULT_TTL_S + DEFAULT_MAX_SKEW_S + 1
    assert reason(wire(sign(run(), key)), pub, now=late) == "expired"
    early = NOW - DEFAULT_MAX_SKEW_S - 1
    assert reason(wire(sign(run(), key)), pub, now=early) == "future"
    # Within the skew bound, both ways: accepted.
    verify(wire(sign(run(), key)), pub, "n1", NOW - DEFAULT_MAX_SKEW_S + 1)
    verify(wire(sign(run(), key)), pub, "n1", NOW + DEFAULT_TTL_S + DEFAULT_MAX_SKEW_S - 1)
    refused = AssignmentRefused("expired", "x")
    assert refused.genuine and not AssignmentRefused("bad-signature").genuine


def test_kills_are_honoured_late_but_never_unsigned_or_forged(keys, other_keys):
    key, pub = keys
    kill = Assignment("kill", "n1", "j", "j.main.0", 1, 3, NOW)
    verify(wire(sign(kill, key)), pub, "n1", NOW + 10 * DEFAULT_TTL_S)  # old kill: still honoured
    assert reason(kill, pub) == "unsigned"
    assert reason(wire(sign(kill, other_keys[0])), pub) == "bad-signature"
    assert reason(wire(sign(kill, key)), pub, node_id="n2") == "wrong-node"


def test_unsigned_assignments_from_old_writers_still_decode():
    raw = to_wire(run())
    del raw["expires_at"], raw["signature"]
    a = decode(Assignment, encode(raw))
    assert a.expires_at == 0.0 and a.signature == b""


def test_keypair_files(tmp_path):
    key_path, pub_path = generate_keypair(tmp_path / "k")
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    assert b"PRIVATE KEY" in key_path.read_bytes() and b"PUBLIC KEY" in pub_path.read_bytes()
    with pytest.raises(FileExistsError):
        generate_keypair(tmp_path / "k")
    before = pub_path.read_bytes()
    generate_keypair(tmp_path / "k", overwrite=True)
    assert pub_path.read_bytes() != before
    with pytest.raises(ValueError):
        load_verify_key(key_path)  # a private key is not a public key


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
async def test_executor_refuses_root_unless_allowed(tmp_path):
    spec = ExecSpec(task_id="t#0", argv=("sh", "-c", f"touch {tmp_path}/ran"))
    refusing = ProcessExecutor(tmp_path / "a", allow_root=False)
    with pytest.raises(ExecError, match="--allow-root"):
        await refusing.start(spec)
    assert not (tmp_path / "ran").exists()
    assert not ProcessExecutor(tmp_path / "b", run_as="nobody", allow_root=False).root_refusal
    assert ProcessExecutor(tmp_path / "c", run_as="root", allow_root=False).root_refusal
    assert not ProcessExecutor(tmp_path / "d", allow_root=True).root_refusal


# ---------------------------------------------------------------- batches


def batch_of(*runs: Assignment, node_id: str = "n1") -> AssignmentBatch:
    return AssignmentBatch(node_id, tuple(runs))


def reasons(m, pub, node_id: str = "n1", now: float = NOW) -> list[str | None]:
    return [None if exc is None else exc.reason for _, exc in open_message(m, pub, node_id, now)]


def test_a_batch_verifies_once_for_all_its_items_after_a_trip_over_the_wire(keys):
    key, pub = keys
    b = sign_batch(batch_of(run(), run(task_id="j.main.1"), run(kind="kill", spec=None)), key)
    assert all(not a.signature for a in b.items)  # one signature, the batch's
    assert all(a.expires_at == NOW + DEFAULT_TTL_S for a in b.items)
    seen = decode_assignments(encode(b))
    assert seen == b
    assert reasons(seen, pub) == [None, None, None]
    assert [a.task_id for a, _ in open_message(seen, pub, "n1", NOW)] == [
        "j.main.0",
        "j.main.1",
        "j.main.0",
    ]


def test_a_single_assignment_still_decodes_and_opens_as_before(keys):
    key, pub = keys
    a = sign(run(), key)
    assert decode_assignments(encode(a)) == a
    assert reasons(a, pub) == [None]
    assert reasons(run(), pub) == ["unsigned"]


@pytest.mark.parametrize(
    "tamper",
    [
        lambda b: dataclasses.replace(b, items=b.items[:1]),  # one dropped
        lambda b: dataclasses.replace(b, items=(*b.items, b.items[0])),  # one added
        lambda b: dataclasses.replace(b, items=b.items[::-1]),  # reordered
        lambda b: dataclasses.replace(
            b, items=(dataclasses.replace(b.items[0], attempt=2), b.items[1])
        ),
        lambda b: dataclasses.replace(
            b,
            items=(
                b.items[0],
                dataclasses.replace(
                    b.items[1], spec=dataclasses.replace(b.items[1].spec, argv=("rm", "-rf"))
                ),
            ),
        ),
        lambda b: dataclasses.replace(b, node_id="n2"),
    ],
)
def test_any_change_to_a_signed_batch_refuses_every_item(keys, tamper):
    key, pub = keys
    b = tamper(sign_batch(batch_of(run(), run(task_id="j.main.1")), key))
    assert set(reasons(b, pub, b.node_id)) == {"bad-signature"}


def test_batch_refusals_unsigned_forged_and_per_item(keys, other_keys):
    key, pub = keys
    two = batch_of(run(), run(task_id="j.main.1"))
    assert reasons(two, pub) == ["unsigned", "unsigned"]
    assert reasons(sign_batch(two, other_keys[0]), pub) == ["bad-signature"] * 2
    assert reasons(sign_batch(two, key), None) == [None, None]  # unsigned region: no checks
    # Genuine, but one item is for another node and one was issued an hour ago: only
    # those two are refused, each for its own reason.
    mixed = sign_batch(
        batch_of(run(), run(task_id="j.main.1", node_id="n2"), run(issued_at=NOW - 3600)), key
    )
    assert reasons(mixed, pub) == [None, "wrong-node", "expired"]
    refusal = open_message(mixed, pub, "n1", NOW)[2][1]
    assert refusal.genuine  # reported as the attempt's failure, as for a single one


def test_batch_and_single_signatures_never_stand_for_each_other(keys):
    key, pub = keys
    a = sign(run(), key)
    as_batch = AssignmentBatch("n1", (dataclasses.replace(a, signature=b""),), a.signature)
    assert reasons(as_batch, pub) == ["bad-signature"]
    b = sign_batch(batch_of(run()), key)
    as_single = dataclasses.replace(b.items[0], signature=b.signature)
    assert reasons(as_single, pub) == ["bad-signature"]
