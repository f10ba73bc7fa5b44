"""Wire messages and subjects of NATS inference routing (client -> router -> worker).

Declared like ``mesh/schema.py``: frozen dataclasses with ``wf()`` constraints, encoded
with msgpack by ``mesh.codec``; ``decode`` raises ``WireError`` and nothing else, so a
receiver counts and drops (or answers) what fails instead of crashing its loop.

Inputs and outputs travel as raw little-endian float32 ``bytes``: the router never
looks inside them and the worker turns a whole batch into one numpy array with one
``frombuffer``. A small list of floats (``values``) is accepted too, for clients that
have no numpy.

Subjects for the router <-> worker leg are built here, on ``mesh.subjects.token``, so no
module formats them by hand:

- ``mesh.<r>.infer.<model>``            client requests (``mesh.subjects.infer``)
- ``mesh.<r>.infer_worker.<worker_id>`` one batch, request/reply, router -> worker
- ``mesh.<r>.infer_hello``              worker announcements (hello + heartbeat)

How the three processes connect (``add_connection_args``, ``ConnectionArgs``) lives here
too, so the router, the worker and the load generator take the same flags and the same
environment (``MESH_NATS_URL``, ``MESH_REGION``, ``MESH_TLS_*``, ``MESH_INBOX_PREFIX``;
the TLS identity read and checked by ``mesh.tls_env``, as the ``mesh`` CLI in a task
reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgpack
from nats.aio.client import Client

from mesh import subjects, tls_env
from mesh.codec import INT64, MAX_STR, WireError, decode, encode, from_wire, unpack, wf
from mesh.connect import ClientTls, TlsConfigError, connect
from mesh.schema import ErrorCode

__all__ = [
    "ConnectionArgs",
    "add_connection_args",
    "connection_args",
    "id_token",
    "BatchDone",
    "BatchReply",
    "BatchRequest",
    "DEADLINE",
    "InferReply",
    "InferRequest",
    "ReplyError",
    "WireError",
    "WorkerHello",
    "decode",
    "encode",
    "error_bytes",
    "ok_bytes",
    "ok_encoder",
    "parse_batch_request",
    "parse_infer_request",
    "hello_subject",
    "infer_all",
    "infer_subject",
    "worker_subject",
]

ID = 64
MAX_INPUT = 64 * 1024  # bytes of one request's input
MAX_BATCH = 1024

DEADLINE = "DEADLINE"
"""Error code for a request the router will not serve because it would be late.
Beside ``mesh.schema.ErrorCode``; the other codes used here come from there."""

NO_WORKERS = "NO_WORKERS"
"""No live worker serves the model (none announced, or all went away)."""

WORKER_FAILED = "WORKER_FAILED"
"""The worker holding the batch failed or did not answer, and no time was left to retry."""

BAD_REQUEST = str(ErrorCode.BAD_REQUEST)
INTERNAL = str(ErrorCode.INTERNAL)

LATE_MESSAGE = "deadline cannot be met: the batch finished after it"
"""The ``DEADLINE`` message of a request whose result came too late to be served."""


# ---------------------------------------------------------------- subjects


def infer_subject(region: str, model: str) -> str:
    return subjects.infer(region, model)


def infer_all(region: str) -> str:
    """What a router subscribes to: requests for every model of the region."""
    return f"mesh.{subjects.token(region, 'region')}.infer.*"


def worker_subject(region: str, worker_id: str) -> str:
    wid = subjects.token(worker_id, "worker id")
    return f"mesh.{subjects.token(region, 'region')}.infer_worker.{wid}"


def hello_subject(region: str) -> str:
    return f"mesh.{subjects.token(region, 'region')}.infer_hello"


# ---------------------------------------------------------------- client <-> router


@dataclass(frozen=True, slots=True)
class InferRequest:
    """One inference request.

    Its deadline is either absolute (``deadline_unix_ns``, wall clock: client and
    router share a clock on one machine or via NTP) or relative (``timeout_ms`` from
    when the router receives it); with neither, the model's SLO applies.
    ``input`` is raw float32; ``values`` is the same as a list for clients without numpy.
    """

    input: bytes = wf(b"", max_len=MAX_INPUT)
    values: tuple[float, ...] = wf((), max_len=4096)
    deadline_unix_ns: int | None = wf(None, ge=0)
    timeout_ms: float | None = wf(None, ge=0.0, le=3_600_000.0)
    v: int = 1


@dataclass(frozen=True, slots=True)
class ReplyError:
    code: str = wf(max_len=32)
    message: str = wf("", max_len=1024)


@dataclass(frozen=True, slots=True)
class InferReply:
    """``{ok: true, output, worker, queue_ms}`` or ``{ok: false, error: {code, message}}``
    (the shape of ``mesh.schema.ok`` / ``error_reply``)."""

    ok: bool = False
    output: bytes = wf(b"", max_len=MAX_INPUT)
    worker: str = wf("", max_len=ID)
    error: ReplyError | None = None
    v: int = 1


def error_bytes(code: str, message: str) -> bytes:
    """An error reply, encoded as ``mesh.schema.error_reply`` does (code is a string
    here because ``DEADLINE`` etc. are this module's codes)."""
    return encode({"ok": False, "error": {"code": code, "message": message}})


def ok_bytes(output: bytes, worker: str) -> bytes:
    return encode({"ok": True, "output": output, "worker": worker})


def ok_encoder(worker: str) -> Callable[[bytes], bytes]:
    """``ok_bytes(output, worker)`` for one worker, made once: the same map (keys in
    another order, which msgpack readers do not see) at a concatenation per answer."""
    head = (
        b"\x83"
        + msgpack.packb("ok")
        + msgpack.packb(True)
        + msgpack.packb("worker")
        + msgpack.packb(worker)
        + msgpack.packb("output")
    )
    packb = msgpack.packb

    def ok(output: bytes) -> bytes:
        return head + packb(output, use_bin_type=True)

    return ok


# ---------------------------------------------------------------- hand-written decoders
#
# The router decodes every request and the worker every batch. ``decode`` goes through
# the generic dataclass converter (a call and a path string per field and per list item);
# these check the usual shapes by hand and hand everything else to ``decode``, so they
# accept and reject exactly what it does, with its error messages
# (tests/unit/test_inference_wire_decode.py checks both with hypothesis).


def parse_infer_request(data: bytes) -> tuple[bytes, tuple[float, ...], int | None, float | None]:
    """``decode(InferRequest, data)`` as ``(input, values, deadline_unix_ns, timeout_ms)``,
    without building the dataclass. Raises ``WireError`` exactly where ``decode`` does."""
    obj = unpack(data)
    if type(obj) is dict:
        get = obj.get
        inp = get("input", b"")
        vals = get("values", ())
        dl = get("deadline_unix_ns")
        to = get("timeout_ms")
        v = get("v", 1)
        if (
            type(inp) is bytes
            and len(inp) <= MAX_INPUT
            and (vals == () or (type(vals) is list and not vals))
            and (dl is None or (type(dl) is int and 0 <= dl <= INT64))
            and (
                to is None or ((type(to) is float or type(to) is int) and 0.0 <= to <= 3_600_000.0)
            )
            and type(v) is int
            and -INT64 - 1 <= v <= INT64
        ):
            return inp, (), dl, None if to is None else float(to)
    r = from_wire(InferRequest, obj)
    return r.input, r.values, r.deadline_unix_ns, r.timeout_ms


def parse_batch_request(data: bytes) -> BatchRequest:
    """``decode(BatchRequest, data)``, checked by hand when it has the usual shape."""
    obj = unpack(data)
    if type(obj) is dict:
        get = obj.get
        bid = get("batch_id")
        model = get("model")
        inputs = get("inputs", ())
        replies = get("replies", ())
        dls = get("deadlines_unix_ns", ())
        v = get("v", 1)
        if (
            type(bid) is int
            and 0 <= bid <= INT64
            and type(model) is str
            and len(model) <= ID
            and type(inputs) is list
            and len(inputs) <= MAX_BATCH
            and all(type(x) is bytes and len(x) <= MAX_INPUT for x in inputs)
            and (
                replies == ()
                or (
                    type(replies) is list
                    and len(replies) <= MAX_BATCH
                    and all(type(x) is str and len(x) <= MAX_STR for x in replies)
                )
            )
            and (
                dls == ()
                or (
                    type(dls) is list
                    and len(dls) <= MAX_BATCH
                    and all(type(x) is int and -INT64 - 1 <= x <= INT64 for x in dls)
                )
            )
            and type(v) is int
            and -INT64 - 1 <= v <= INT64
        ):
            return BatchRequest(bid, model, tuple(inputs), tuple(replies), tuple(dls), v)
    return from_wire(BatchRequest, obj)


# ---------------------------------------------------------------- router <-> worker


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One batch for a worker: every input of it in one message (one round trip).

    With ``replies`` (one per input, with ``deadlines_unix_ns``) the worker answers each
    client itself, on that reply subject, and sends the router one ``BatchDone``; the
    result of a request whose deadline has passed when the batch is done is answered
    ``DEADLINE`` instead (never served late). Without them, the worker sends the
    outputs back to the router in one ``BatchReply`` and the router answers.
    """

    batch_id: int = wf(ge=0)
    model: str = wf(max_len=ID)
    inputs: tuple[bytes, ...] = wf((), max_len=MAX_BATCH)
    replies: tuple[str, ...] = wf((), max_len=MAX_BATCH)
    deadlines_unix_ns: tuple[int, ...] = wf((), max_len=MAX_BATCH)
    v: int = 1


@dataclass(frozen=True, slots=True)
class BatchReply:
    """The batch's outputs, in input order, as one float32 blob of ``n * out_dim``
    (the router slices it), and how long the batch took on the worker."""

    batch_id: int = wf(ge=0)
    ok: bool = True
    outputs: bytes = wf(b"", max_len=MAX_BATCH * MAX_INPUT)
    out_dim: int = wf(0, ge=0, le=MAX_INPUT)
    exec_ns: int = wf(0, ge=0)
    error: str = wf("", max_len=1024)
    v: int = 1


@dataclass(frozen=True, slots=True)
class BatchDone:
    """A batch whose requests the worker answered itself (``BatchRequest.replies``):
    how many got their result on time (``served``), how many finished after their
    deadline and were answered ``DEADLINE`` (``late``), how many inputs it refused
    (``bad``, answered ``BAD_REQUEST``), and how long the batch took. ``ok`` false:
    it ran nothing and answered no one (``error`` says why); the router re-plans them."""

    batch_id: int = wf(ge=0)
    ok: bool = True
    served: int = wf(0, ge=0, le=MAX_BATCH)
    late: int = wf(0, ge=0, le=MAX_BATCH)
    bad: int = wf(0, ge=0, le=MAX_BATCH)
    exec_ns: int = wf(0, ge=0)
    error: str = wf("", max_len=1024)
    v: int = 1


@dataclass(frozen=True, slots=True)
class WorkerHello:
    """A worker's announcement, sent at start and every ``interval_s`` (heartbeat).

    Carries the model's latency profile on this worker, ``latency(b) = a + b * batch``
    up to ``max_batch``: declared at start, then refitted from measured batches. A
    router forgets a worker not heard from for 3 intervals.
    """

    worker_id: str = wf(max_len=ID)
    model: str = wf(max_len=ID)
    a_ns: int = wf(ge=0, le=10**11)
    b_ns: int = wf(ge=0, le=10**11)
    max_batch: int = wf(ge=1, le=MAX_BATCH)
    gpu_type: str = wf("cpu", max_len=ID)
    memory_bytes: int = wf(0, ge=0)
    slo_ms: float = wf(100.0, ge=0.001, le=3_600_000.0)
    interval_s: float = wf(1.0, ge=0.01, le=3600.0)
    in_dim: int = wf(0, ge=0, le=MAX_INPUT)
    batches: int = wf(0, ge=0)
    stopping: bool = False
    v: int = 1


# ---------------------------------------------------------------- connecting


DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_INBOX_PREFIX = tls_env.DEFAULT_INBOX_PREFIX
_TLS_FLAGS = (
    f"--tls-ca, --tls-cert and --tls-key (${tls_env.CA_VAR}, ${tls_env.CERT_VAR}, "
    f"${tls_env.KEY_VAR})"
)
_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class ConnectionArgs:
    """Where and how a router, worker or load generator connects: the server URL(s),
    the region, and on a secure mesh the client's TLS identity. ``inbox_prefix`` is
    where the process receives every reply (its NATS permissions allow it only its own
    prefix); it is ``tls.inbox_prefix`` when ``tls`` is set."""

    url: str = DEFAULT_URL
    region: str = "local"
    tls: ClientTls | None = None
    inbox_prefix: str = DEFAULT_INBOX_PREFIX

    async def connect(self, name: str, **kwargs: Any) -> Client:
        """``mesh.connect.connect`` with this TLS identity and inbox prefix: nats-py's
        ``new_inbox()`` (hence every reply subject and wildcard inbox of these
        processes) and its request/reply multiplexer then both live under the prefix."""
        if self.tls is None:
            kwargs.setdefault("inbox_prefix", self.inbox_prefix)
        return await connect(self.url, name=name, tls=self.tls, **kwargs)


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """``--nats``, ``--region``, ``--tls-ca``, ``--tls-cert``, ``--tls-key`` and
    ``--inbox-prefix``, each defaulting to its ``MESH_*`` environment variable."""
    env = os.environ.get
    p.add_argument(
        "--nats",
        default=env("MESH_NATS_URL") or DEFAULT_URL,
        help="server URL(s), comma-separated ($MESH_NATS_URL, else %(default)s)",
    )
    p.add_argument(
        "--region",
        default=env("MESH_REGION") or "local",
        help="region ($MESH_REGION, else 'local')",
    )
    p.add_argument(
        "--tls-ca",
        default=env(tls_env.CA_VAR) or "",
        help="CA certificate that signed the server ($MESH_TLS_CA)",
    )
    p.add_argument(
        "--tls-cert",
        default=env(tls_env.CERT_VAR) or "",
        help="this client's certificate ($MESH_TLS_CERT)",
    )
    p.add_argument(
        "--tls-key",
        default=env(tls_env.KEY_VAR) or "",
        help="this client's private key ($MESH_TLS_KEY)",
    )
    p.add_argument(
        "--inbox-prefix",
        default=env(tls_env.INBOX_VAR) or DEFAULT_INBOX_PREFIX,
        help="subject prefix of every reply inbox ($MESH_INBOX_PREFIX, else %(default)s)",
    )


def connection_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> ConnectionArgs:
    """The parsed ``add_connection_args`` flags, checked (``p.error`` exits on a bad
    one): the three TLS files go together, the prefix is a literal subject."""
    try:
        tls = tls_env.client_tls(
            a.tls_ca,
            a.tls_cert,
            a.tls_key,
            a.inbox_prefix,
            names=_TLS_FLAGS,
            inbox_name="--inbox-prefix",
        )
        subjects.token(a.region, "region")
    except (TlsConfigError, subjects.SubjectError) as exc:
        p.error(str(exc))
    return ConnectionArgs(url=a.nats, region=a.region, tls=tls, inbox_prefix=a.inbox_prefix)


EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def add_event_loop_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default="asyncio",
        help="asyncio's own (default), uvloop, or auto (uvloop where installed)",
    )


def run(main: Coroutine[Any, Any, Any], event_loop: str = "asyncio") -> Any:
    """``asyncio.run(main)`` on the chosen event loop: ``asyncio`` (the default),
    ``uvloop`` (which must be installed) or ``auto`` (uvloop where it is installed).
    uvloop is optional and not a dependency: with nats-py the per-message cost is in
    the client library's Python code, and uvloop measured no gain here
    (docs/inference_nats.md, "Measured")."""
    if event_loop not in EVENT_LOOPS:
        main.close()
        raise ValueError(f"event loop is one of {', '.join(EVENT_LOOPS)}, not {event_loop!r}")
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                main.close()
                raise SystemExit("--event-loop uvloop: uvloop is not installed") from None
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    return asyncio.run(main)


def id_token(value: str) -> str:
    """``value`` as a subject token (a worker id), for ids that are not one: a Mesh task
    id (``<job>.<role>.<index>``) has dots and may pass 64 characters. Each character
    outside ``[A-Za-z0-9_-]`` becomes ``-``; a result over 64 characters keeps its first
    55 and a hash of the whole value, so distinct long ids stay distinct."""
    if subjects.is_token(value):
        return value
    if not value:
        raise ValueError("an id cannot be empty")
    t = _NOT_TOKEN.sub("-", value)
    if len(t) > 64:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
        t = f"{t[:55]}-{digest[:8]}"
    return t
