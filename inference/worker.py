"""An inference worker: serves batches from the router, one at a time, as one GPU would.

Two runtimes behind one interface:

- ``numpy``: a real model, a 2-layer MLP with fixed seeded weights (``mlp(seed)``),
  batched forward on CPU. A GPU worker would put torch here; this machine has none.
- ``profile``: sleeps ``a + b * batch`` and echoes its inputs, so a simulated fleet
  follows a declared latency profile (the simulator's GPUs, over real NATS).

Either way the worker measures each batch (decode -> compute -> encode) and refits
``latency(batch) = a + b * batch`` by least squares over a sliding window, and announces
the fit in its periodic ``WorkerHello``: the router plans with what the worker really
does, not with what it was told at start.

``python -m inference.worker --nats URL --region R --model NAME --runtime numpy|profile``
runs one as an ordinary Mesh task command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from collections import deque
from dataclasses import dataclass

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg

from inference.wire import (
    BAD_REQUEST,
    DEADLINE,
    LATE_MESSAGE,
    BatchDone,
    BatchReply,
    BatchRequest,
    ConnectionArgs,
    WireError,
    WorkerHello,
    add_connection_args,
    add_event_loop_arg,
    connection_args,
    encode,
    error_bytes,
    hello_subject,
    id_token,
    ok_encoder,
    parse_batch_request,
    run,
    worker_subject,
)
from mesh.connect import ClientTls, close_quietly

log = logging.getLogger("inference.worker")

_LATE = error_bytes(DEADLINE, LATE_MESSAGE)
_EXPIRED = error_bytes(DEADLINE, "deadline cannot be met: the batch reached the worker after it")

IN_DIM = 32
HIDDEN = 64
OUT_DIM = 8


# ---------------------------------------------------------------- runtimes


@dataclass(frozen=True)
class Mlp:
    """``relu(x @ w1 + b1) @ w2 + b2`` in float32; seeded, so a test can recompute it."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    @property
    def in_dim(self) -> int:
        return self.w1.shape[0]

    @property
    def out_dim(self) -> int:
        return self.w2.shape[1]

    def forward(self, x: np.ndarray) -> np.ndarray:
        h = x @ self.w1
        h += self.b1
        np.maximum(h, 0.0, out=h)
        out = h @ self.w2
        out += self.b2
        return out


def mlp(seed: int = 0, in_dim: int = IN_DIM, hidden: int = HIDDEN, out_dim: int = OUT_DIM) -> Mlp:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return Mlp(
        w1=(rng.standard_normal((in_dim, hidden)) / np.sqrt(in_dim)).astype(f32),
        b1=(rng.standard_normal(hidden) * 0.1).astype(f32),
        w2=(rng.standard_normal((hidden, out_dim)) / np.sqrt(hidden)).astype(f32),
        b2=(rng.standard_normal(out_dim) * 0.1).astype(f32),
    )


class NumpyRuntime:
    """The real model. Inputs are float32 rows of ``in_dim``; a wrong size is an error."""

    def __init__(self, model: Mlp) -> None:
        self.model = model
        self.in_dim = model.in_dim
        self.out_dim = model.out_dim
        self._row = model.in_dim * 4

    def fits(self, data: bytes) -> bool:
        return len(data) == self._row

    async def run(self, inputs: tuple[bytes, ...] | list[bytes]) -> bytes:
        blob = b"".join(inputs)
        if len(blob) != self._row * len(inputs) or any(len(i) != self._row for i in inputs):
            raise ValueError(f"every input must be {self.in_dim} float32 ({self._row} bytes)")
        x = np.frombuffer(blob, dtype="<f4").reshape(len(inputs), self.in_dim)
        return self.model.forward(x).astype("<f4", copy=False).tobytes()


class ProfileRuntime:
    """Sleeps to a profile and echoes the inputs (so results are still checkable)."""

    def __init__(self, a_ns: int, b_ns: int, in_dim: int = 0) -> None:
        self.a_ns, self.b_ns = a_ns, b_ns
        self.in_dim = in_dim
        self.out_dim = in_dim

    def fits(self, data: bytes) -> bool:
        return not self.in_dim or len(data) == 4 * self.in_dim

    async def run(self, inputs: tuple[bytes, ...] | list[bytes]) -> bytes:
        await asyncio.sleep((self.a_ns + self.b_ns * len(inputs)) / 1e9)
        return b"".join(inputs)


# ---------------------------------------------------------------- latency fit


class LatencyFit:
    """Least squares ``ns = a + b * batch`` over the last ``window`` batches.

    Until two different batch sizes were seen, the declared profile stands. Both
    coefficients are kept >= 0 (a negative slope is noise, not physics) and the fit is
    padded by one standard deviation of its residuals: the router plans deadlines with
    it, so erring slow is the safe side.
    """

    def __init__(self, a_ns: int, b_ns: int, window: int = 512) -> None:
        self.a_ns, self.b_ns = a_ns, b_ns
        self.samples: deque[tuple[int, int]] = deque(maxlen=window)

    def add(self, batch: int, ns: int) -> None:
        self.samples.append((batch, ns))

    def refit(self) -> tuple[int, int]:
        if len(self.samples) >= 8 and len({b for b, _ in self.samples}) >= 2:
            xs = np.array([b for b, _ in self.samples], dtype=np.float64)
            ys = np.array([n for _, n in self.samples], dtype=np.float64)
            b, a = np.polyfit(xs, ys, 1)
            if b < 0:
                b, a = 0.0, float(ys.mean())
            resid = ys - (a + b * xs)
            self.a_ns = max(1_000, int(a + resid.std()))
            self.b_ns = max(0, int(b))
        return self.a_ns, self.b_ns


# ---------------------------------------------------------------- the service


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    url: str
    region: str = "local"
    tls: ClientTls | None = None  # on a secure mesh: CA, client cert/key, inbox prefix
    inbox_prefix: str = "_INBOX"
    model: str = "mlp"
    worker_id: str = ""
    runtime: str = "numpy"  # numpy | profile
    gpu_type: str = "cpu"
    a_ms: float = 0.2  # declared profile (the profile runtime sleeps to it)
    b_ms: float = 0.01
    max_batch: int = 64
    slo_ms: float = 100.0
    memory_bytes: int = 0
    hello_interval_s: float = 1.0
    seed: int = 0
    in_dim: int = IN_DIM


class Worker:
    """Serves batches on ``mesh.<r>.infer_worker.<id>`` and announces itself on
    ``mesh.<r>.infer_hello``. ``start``/``stop`` own every task; ``kill`` drops the
    connection without a goodbye, as a crash does (tests use it)."""

    def __init__(self, config: WorkerConfig, nc: Client | None = None) -> None:
        self.config = config
        self.worker_id = config.worker_id or f"w-{uuid.uuid4().hex[:8]}"
        a_ns, b_ns = int(config.a_ms * 1e6), int(config.b_ms * 1e6)
        if config.runtime == "numpy":
            self.runtime: NumpyRuntime | ProfileRuntime = NumpyRuntime(
                mlp(config.seed, in_dim=config.in_dim)
            )
        elif config.runtime == "profile":
            self.runtime = ProfileRuntime(a_ns, b_ns, config.in_dim)
        else:
            raise ValueError(f"runtime is numpy or profile, not {config.runtime!r}")
        self.fit = LatencyFit(a_ns, b_ns)
        self.nc = nc
        self._own_nc = nc is None
        self._tasks: list[asyncio.Task] = []
        self._sub = None
        self.batches = 0
        self.served = 0
        self.late = 0
        self.bad = 0
        self._ok = ok_encoder(self.worker_id)
        self._bad_input = error_bytes(
            BAD_REQUEST,
            f"input: model {config.model} takes {self.runtime.in_dim} float32 "
            f"({4 * self.runtime.in_dim} bytes)",
        )

    async def start(self) -> Worker:
        if self.nc is None:
            c = self.config
            conn = ConnectionArgs(c.url, c.region, c.tls, c.inbox_prefix)
            self.nc = await conn.connect(f"infer-worker-{self.worker_id}")
        self._sub = await self.nc.subscribe(
            worker_subject(self.config.region, self.worker_id), cb=self._on_batch
        )
        await self.nc.flush()
        await self._hello()
        self._tasks.append(asyncio.create_task(self._hello_loop(), name="worker-hello"))
        return self

    async def stop(self) -> None:
        """Graceful: say goodbye so routers stop dispatching at once, then leave."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        if self.nc is not None and self.nc.is_connected:
            with contextlib.suppress(Exception):
                await self._hello(stopping=True)
                if self._sub is not None:
                    await self._sub.unsubscribe()
                await self.nc.flush(timeout=1)
        if self._own_nc and self.nc is not None:
            await close_quietly(self.nc)

    async def kill(self) -> None:
        """A crash: no goodbye, the connection just goes (in-flight batch is lost)."""
        for t in self._tasks:
            t.cancel()
        self._tasks.clear()
        if self.nc is not None:
            await close_quietly(self.nc)

    def hello(self, stopping: bool = False) -> WorkerHello:
        a, b = self.fit.refit()
        c = self.config
        return WorkerHello(
            worker_id=self.worker_id,
            model=c.model,
            gpu_type=c.gpu_type,
            a_ns=a,
            b_ns=b,
            max_batch=c.max_batch,
            memory_bytes=c.memory_bytes,
            slo_ms=c.slo_ms,
            interval_s=c.hello_interval_s,
            in_dim=self.runtime.in_dim,
            batches=self.batches,
            stopping=stopping,
        )

    async def _hello(self, stopping: bool = False) -> None:
        await self.nc.publish(hello_subject(self.config.region), encode(self.hello(stopping)))

    async def _hello_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.hello_interval_s)
            try:
                await self._hello()
            except Exception as exc:  # disconnected: keep announcing once back
                log.debug("hello failed: %s", exc)

    async def _on_batch(self, msg: Msg) -> None:
        t0 = time.perf_counter_ns()
        if not msg.reply:
            self.bad += 1
            return
        try:
            req = parse_batch_request(msg.data)
        except WireError as exc:
            self.bad += 1
            await msg.respond(encode(BatchReply(batch_id=0, ok=False, error=str(exc)[:1000])))
            return
        n = len(req.inputs)
        problem = ""
        if req.model != self.config.model or not n or n > self.config.max_batch:
            problem = f"batch of {n} for {req.model!r} not servable here"
        elif req.replies and not len(req.replies) == len(req.deadlines_unix_ns) == n:
            problem = "replies and deadlines_unix_ns must have one entry per input"
        if problem:
            self.bad += 1
            await msg.respond(encode(BatchReply(batch_id=req.batch_id, ok=False, error=problem)))
            return
        if req.replies:
            await self._serve_direct(msg, req, t0)
            return
        try:
            out = await self.runtime.run(req.inputs)
        except ValueError as exc:
            self.bad += 1
            await msg.respond(
                encode(BatchReply(batch_id=req.batch_id, ok=False, error=str(exc)[:1000]))
            )
            return
        exec_ns = time.perf_counter_ns() - t0
        reply = encode(
            BatchReply(
                batch_id=req.batch_id, outputs=out, out_dim=self.runtime.out_dim, exec_ns=exec_ns
            )
        )
        await msg.respond(reply)
        self.fit.add(n, time.perf_counter_ns() - t0)
        self.batches += 1
        self.served += n

    async def _serve_direct(self, msg: Msg, req: BatchRequest, t0: int) -> None:
        """Run the batch and answer each client on its own reply subject: the result if
        it is done by that request's deadline (this host's wall clock), else DEADLINE.
        An input of the wrong size is answered BAD_REQUEST and not run. Then one small
        BatchDone to the router, which keeps its plan and failure detection from it."""
        fits = self.runtime.fits
        inputs, replies, dls = req.inputs, req.replies, req.deadlines_unix_ns
        idx = [i for i, x in enumerate(inputs) if fits(x)]
        bad = len(inputs) - len(idx)
        served = late = 0
        out: list[tuple[str, bytes]] = []  # (reply subject, answer)
        if bad:
            out.extend((replies[i], self._bad_input) for i, x in enumerate(inputs) if not fits(x))
        now = time.time_ns()
        if idx and all(now > dls[i] for i in idx):
            # Every deadline already passed (a batch delayed on its way, or re-sent):
            # running it would serve no one.
            out.extend((replies[i], _EXPIRED) for i in idx)
            late = len(idx)
        elif idx:
            try:
                res = await self.runtime.run([inputs[i] for i in idx] if bad else inputs)
            except ValueError as exc:
                self.bad += 1
                await msg.respond(
                    encode(BatchDone(batch_id=req.batch_id, ok=False, error=str(exc)[:1000]))
                )
                return
            size = 4 * self.runtime.out_dim  # 0: an echo of inputs of any size
            ok = self._ok
            clock = time.time_ns
            at = 0
            for i in idx:
                end = at + (size or len(inputs[i]))
                # judged answer by answer: the last of a large batch leaves a little later
                if clock() <= dls[i]:
                    served += 1
                    out.append((replies[i], ok(res[at:end])))
                else:
                    late += 1
                    out.append((replies[i], _LATE))
                at = end
        publish = self.nc.publish
        for subject, data in out:
            try:
                await publish(subject, data)
            except Exception as exc:  # a bad reply subject, or the connection going
                log.debug("answer to %r not sent: %s", subject[:80], exc)
        exec_ns = time.perf_counter_ns() - t0
        await msg.respond(
            encode(
                BatchDone(batch_id=req.batch_id, served=served, late=late, bad=bad, exec_ns=exec_ns)
            )
        )
        if idx:
            self.fit.add(len(idx), exec_ns)
        self.batches += 1
        self.served += served
        self.late += late
        self.bad += bad


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m inference.worker",
        description="Mesh inference worker (numpy or profile runtime)",
    )
    add_connection_args(p)
    add_event_loop_arg(p)
    p.add_argument("--model", default="mlp")
    p.add_argument(
        "--worker-id",
        default=os.environ.get("MESH_TASK_ID") or "",
        help="default: $MESH_TASK_ID (the agent sets it for each task) made a "
        "subject token ('.' -> '-'), else random",
    )
    p.add_argument("--runtime", choices=("numpy", "profile"), default="numpy")
    p.add_argument("--gpu-type", default="cpu")
    p.add_argument("--a-ms", type=float, default=0.2, help="declared fixed cost per batch")
    p.add_argument("--b-ms", type=float, default=0.01, help="declared cost per request")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--slo-ms", type=float, default=100.0)
    p.add_argument("--memory-bytes", type=int, default=0)
    p.add_argument("--hello-interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--in-dim", type=int, default=IN_DIM)
    return p


def parse_args(argv: list[str] | None = None) -> WorkerConfig:
    p = _parser()
    return _config(p, p.parse_args(argv))


def _config(p: argparse.ArgumentParser, a: argparse.Namespace) -> WorkerConfig:
    c = connection_args(p, a)
    try:
        worker_id = id_token(a.worker_id) if a.worker_id else ""
    except ValueError as exc:
        p.error(str(exc))
    return WorkerConfig(
        url=c.url,
        region=c.region,
        tls=c.tls,
        inbox_prefix=c.inbox_prefix,
        model=a.model,
        worker_id=worker_id,
        runtime=a.runtime,
        gpu_type=a.gpu_type,
        a_ms=a.a_ms,
        b_ms=a.b_ms,
        max_batch=a.max_batch,
        slo_ms=a.slo_ms,
        memory_bytes=a.memory_bytes,
        hello_interval_s=a.hello_interval,
        seed=a.seed,
        in_dim=a.in_dim,
    )


async def serve(config: WorkerConfig) -> None:
    worker = await Worker(config).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker {worker.worker_id} serving {config.model} ({config.runtime})", flush=True)
    await stop.wait()
    await worker.stop()
    print(
        f"worker {worker.worker_id} stopped: batches={worker.batches} "
        f"served={worker.served} late={worker.late} bad={worker.bad}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    p = _parser()
    a = p.parse_args(argv)
    run(serve(_config(p, a)), a.event_loop)


if __name__ == "__main__":
    main()
