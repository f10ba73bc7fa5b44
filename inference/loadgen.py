"""Load generator for the inference router: open-loop Poisson arrivals with deadlines,
or a closed loop of ``--concurrency`` requests in flight (for maximum throughput).

Open loop is the honest way to measure latency under load: arrivals do not wait for
answers, so a slow router meets the same offered rate as a fast one (a closed loop
hides queueing by slowing the client down). Each request carries an absolute deadline
(``deadline_unix_ns`` = send time + ``--deadline-ms``). Outcomes, judged here at the
client by its own clock:

- good: an ``ok`` answer received by the deadline
- late: an ``ok`` answer after it (the router promises there are none)
- dropped: a ``DEADLINE`` error (answered early, as designed)
- errors: any other error, a "no responders", an undecodable answer
- lost: no answer by deadline + ``--grace-s``

``bad_rate = (late + dropped + errors + lost) / sent``; ``goodput = good / duration``.
Replies come back on one wildcard inbox with no per-request future or task, so the
client costs about what the router does per request. The last line printed is one JSON
object. ``--echo`` counts any answer as good (for a plain NATS echo baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from dataclasses import dataclass

import msgpack
import numpy as np
from nats.aio.msg import Msg

from inference.wire import (
    DEADLINE,
    ConnectionArgs,
    InferReply,
    WireError,
    add_connection_args,
    add_event_loop_arg,
    connection_args,
    infer_subject,
    run,
)
from mesh.codec import from_wire, unpack
from mesh.connect import ClientTls, close_quietly

_OK = InferReply(ok=True)


@dataclass(frozen=True, slots=True)
class LoadConfig:
    url: str
    region: str = "local"
    tls: ClientTls | None = None
    inbox_prefix: str = "_INBOX"
    model: str = "mlp"
    subject: str = ""  # default: mesh.<region>.infer.<model>
    rate: float = 1000.0  # requests/s (open loop)
    concurrency: int = 0  # > 0: closed loop with this many in flight instead
    duration_s: float = 5.0
    deadline_ms: float = 100.0
    in_dim: int = 32
    grace_s: float = 0.5
    seed: int = 1
    echo: bool = False
    lat_out: str = ""  # save client latencies (ms, .npy) here, so runs can be merged
    marks: bool = False  # print "sending" and "sent" when the sending window opens/closes


def _request_head(data: bytes) -> bytes:
    """An InferRequest ``{input, v, deadline_unix_ns}`` up to the deadline's 8 bytes
    (msgpack uint64, ``0xcf`` + big-endian)."""
    packb = msgpack.packb
    return (
        b"\x83"
        + packb("input")
        + packb(data, use_bin_type=True)
        + packb("v")
        + packb(1)
        + packb("deadline_unix_ns")
        + b"\xcf"
    )


def _pct(xs: np.ndarray, p: float) -> float | None:
    return round(float(np.percentile(xs, p)), 3) if len(xs) else None


class LoadGen:
    def __init__(self, cfg: LoadConfig) -> None:
        self.cfg = cfg
        self.subject = cfg.subject or infer_subject(cfg.region, cfg.model)
        rng = np.random.default_rng(cfg.seed)
        self.inputs = [rng.standard_normal(cfg.in_dim).astype("<f4").tobytes() for _ in range(64)]
        # Each request is one of these, then its deadline as 8 bytes: the map
        # {input, v, deadline_unix_ns} encoded once, not per request.
        self._heads = [_request_head(x) for x in self.inputs]
        self._dl_ns = int(cfg.deadline_ms * 1e6)
        self._dl_s = cfg.deadline_ms / 1e3
        self.sent: dict[int, float] = {}  # i -> send time (perf_counter)
        self.lat: list[float] = []
        self.counts = dict(sent=0, good=0, late=0, dropped=0, errors=0, lost=0)
        self.codes: dict[str, int] = {}
        self.nc = None
        self._inbox = ""
        self._n = 0
        self._closed_loop_on = False
        self._cpu_s = 0.0

    async def _send(self) -> None:
        i = self._n
        self._n = i + 1
        self.sent[i] = time.perf_counter()
        data = self._heads[i & 63] + (time.time_ns() + self._dl_ns).to_bytes(8, "big")
        self.counts["sent"] += 1
        await self.nc.publish(self.subject, data, reply=self._inbox + str(i))

    async def _on_reply(self, msg: Msg) -> None:
        now = time.perf_counter()
        subject = msg.subject
        try:
            i = int(subject[subject.rfind(".") + 1 :])
        except ValueError:
            return
        t = self.sent.pop(i, None)
        if t is None:
            return  # already counted lost, or a second answer (the client keeps the first)
        c = self.counts
        lat = now - t
        if msg.headers and msg.headers.get("Status") == "503":
            c["errors"] += 1
            self.codes["NO_RESPONDERS"] = self.codes.get("NO_RESPONDERS", 0) + 1
        elif self.cfg.echo:
            c["good" if lat <= self._dl_s else "late"] += 1
            self.lat.append(lat)
        else:
            rep = self._parse(msg.data)
            if rep is None:
                c["errors"] += 1
            elif rep.ok:
                c["good" if lat <= self._dl_s else "late"] += 1
                self.lat.append(lat)
            else:
                code = rep.error.code if rep.error else "?"
                self.codes[code] = self.codes.get(code, 0) + 1
                c["dropped" if code == DEADLINE else "errors"] += 1
        if self._closed_loop_on:
            await self._send()

    @staticmethod
    def _parse(data: bytes) -> InferReply | None:
        """The common case (``ok`` with an output) checked by hand, since the client
        must not cost more per request than the router; anything else fully decoded."""
        try:
            obj = unpack(data)
        except WireError:
            return None
        if type(obj) is dict and obj.get("ok") is True and type(obj.get("output")) is bytes:
            return _OK
        try:
            return from_wire(InferReply, obj)
        except WireError:
            return None

    async def run(self) -> dict:
        cfg = self.cfg
        conn = ConnectionArgs(cfg.url, cfg.region, cfg.tls, cfg.inbox_prefix)
        self.nc = await conn.connect("infer-loadgen", pending_size=256 * 1024 * 1024)
        inbox = self.nc.new_inbox()
        self._inbox = inbox + "."
        await self.nc.subscribe(
            f"{inbox}.*",
            cb=self._on_reply,
            pending_msgs_limit=2_000_000,
            pending_bytes_limit=1024 * 1024 * 1024,
        )
        await self.nc.flush()
        if cfg.marks:
            print("sending", flush=True)
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        end = t0 + cfg.duration_s
        if cfg.concurrency > 0:
            self._closed_loop_on = True
            for _ in range(cfg.concurrency):
                await self._send()
            await asyncio.sleep(cfg.duration_s)
            self._closed_loop_on = False
        else:
            rnd = random.Random(cfg.seed)
            next_t = t0
            while True:
                now = time.perf_counter()
                if now >= end:
                    break
                while next_t <= now:
                    await self._send()
                    next_t += rnd.expovariate(cfg.rate)
                await asyncio.sleep(max(0.0, min(next_t, end) - time.perf_counter()))
        t_sent = time.perf_counter() - t0
        self._cpu_s = time.process_time() - cpu0
        if cfg.marks:
            print("sent", flush=True)
        # Wait for the stragglers, up to their deadline plus grace.
        last = max(self.sent.values(), default=0.0) + self._dl_s + cfg.grace_s
        while self.sent and time.perf_counter() < last:
            await asyncio.sleep(0.01)
        self.counts["lost"] += len(self.sent)
        self.sent.clear()
        await close_quietly(self.nc)
        return self.report(t_sent)

    def report(self, elapsed: float) -> dict:
        c = self.counts
        lat = np.array(self.lat) * 1e3
        if self.cfg.lat_out:
            np.save(self.cfg.lat_out, lat)
        bad = c["late"] + c["dropped"] + c["errors"] + c["lost"]
        answered_ok = c["good"] + c["late"]
        return {
            "mode": "closed" if self.cfg.concurrency else "open",
            "offered_rate": None if self.cfg.concurrency else self.cfg.rate,
            "concurrency": self.cfg.concurrency or None,
            "deadline_ms": self.cfg.deadline_ms,
            "duration_s": round(elapsed, 3),
            **c,
            "codes": self.codes,
            "achieved_rate": round(c["sent"] / elapsed, 1),
            "goodput": round(c["good"] / elapsed, 1),
            "ok_rate": round(answered_ok / elapsed, 1),
            "bad_rate": round(bad / c["sent"], 5) if c["sent"] else math.nan,
            "p50_ms": _pct(lat, 50),
            "p99_ms": _pct(lat, 99),
            "max_ms": round(float(lat.max()), 3) if len(lat) else None,
            # this client's own CPU while sending (what it takes from a shared machine)
            "cpu_s": round(self._cpu_s, 3),
        }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m inference.loadgen", description="open-loop Poisson load with deadlines"
    )
    add_connection_args(p)
    add_event_loop_arg(p)
    p.add_argument("--model", default="mlp")
    p.add_argument("--subject", default="", help="send here instead (e.g. an echo baseline)")
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--concurrency", type=int, default=0, help="closed loop, this many in flight")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--deadline-ms", type=float, default=100.0)
    p.add_argument("--in-dim", type=int, default=32)
    p.add_argument("--grace", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--echo", action="store_true", help="any answer is good (baseline)")
    p.add_argument("--lat-out", default="", help="save latencies (ms) to this .npy file")
    p.add_argument(
        "--marks",
        action="store_true",
        help="print 'sending' and 'sent' lines around the sending window",
    )
    return p


def parse_args(argv: list[str] | None = None) -> LoadConfig:
    p = _parser()
    return _config(p, p.parse_args(argv))


def _config(p: argparse.ArgumentParser, a: argparse.Namespace) -> LoadConfig:
    c = connection_args(p, a)
    return LoadConfig(
        url=c.url,
        region=c.region,
        tls=c.tls,
        inbox_prefix=c.inbox_prefix,
        model=a.model,
        subject=a.subject,
        rate=a.rate,
        concurrency=a.concurrency,
        duration_s=a.duration,
        deadline_ms=a.deadline_ms,
        in_dim=a.in_dim,
        grace_s=a.grace,
        seed=a.seed,
        echo=a.echo,
        lat_out=a.lat_out,
        marks=a.marks,
    )


def main(argv: list[str] | None = None) -> None:
    p = _parser()
    a = p.parse_args(argv)
    result = run(LoadGen(_config(p, a)).run(), a.event_loop)
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
