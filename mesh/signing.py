"""Ed25519 signatures on assignments: the coordinator signs, agents verify.

An agent executes commands, so what reaches its assignment subject is treated as
hostile until proven otherwise. The region coordinator signs every assignment (run and
kill) with its private key just before publishing it; an agent given the public key
refuses anything whose signature does not verify.

The signature covers a canonical encoding of every field that decides what runs
where: kind, node, job, task, attempt, term, issued_at, expires_at, grace_s and the
whole TaskSpec (argv, env, workdir, resources, GPUs, ...). Canonical means the same
bytes on both sides whatever the dict order or number type on the wire: map keys are
sorted and an integral float is written as an integer (the decoder turns a `5` for a
float field into `5.0`). A domain prefix ("mesh-assignment-v1") keeps these bytes from
ever being mistaken for another signed message.

A round's runs for one node travel as one `AssignmentBatch`, signed once: the signature
covers the node and, in order, every item as its own signature would (`sign_batch`,
`batch_signed_bytes`, under a domain of its own, so a batch signature never stands for
a single assignment's or the reverse). The items carry no signature; `open_message`
checks the batch's once, then each item as `verify` checks one.

Checks (`verify`), for both kinds: a signature is present, it verifies under the key,
and the assignment names this node. For runs only, also: not expired and not issued
too far in the future (clock skew bound). Kills skip the time checks on purpose: a
kill names one attempt that the coordinator decided must not run, so honouring an old
or replayed (but genuine) kill can only stop what was already condemned. A replayed
*run* is refused by expiry once it is old, and before that by the agent's own
de-duplication on (task, attempt) -- `verify` is pure and does not keep that state.

Who signs and who verifies must agree, or nothing runs: an agent that verifies refuses
everything an unsigned coordinator sends, or one that signs with another key. So each
agent's heartbeat names the key it verifies with (`key_id`, a fingerprint), and the
leader places nothing on a node it cannot satisfy (`placement_bar`, the reason shown as
the job's waiting reason). An assignment refused all the same (sent before the agent
changed its key, by an earlier leader) is reported by the agent as its attempt's
failure; the leader credits such a report only where its own assignment could have
been refused so (`refusal_credited`), so a forgery cannot fail a genuine attempt.

Everything here is pure except key generation and loading.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from mesh.codec import to_wire
from mesh.schema import Assignment, AssignmentBatch, TaskEvent

log = logging.getLogger("mesh.signing")

DOMAIN = b"mesh-assignment-v1\x00"
BATCH_DOMAIN = b"mesh-assignment-batch-v1\x00"
DEFAULT_TTL_S = 300.0  # how long a signed run stays valid (well under the hollow SEEN_TTL_S)
DEFAULT_MAX_SKEW_S = 30.0  # how far the coordinator's clock may be ahead of or behind ours
KEY_FILE = "assignments.key"
PUB_FILE = "assignments.pub"

# cryptography is imported where a key is made, read or used, not with this module: it
# is ~10 MB of a process's memory, and an agent that verifies nothing (an edge site's,
# counted in megabytes) never needs it.
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey as SigningKey,
    )
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PublicKey as VerifyKey,
    )


def __getattr__(name: str) -> Any:
    """`SigningKey` and `VerifyKey` (cryptography's Ed25519 key classes), on first use."""
    if name in ("SigningKey", "VerifyKey"):
        from cryptography.hazmat.primitives.asymmetric import ed25519

        return ed25519.Ed25519PrivateKey if name == "SigningKey" else ed25519.Ed25519PublicKey
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class AssignmentRefused(Exception):
    """An assignment that must not be acted on. `reason` is one short code:
    unsigned, bad-signature, wrong-node, expired, future; `detail` says more."""

    REASONS = ("unsigned", "bad-signature", "wrong-node", "expired", "future")

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)

    @property
    def genuine(self) -> bool:
        """The signature verified (the coordinator did issue it): refused only for its age.
        Such a refusal is recorded as the attempt's failure; a forged one is not."""
        return self.reason in ("expired", "future")

    @property
    def reported(self) -> bool:
        """Sent to the coordinator as the attempt's failure (a run's only): every reason
        but wrong-node, which names another node's attempt (a replay moved here) that this
        node must not speak for. Whether an unsigned or bad-signature report counts is the
        leader's call (`refusal_credited`)."""
        return self.reason != "wrong-node"


# ---------------------------------------------------------------- keys


def generate_keypair(
    directory: str | os.PathLike[str], *, overwrite: bool = False
) -> tuple[Path, Path]:
    """A new Ed25519 key pair as PEM files in `directory`: (private key, public key).
    The private key file is created 0600 (never wider, even briefly); an existing key
    is not replaced unless `overwrite`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = d / KEY_FILE, d / PUB_FILE
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_TRUNC if overwrite else os.O_EXCL
    fd = os.open(key_path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an overwritten file keeps its old mode otherwise
        os.write(fd, private)
    finally:
        os.close(fd)
    tmp = pub_path.with_name(pub_path.name + ".tmp")
    tmp.write_bytes(public)
    os.chmod(tmp, 0o644)
    os.replace(tmp, pub_path)
    return key_path, pub_path


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """The coordinator's private key (PEM, unencrypted PKCS8). Warns if others can read it."""
    p = Path(path)
    mode = p.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "signing key %s is accessible to others (mode %o): chmod 600 it", p, mode & 0o777
        )
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = serialization.load_pem_private_key(p.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{p}: not an Ed25519 private key")
    return key


def load_verify_key(path: str | os.PathLike[str]) -> VerifyKey:
    """An agent's copy of the coordinator's public key (PEM)."""
    p = Path(path)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = serialization.load_pem_public_key(p.read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{p}: not an Ed25519 public key")
    return key


def key_id(key: VerifyKey | SigningKey) -> str:
    """A short fingerprint of a key pair (from either half): what a heartbeat carries to
    say which key its agent verifies with, and what logs show. Not secret."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def key_path(explicit: str | None, certs_dir: str | None, filename: str) -> str | None:
    """The key file a process uses: the one it was given, else `filename` in its certs
    directory when that holds one (`mesh certs init` writes both halves there), else
    none."""
    if explicit:
        return explicit
    if certs_dir and (Path(certs_dir) / filename).is_file():
        return str(Path(certs_dir) / filename)
    return None


# ---------------------------------------------------------------- signer and verifiers agree

NO_SIGNING_KEY_FIX = "start it with --certs DIR (holding assignments.key) or --signing-key FILE"


def placement_bar(node_id: str, node_key: str, signer: str | None) -> str:
    """Why the leader must not place on this node ("" if it may): the node verifies
    assignments (`node_key`, its key's id; "" if it does not, or is too old to say) and
    this coordinator would send it nothing it accepts, unsigned (`signer` None) or signed
    with another key."""
    if not node_key or node_key == signer:
        return ""
    if signer is None:
        return (
            f"node {node_id} verifies assignment signatures and this coordinator has no "
            f"signing key: {NO_SIGNING_KEY_FIX}"
        )
    return (
        f"node {node_id} verifies assignments with key {node_key}, this coordinator signs "
        f"with {signer}: give both halves of one pair (assignments.key to coordinators, "
        f"assignments.pub to agents)"
    )


def refusal_credited(reason: str, node_key: str, signer: str | None) -> bool:
    """Whether a node's report that it refused an attempt's run (`reason`, an
    AssignmentRefused code) fails that attempt. Refused for its age: yes, the signature
    verified. Unsigned or bad signature: yes unless this coordinator signs with the very
    key the node verifies with (`node_key`, as the report says), for then what it sent
    verifies, and what the node refused was someone else's: a forgery naming a real
    attempt must not fail it. Where the keys differ the genuine run would be refused
    too, so crediting a forged report costs nothing."""
    if reason in ("expired", "future"):
        return True
    if reason in ("unsigned", "bad-signature"):
        return signer is None or node_key != signer
    return False


def refusal_hint(reason: str, node_key: str, signer: str | None) -> str:
    """What to do about a credited refusal, for the task's message ("" if nothing)."""
    if reason in ("expired", "future"):
        return "the clocks of this coordinator and the node differ: synchronise them (NTP)"
    if signer is None:
        return f"this coordinator has no signing key: {NO_SIGNING_KEY_FIX}"
    if node_key and node_key != signer:
        return (
            f"the node verifies with key {node_key}, this coordinator signs with {signer}: "
            "give both halves of one pair"
        )
    return ""


def credit_refusals(
    events: Iterable[TaskEvent], signer: str | None
) -> tuple[list[TaskEvent], list[TaskEvent]]:
    """Agents' reports split into those to judge as usual and the refusals a leader
    signing with `signer` does not credit (`refusal_credited`: it signs with the very
    key the node verifies with, so what the node refused was not its run). A credited
    refusal's message gains what to do about it."""
    kept, doubted = [], []
    for ev in events:
        if not ev.refused:
            kept.append(ev)
        elif not refusal_credited(ev.refused, ev.verify_key, signer):
            doubted.append(ev)
        else:
            hint = refusal_hint(ev.refused, ev.verify_key, signer)
            kept.append(
                dataclasses.replace(ev, message=f"{ev.message}; {hint}" if hint else ev.message)
            )
    return kept, doubted


# ---------------------------------------------------------------- canonical bytes


def _canon(x: Any) -> Any:
    """Wire data in one form: maps sorted by key, integral floats as ints."""
    if isinstance(x, dict):
        return {k: _canon(x[k]) for k in sorted(x, key=str)}
    if isinstance(x, list):
        return [_canon(v) for v in x]
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**53:
        return int(x)
    return x


def _body(a: Assignment, specs: dict[int, Any] | None = None) -> list:
    """`specs`: canonical specs by id(), for a batch whose runs share TaskSpec objects."""
    if a.spec is None:
        spec = None
    elif specs is None:
        spec = _canon(to_wire(a.spec))
    else:
        spec = specs.get(id(a.spec))
        if spec is None:
            spec = specs[id(a.spec)] = _canon(to_wire(a.spec))
    return [
        a.kind,
        a.node_id,
        a.job_id,
        a.task_id,
        a.attempt,
        a.term,
        _canon(float(a.issued_at)),
        _canon(float(a.expires_at)),
        _canon(float(a.grace_s)),
        spec,
        a.retries_left,  # a forged count would buy restarts in place on a cut-off site
    ]


def signed_bytes(a: Assignment) -> bytes:
    """What the signature covers: everything of `a` but the signature itself (and `v`)."""
    return DOMAIN + msgpack.packb(_body(a), use_bin_type=True)


def batch_signed_bytes(b: AssignmentBatch) -> bytes:
    """What a batch's one signature covers: its node and every item as `signed_bytes`
    would cover it, in order. Its own domain: a batch's bytes never verify as one
    assignment's, nor the other way round."""
    specs: dict[int, Any] = {}  # the batch holds its specs: their ids stay valid
    return BATCH_DOMAIN + msgpack.packb(
        [b.node_id, [_body(a, specs) for a in b.items]], use_bin_type=True
    )


# ---------------------------------------------------------------- sign and verify


def sign(a: Assignment, key: SigningKey, ttl_s: float = DEFAULT_TTL_S) -> Assignment:
    """`a` valid until `issued_at + ttl_s`, signed."""
    a = dataclasses.replace(a, expires_at=a.issued_at + ttl_s, signature=b"")
    return dataclasses.replace(a, signature=key.sign(signed_bytes(a)))


def verify(
    a: Assignment,
    pub: VerifyKey,
    node_id: str,
    now: float,
    max_skew_s: float = DEFAULT_MAX_SKEW_S,
) -> None:
    """Returns if `a` may be acted on by `node_id` at `now`; raises AssignmentRefused."""
    if not a.signature:
        raise AssignmentRefused(
            "unsigned", f"{a.kind} {a.task_id}#{a.attempt} carries no signature"
        )
    from cryptography.exceptions import InvalidSignature

    try:
        pub.verify(a.signature, signed_bytes(a))
    except InvalidSignature:
        raise AssignmentRefused(
            "bad-signature", f"{a.kind} {a.task_id}#{a.attempt}: forged or altered"
        ) from None
    _check_item(a, node_id, now, max_skew_s)


def _check_item(a: Assignment, node_id: str, now: float, max_skew_s: float) -> None:
    """The checks after the signature: addressed to this node, and for runs, in date."""
    if a.node_id != node_id:
        raise AssignmentRefused("wrong-node", f"addressed to {a.node_id!r}, this is {node_id!r}")
    if a.kind != "run":
        return  # kills: see the module docstring
    if now > a.expires_at + max_skew_s:
        raise AssignmentRefused(
            "expired", f"run {a.task_id}#{a.attempt} expired {now - a.expires_at:.0f} s ago"
        )
    if a.issued_at > now + max_skew_s:
        raise AssignmentRefused(
            "future",
            f"run {a.task_id}#{a.attempt} issued {a.issued_at - now:.0f} s in the future "
            f"(clocks differ by more than {max_skew_s:g} s?)",
        )


def sign_batch(
    b: AssignmentBatch, key: SigningKey, ttl_s: float = DEFAULT_TTL_S
) -> AssignmentBatch:
    """Each item valid until its `issued_at + ttl_s`; the batch signed once."""
    items = tuple(
        dataclasses.replace(a, expires_at=a.issued_at + ttl_s, signature=b"") for a in b.items
    )
    b = dataclasses.replace(b, items=items, signature=b"")
    return dataclasses.replace(b, signature=key.sign(batch_signed_bytes(b)))


Checked = list[tuple[Assignment, "AssignmentRefused | None"]]


def open_message(
    m: Assignment | AssignmentBatch,
    pub: VerifyKey | None,
    node_id: str,
    now: float,
    max_skew_s: float = DEFAULT_MAX_SKEW_S,
) -> Checked:
    """The assignments a message carries, each with why it must not be acted on (None:
    it may). Without a key (an unsigned region) nothing is refused. A batch's signature
    is checked once for all its items; each item is then checked as `verify` checks one
    (this node, in date), so one stale item does not spoil the rest."""
    items = m.items if isinstance(m, AssignmentBatch) else (m,)
    if pub is None:
        return [(a, None) for a in items]
    if isinstance(m, Assignment):
        try:
            verify(m, pub, node_id, now, max_skew_s)
        except AssignmentRefused as exc:
            return [(m, exc)]
        return [(m, None)]
    what = f"batch of {len(items)} for {m.node_id}"
    if not m.signature:
        return _all(items, AssignmentRefused("unsigned", f"{what} carries no signature"))
    from cryptography.exceptions import InvalidSignature

    try:
        pub.verify(m.signature, batch_signed_bytes(m))
    except InvalidSignature:
        return _all(items, AssignmentRefused("bad-signature", f"{what}: forged or altered"))
    out: Checked = []
    for a in items:
        try:
            _check_item(a, node_id, now, max_skew_s)
            out.append((a, None))
        except AssignmentRefused as exc:
            out.append((a, exc))
    return out


def _all(items: tuple[Assignment, ...], exc: AssignmentRefused) -> Checked:
    return [(a, exc) for a in items]
