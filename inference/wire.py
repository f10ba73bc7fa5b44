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
"""

from __future__ import annotations

from dataclasses import dataclass

from mesh import subjects
from mesh.codec import WireError, decode, encode, wf
from mesh.schema import ErrorCode

__all__ = [
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


# ---------------------------------------------------------------- router <-> worker


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One batch for a worker: every input of it in one message (one round trip)."""

    batch_id: int = wf(ge=0)
    model: str = wf(max_len=ID)
    inputs: tuple[bytes, ...] = wf((), max_len=MAX_BATCH)
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

