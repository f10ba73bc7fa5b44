"""`python -m bench fuzz [--cases N] [--seed S]`: hostile input against every decoder and
every API endpoint.

Two parts, each `--cases` inputs (default 10,000), drawn from one seeded generator:

1. In-process: each wire decoder (`decode(cls, data)` for every message that arrives
   from the network), the job spec and pool tree parsers (YAML text and decoded
   mappings), the client's reply decoder, and the receive paths that count and drop bad
   messages (a coordinator's node-state path `bad_states`, the leader's task-event path
   `bad_events`, the agent's assignment feed `rejected`, the log follower
   `bad_entries`). A case passes when it ends in the target's own error type
   (WireError, SpecError, PoolConfigError, ApiError) or in a valid value.
2. Live: a real nats-server child and a `mesh coordinator` child process; every endpoint
   of the request API gets its share of the cases over one connection, one request at
   a time. A case passes when the reply decodes and its error code is not INTERNAL (nor
   NOT_LEADER/UNAVAILABLE: the leader lost its lease while busy). A valid request
   (`cluster.info`) follows every 50 cases; the job log may grow only by the writes
   that were acknowledged as such.

Crashes (any other exception, a dead service, an INTERNAL reply) must be 0. The
coordinator's RSS is sampled after a warm-up and at the end.

The generators here are also used by tests/integration/test_fuzz_api.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from mesh.codec import MAX_MESSAGE, WireError, decode, encode
from mesh.schema import (
    MAX_BATCH,
    Assignment,
    AssignmentBatch,
    BreakGlassRequest,
    BreakGlassSet,
    HostsRequest,
    JobListRequest,
    JobRef,
    KillRequest,
    LeaderElected,
    LogEntry,
    LogsRequest,
    NodePartitionSet,
    NodeRef,
    NodeState,
    PartitionApplyRequest,
    PartitionMoveRequest,
    PartitionRef,
    PoolApplyRequest,
    PoolRef,
    Resources,
    RestoreRequest,
    ScaleRequest,
    SubmitManyRequest,
    SubmitRequest,
    TaskEvent,
    TaskEventBatch,
    TaskSpec,
    UpdateRequest,
)
from workloads.lifecycle import TaskState
from workloads.quantity import SpecError
from workloads.spec import JOB_FIELDS, MAX_SOURCE_BYTES, parse_job_spec

REGION = "fuzz"

# --------------------------------------------------------------------------- samples

VALID_SPEC = """\
name: train
pool: /
priority: 5
max_run_time: 1h
restart: {max_retries: 2}
labels: {team: ml, tier: 1}
placement: {strategy: spread, spread_by: zone, gang: true}
tasks:
  - role: ps
    count: 2
    command: [python, -m, ps, --port, 80]
    env: {A: x, PORT: 80}
    resources: {cpu: 500m, memory: 1Gi}
  - role: worker
    simulate: {duration: 2s, exit_code: 0}
    resources: {cpu: 1, memory: 64Mi, gpu: 1, gpu_memory: 2Gi}
"""

VALID_POOLS = """\
pools:
  /ml:
    type: elastic
    share: 2
    description: machine learning
    cpu: {reservation: 2, limit: 8, share: 2}
    memory: {reservation: 1Gi, limit: 16Gi}
    gpu: {reservation: 1}
  /ml/vision:
    gpu: {reservation: 1, limit: 2, type: static}
  /batch: {}
"""

_SPEC_FIELDS = list(JOB_FIELDS)  # the fields a job spec may have


def _samples() -> dict[type, list[Any]]:
    spec = TaskSpec(("/bin/true",), {"A": "1"}, "/tmp", Resources(cpu=100, memory=1 << 20))
    return {
        NodeState: [
            NodeState(
                "n1",
                "r",
                1,
                1.0,
                Resources(cpu=4000, memory=8 << 30),
                zone="z",
                labels={"a": "b"},
                tasks=("t#0",),
            ),
        ],
        TaskEvent: [TaskEvent("n1", "j1", "j1.main.0", 0, ts=1.0, exit_code=0, message="m")],
        TaskEventBatch: [
            TaskEventBatch(
                "n1",
                (
                    TaskEvent("n1", "j1", "j1.main.0", 0, TaskState.RUNNING, 1.0),
                    TaskEvent("n1", "j1", "j1.main.1", 0, ts=1.0, exit_code=0, message="m"),
                ),
            ),
        ],
        Assignment: [
            Assignment("run", "n1", "j1", "j1.main.0", 0, 1, 1.0, spec, signature=b"s" * 64),
            Assignment("kill", "n1", "j1", "j1.main.0", 1, 2, 1.0),
        ],
        AssignmentBatch: [
            AssignmentBatch(
                "n1",
                (
                    Assignment("run", "n1", "j1", "j1.main.0", 0, 1, 1.0, spec),
                    Assignment("run", "n1", "j1", "j1.main.1", 0, 1, 1.0, spec),
                ),
                signature=b"s" * 64,
            ),
        ],
        LogEntry: [
            LogEntry(1, "c1", (LeaderElected(1, "c1", 1.0),)),
            LogEntry(
                1,
                "c1",
                (
                    BreakGlassSet("stateless", ("n1",), "outage", "ops", 0.0, 1.0),
                    NodePartitionSet("n1", "stateless", "break-glass", True, 1.0, "batch"),
                ),
            ),
        ],
        SubmitRequest: [SubmitRequest("cid-1", VALID_SPEC), SubmitRequest("cid-2", {"name": "x"})],
        SubmitManyRequest: [SubmitManyRequest((SubmitRequest("cid-3", VALID_SPEC),) * 2)],
        JobRef: [JobRef("train-0000")],
        JobListRequest: [JobListRequest("PENDING", "/", 5)],
        KillRequest: [KillRequest("train-0000", "why")],
        UpdateRequest: [UpdateRequest("train-0000", VALID_SPEC)],
        NodeRef: [NodeRef("n1")],
        LogsRequest: [LogsRequest("j1.main.0", 0, "stderr", 100)],
        PoolApplyRequest: [PoolApplyRequest(VALID_POOLS)],
        PoolRef: [PoolRef("/ml")],
        PartitionRef: [PartitionRef("batch")],
        PartitionApplyRequest: [PartitionApplyRequest("partitions: {stateless: {}, batch: {}}")],
        PartitionMoveRequest: [PartitionMoveRequest(("n1",), "stateless", "drill", "ops")],
        BreakGlassRequest: [BreakGlassRequest("stateless", None, 600.0, "outage", "ops")],
        RestoreRequest: [RestoreRequest("over", "ops")],
        ScaleRequest: [ScaleRequest("train-0000", 2, "smaller", "ops")],
        HostsRequest: [HostsRequest("train-0000", "horovod")],
    }


SAMPLES = _samples()
WIRE_CLASSES = list(SAMPLES)  # every message a process decodes from the network

# --------------------------------------------------------------------------- msgpack


def _scalar(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            2**63 - 1,
            -(2**63),
            2**64 - 1,
            0.5,
            -1e308,
            1e308,
            float("nan"),
            float("inf"),
            "",
            "x",
            "PENDING",
            "run",
            "/",
            "\x00",
            "é" * 3,
            "a" * rng.choice([63, 64, 65, 128, 129, 1025, 4097]),
            b"",
            b"\xff" * 3,
            rng.randrange(-(2**63), 2**64),
            rng.random() * 10 ** rng.randrange(-5, 300),
            rng.choice(_SPEC_FIELDS),
        ]
    )


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A random msgpack-able value: scalars, lists and maps with odd keys."""
    r = rng.random()
    if depth > 4 or r < 0.55:
        return _scalar(rng)
    n = rng.randrange(0, 6)
    if r < 0.75:
        return [random_value(rng, depth + 1) for _ in range(n)]
    keys = [rng.choice(_SPEC_FIELDS), _scalar(rng)]
    out = {}
    for _ in range(n):
        k = rng.choice(keys)
        if isinstance(k, float) and k != k:  # NaN keys never compare equal; fine but noisy
            k = 0.0
        out[k] = random_value(rng, depth + 1)
    return out


def _nested(rng: random.Random, depth: int) -> Any:
    obj: Any = rng.choice([None, 1, "x"])
    for _ in range(depth):
        obj = [obj] if rng.random() < 0.5 else {"k": obj}
    return obj


def _nested_bytes(depth: int, kind: str = "array") -> bytes:
    """msgpack of `depth` nested one-item arrays/maps, deeper than msgpack can unpack."""
    head = b"\x91" if kind == "array" else b"\x81\xa1k"
    return head * depth + b"\xc0"


def _mutate(obj: Any, rng: random.Random) -> Any:
    """Replace, drop or add one value somewhere inside `obj`."""
    if isinstance(obj, dict) and obj and rng.random() < 0.7:
        out = dict(obj)
        key = rng.choice(list(out))
        r = rng.random()
        if r < 0.15:
            del out[key]
        elif r < 0.25:
            out[rng.choice(_SPEC_FIELDS + ["_t", "v", "zzz"])] = random_value(rng)
        else:
            out[key] = _mutate(out[key], rng)
        return out
    if isinstance(obj, list) and obj and rng.random() < 0.7:
        out = list(obj)
        i = rng.randrange(len(out))
        out[i] = _mutate(out[i], rng)
        return out
    return random_value(rng)


def _to_plain(msg: Any) -> Any:
    from mesh.codec import to_wire

    return to_wire(msg)


_OVERSIZED: dict[int, bytes] = {}


def oversized(limit: int) -> bytes:
    """A valid msgpack map just over `limit` bytes (cached: it is big)."""
    if limit not in _OVERSIZED:
        pad = "x" * (limit + 1)
        _OVERSIZED[limit] = msgpack.packb({"client_id": "a", "spec": pad}, use_bin_type=True)
    return _OVERSIZED[limit]


def wire_case(
    rng: random.Random,
    cls: type,
    limit: int = MAX_MESSAGE,
    yaml_case: Callable[[random.Random], Any] | None = None,
) -> tuple[str, bytes]:
    """One hostile encoding of a `cls` message: (kind, bytes)."""
    sample = rng.choice(SAMPLES[cls])
    plain = _to_plain(sample)
    kind = rng.choice(
        [
            "bytes",
            "truncated",
            "mutated",
            "mutated",
            "mutated",
            "wrongtype",
            "nested",
            "fields",
            "random",
            "oversized_field",
        ]
        + (["yaml", "yaml"] if yaml_case is not None else [])
    )
    if rng.random() < 0.01:
        kind = "oversized"
    if kind == "bytes":
        data = rng.randbytes(rng.randrange(0, 300))
    elif kind == "truncated":
        full = encode(sample)
        data = full[: rng.randrange(0, len(full))]
    elif kind == "mutated":
        data = msgpack.packb(_mutate(plain, rng), use_bin_type=True)
    elif kind == "wrongtype":
        data = msgpack.packb(
            rng.choice([None, 1, "x", [plain], [], 1.5, b"x", True]), use_bin_type=True
        )
    elif kind == "nested":
        depth = rng.choice([33, 40, 200, 1500, 5000])
        if rng.random() < 0.5:
            data = _nested_bytes(depth, rng.choice(["array", "map"]))
        else:  # inside a field (free-form ones: spec, source; or any other)
            out = dict(plain)
            out[rng.choice(list(out) or ["spec"])] = _nested(rng, min(depth, 400))
            data = msgpack.packb(out, use_bin_type=True)
    elif kind == "fields":  # a map of this schema's field names, random values
        out = {k: random_value(rng) for k in plain if rng.random() < 0.8}
        data = msgpack.packb(out, use_bin_type=True)
    elif kind == "oversized_field":
        out = dict(plain)
        key = rng.choice(list(out))
        big = rng.choice(
            [
                "y" * rng.choice([129, 1025, 4097, 65_537]),
                ["z"] * rng.choice([65, 129, 4097, 10_001]),
                {f"k{i}": "v" for i in range(rng.choice([65, 129, 10_001]))},
            ]
        )
        out[key] = big
        data = msgpack.packb(out, use_bin_type=True)
    elif kind == "yaml":
        assert yaml_case is not None
        out = dict(plain)
        field = "source" if cls is PoolApplyRequest else "spec"
        if cls is SubmitManyRequest:
            n = rng.choice([1, 2, 3, MAX_BATCH + 1])
            if n > 3:  # over the batch limit: small items, or the request is a gigabyte
                yaml_case = lambda r: "name: x"  # noqa: E731
            items = [
                {"client_id": f"fz-{rng.random()}", "spec": yaml_case(rng)}
                for _ in range(min(n, 3))
            ]
            out["jobs"] = items * (n // len(items)) + items[: n % len(items)]
        else:
            out[field] = yaml_case(rng)
            if "client_id" in out:
                out["client_id"] = f"fz-{rng.random()}"
        data = msgpack.packb(out, use_bin_type=True)
    elif kind == "oversized":
        data = oversized(limit)
    else:
        data = msgpack.packb(random_value(rng), use_bin_type=True)
    return kind, data


# --------------------------------------------------------------------------- YAML

_SPECIALS = list(":-[]{},&*!|>'\"%@`#?\n\t ") + ["<<", "---", "...", "\\x00", "~", "\ufeff"]


def anchor_bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs" list: `width ** levels` items in a few hundred bytes of YAML
    (one flow list whose items define and use the anchors in order)."""
    items = [f"&l0 [x{',x' * (width - 1)}]"]
    for i in range(1, levels):
        items.append(f"&l{i} [{','.join([f'*l{i - 1}'] * width)}]")
    return "[" + ", ".join(items) + "]"


_BOMB = anchor_bomb()
_BOMB_SLOTS_SPEC = [
    "name: {b}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\nmax_run_time: {b}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\nlabels: {{a: {b}}}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\ntasks: [{{role: a, command: {b}}}]\n",
    "name: x\ntasks: [{{role: a, command: x, resources: {{cpu: {b}}}}}]\n",
    "name: x\ntasks: [{{role: a, command: x, resources: {{memory: {b}}}}}]\n",
    "name: x\ntasks: [{{role: a, command: x, env: {{A: {b}}}}}]\n",
    "name: x\ntasks: [{{role: a, simulate: {{duration: {b}}}}}]\n",
    "name: x\ntasks: {b}\n",
    "name: x\npriority: {b}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\nplacement: {{strategy: {b}}}\ntasks: [{{role: a, command: x}}]\n",
]
_BOMB_SLOTS_POOLS = [
    "pools:\n  /a: {{type: {b}}}\n",
    "pools:\n  /a: {{share: {b}}}\n",
    "pools:\n  /a: {{description: {b}}}\n",
    "pools:\n  /a: {{cpu: {{reservation: {b}}}}}\n",
    "pools:\n  /a: {{gpu: {{limit: {b}, share: {b}, type: {b}}}}}\n",
    "pools: {b}\n",
    "pools:\n  /a: {b}\n",
]


_SCALAR_SLOTS_SPEC = [
    "name: x\npriority: {v}\ntasks: [{{role: a, command: x}}]\n",
    "name: {v}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\nmax_run_time: {v}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\n{v}: 1\ntasks: [{{role: a, command: x}}]\n",
    "name: x\nlabels: {{a: {v}}}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\nlabels: {{{v}: a}}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\ntasks: [{{role: a, command: [x, {v}], env: {{A: {v}}}}}]\n",
    "name: x\ntasks: [{{role: a, command: x, env: {{{v}: a}}}}]\n",
    "name: x\ntasks: [{{role: a, count: {v}, command: x}}]\n",
    "name: x\ntasks: [{{role: a, command: x, resources: {{cpu: {v}}}}}]\n",
    "name: x\ntasks: [{{role: a, command: x, resources: {{memory: {v}}}}}]\n",
    "name: x\ntasks: [{{role: a, simulate: {{duration: {v}, exit_code: {v}}}}}]\n",
    "name: x\nmin_tasks: {v}\ntasks: [{{role: a, command: x}}]\n",
    "name: x\nrestart: {{max_retries: {v}}}\ntasks: [{{role: a, command: x}}]\n",
]
_SCALAR_SLOTS_POOLS = [
    "pools:\n  /a: {{share: {v}}}\n",
    "pools:\n  /a: {{cpu: {{reservation: {v}, limit: {v}}}}}\n",
    "pools:\n  {v}: {{}}\n",
    "pools:\n  /a: {{{v}: 1}}\n",
    "pools:\n  /a: {{cpu: {{{v}: 1}}}}\n",
    "{v}: 1\n",
    "pools:\n  /a: {{description: {v}, type: {v}}}\n",
]


def _mutate_text(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randrange(1, 6)):
        i = rng.randrange(len(chars) + 1)
        r = rng.random()
        if r < 0.4 and chars:
            chars[min(i, len(chars) - 1)] = rng.choice(_SPECIALS)
        elif r < 0.7:
            chars.insert(i, rng.choice(_SPECIALS))
        elif chars:
            del chars[min(i, len(chars) - 1)]
    return "".join(chars)


def yaml_text(
    rng: random.Random, pools: bool = False, max_bytes: int = MAX_SOURCE_BYTES
) -> tuple[str, str]:
    """One hostile YAML document for a job spec (or a pool tree): (kind, text)."""
    valid = VALID_POOLS if pools else VALID_SPEC
    kind = rng.choice(
        [
            "random",
            "truncated",
            "mutated",
            "mutated",
            "nested",
            "duplicate",
            "bomb",
            "scalar",
            "tags",
            "wide",
        ]
    )
    if rng.random() < 0.01:
        kind = "huge"
    if kind == "random":
        n = rng.randrange(0, 200)
        text = "".join(rng.choice(_SPECIALS + list("abcxyz019/")) for _ in range(n))
    elif kind == "truncated":
        text = valid[: rng.randrange(0, len(valid))]
    elif kind == "mutated":
        text = _mutate_text(valid, rng)
    elif kind == "nested":
        depth = rng.choice([50, 999, 1001, 5000, 20_000])
        style = rng.choice(["flow_list", "flow_map", "block", "in_field"])
        if style == "flow_list":
            text = "[" * depth + "]" * depth
        elif style == "flow_map":
            text = "{a: " * depth + "1" + "}" * depth
        elif style == "block":
            d = min(depth, 300)  # block nesting costs indentation: quadratic text
            text = "".join(" " * i + "- \n" for i in range(d))
        else:
            text = ("pools:\n  /a:\n    cpu: " if pools else "name: x\ntasks: ") + "[" * depth
    elif kind == "duplicate":
        key = rng.choice(["name", "tasks", "pools", "  /ml", "priority"])
        text = valid + f"\n{key}: 1\n" if not key.startswith(" ") else valid + f"{key}: {{}}\n"
        if rng.random() < 0.5:
            text = valid.replace("cpu:", "cpu: 1\n    cpu:", 1)
    elif kind == "bomb":
        slot = rng.choice(_BOMB_SLOTS_POOLS if pools else _BOMB_SLOTS_SPEC)
        text = slot.format(b=_BOMB)
    elif kind == "scalar":
        value = rng.choice(
            [
                "1" * rng.choice([4301, 5000, 20_000]),
                "0x" + "f" * rng.choice([1100, 5000, 20_000]),
                "0o" + "7" * 5000,
                "-0x" + "f" * 5000,
                "2001-13-45",
                "2001-02-30 25:61:61",
                "!!binary '!!!'",
                "!!float x",
                "!!int 0x",
                "1e99999",
                ".nan",
                "-.inf",
                "!!timestamp 1",
            ]
        )
        slots = _SCALAR_SLOTS_POOLS if pools else _SCALAR_SLOTS_SPEC
        text = rng.choice(slots).format(v=value)
    elif kind == "tags":
        tag = rng.choice(
            [
                "!!python/object:os.system",
                "!!python/name:os.system",
                "!custom",
                "!!set",
                "!!omap",
                "!!pairs",
                "!<tag:x>",
                "!!map",
                "!!seq",
                "!!str",
            ]
        )
        text = valid.replace(
            "tasks:" if not pools else "pools:",
            ("tasks: " if not pools else "pools: ") + tag + "\n",
            1,
        )
    elif kind == "wide":  # many tiny values (the MAX_YAML_NODES case), cut down
        n = rng.choice([100, 1000, 5000, 20_000, 120_000])
        text = (
            ("pools:\n  /a: {description: [" if pools else "name: x\ntasks: [")
            + ",".join(["a"] * n)
            + "]"
            + ("}\n" if pools else "\n")
        )
    else:  # huge: a comment over the limit costs little to make and nothing to refuse
        text = valid + "#" + "x" * (max_bytes + 1 - len(valid))
    if rng.random() < 0.05:
        text = "\ufeff" + text
    return kind, text


def spec_input(rng: random.Random, pools: bool = False) -> tuple[str, Any]:
    """A YAML text, bytes, or an already-decoded mapping (as the API receives it)."""
    r = rng.random()
    if r < 0.7:
        return yaml_text(rng, pools)
    if r < 0.8:
        kind, text = yaml_text(rng, pools)
        data = text.encode("utf-8", "surrogatepass")
        if rng.random() < 0.3:
            data = data + b"\xff\xfe"
        return f"bytes_{kind}", data
    import yaml

    base = yaml.safe_load(VALID_POOLS if pools else VALID_SPEC)
    return "mapping", _mutate(base, rng) if rng.random() < 0.8 else random_value(rng)


# --------------------------------------------------------------------------- in process


class _Msg:
    """What the receive paths read of a nats message."""

    def __init__(self, subject: str, data: bytes, seq: int = 0) -> None:
        self.subject = subject
        self.data = data
        self.reply = ""
        self.terminated = False
        self.metadata = type("Meta", (), {"sequence": type("Seq", (), {"stream": seq})()})()

    async def term(self) -> None:
        self.terminated = True

    async def ack(self) -> None:
        pass

    async def nak(self, delay: float | None = None) -> None:
        pass


class Receivers:
    """The coordinator's, leader's, follower's and agent's receive paths, without NATS."""

    def __init__(self) -> None:
        from agent.link import AssignmentFeed
        from coordinator.joblog import LogFollower
        from coordinator.leader import Leader
        from coordinator.service import Coordinator, CoordinatorConfig

        self.coord = Coordinator(CoordinatorConfig("nats://127.0.0.1:1", region=REGION))
        self.leader = Leader(self.coord, term=1)
        self.follower = LogFollower(None, REGION, self.coord.state)
        self.handled: list[Any] = []

        async def handler(a: Any) -> None:
            self.handled.append(a)

        self.feed = AssignmentFeed(None, REGION, "n1", handler)

    async def state(self, data: bytes) -> bool:
        from mesh import subjects

        before = self.coord.bad_states
        await self.coord._on_state(_Msg(subjects.state(REGION, "n1"), data))
        return self.coord.bad_states > before

    async def events(self, data: bytes) -> bool:
        from mesh import subjects

        before = self.leader.bad_events
        await self.leader._handle_events([_Msg(subjects.events(REGION, "n1"), data)])
        return self.leader.bad_events > before

    async def log(self, data: bytes, seq: int) -> bool:
        before = self.follower.bad_entries
        await self.follower._on_msg(_Msg("x", data, seq))
        return self.follower.bad_entries > before

    async def assignment(self, data: bytes) -> bool:
        before = self.feed.rejected
        await self.feed._handle(_Msg("x", data))
        return self.feed.rejected > before


def _parse_pools(source: Any) -> Any:
    from coordinator.pools import parse_pool_tree

    return parse_pool_tree(source)


def _client_reply(data: bytes) -> Any:
    from mesh.client import _reply

    return _reply(data)


class _Never(Exception):
    """The receive paths raise nothing: they count and drop."""


class Tally:
    def __init__(self) -> None:
        self.cases: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.crashes: list[dict] = []
        self.slowest: dict[str, tuple[float, str]] = {}

    def record(
        self, target: str, kind: str, seconds: float, rejected: bool, crash: str | None = None
    ) -> None:
        self.cases[target] += 1
        self.rejected[target] += rejected
        if seconds > self.slowest.get(target, (0.0, ""))[0]:
            self.slowest[target] = (seconds, kind)
        if crash is not None:
            self.crashes.append({"target": target, "kind": kind, "error": crash[:300]})


def run_in_process(cases: int, rng: random.Random) -> Tally:
    """`cases` hostile inputs spread over every in-process target."""
    from coordinator.pools import PoolConfigError
    from mesh.schema import ApiError

    tally = Tally()
    recv = Receivers()
    targets: list[tuple[str, Callable[[], tuple[str, Any]], Callable[[Any], Any], type]] = []
    for cls in WIRE_CLASSES:
        targets.append(
            (
                f"decode:{cls.__name__}",
                lambda cls=cls: wire_case(rng, cls, yaml_case=lambda r: spec_input(r)[1]),
                lambda data, cls=cls: decode(cls, data),
                WireError,
            )
        )
    targets += [
        ("parse_job_spec", lambda: spec_input(rng), parse_job_spec, SpecError),
        ("parse_pool_tree", lambda: spec_input(rng, pools=True), _parse_pools, PoolConfigError),
        ("client.reply", lambda: wire_case(rng, JobRef), _client_reply, ApiError),
    ]
    loop = asyncio.new_event_loop()
    seq = [0]

    def via(fn):
        return lambda data: loop.run_until_complete(asyncio.wait_for(fn(data), 10.0))

    def log_path(data: bytes) -> Any:
        seq[0] += 1
        return loop.run_until_complete(asyncio.wait_for(recv.log(data, 10**9 + seq[0]), 10.0))

    targets += [
        ("coordinator.state", lambda: wire_case(rng, NodeState), via(recv.state), _Never),
        ("leader.events", lambda: wire_case(rng, TaskEvent), via(recv.events), _Never),
        ("leader.event_batch", lambda: wire_case(rng, TaskEventBatch), via(recv.events), _Never),
        ("follower.log", lambda: wire_case(rng, LogEntry), log_path, _Never),
        ("agent.assignment", lambda: wire_case(rng, Assignment), via(recv.assignment), _Never),
        (
            "agent.assignment_batch",
            lambda: wire_case(rng, AssignmentBatch),
            via(recv.assignment),
            _Never,
        ),
    ]
    logging.disable(logging.CRITICAL)  # the receive paths log every message they drop
    try:
        for i in range(cases):
            name, make, call, expected = targets[i % len(targets)]
            kind, data = make()
            t0 = time.perf_counter()
            rejected, crash = False, None
            try:
                out = call(data)
                rejected = out is True  # the receive paths say whether they dropped it
            except expected:
                rejected = True
            except Exception as exc:  # a crash: anything but the target's own error
                crash = f"{type(exc).__name__}: {exc}"
            tally.record(name, kind, time.perf_counter() - t0, rejected, crash)
    finally:
        logging.disable(logging.NOTSET)
        loop.close()
    return tally


# --------------------------------------------------------------------------- live API

API_LIMIT = 1024 * 1024
API_TARGETS: dict[str, type | None] = {
    "job.submit": SubmitRequest,
    "job.submit_many": SubmitManyRequest,
    "job.get": JobRef,
    "job.list": JobListRequest,
    "job.kill": KillRequest,
    "node.list": None,
    "node.get": NodeRef,
    "cluster.info": None,
    "region.list": None,
    "site.list": None,
    "pool.apply": PoolApplyRequest,
    "pool.list": None,
    "pool.get": PoolRef,
    "job.update": UpdateRequest,
    "partition.list": None,
    "partition.get": PartitionRef,
    "partition.apply": PartitionApplyRequest,
    "partition.move": PartitionMoveRequest,
    "partition.break_glass": BreakGlassRequest,
    "partition.restore": RestoreRequest,
    "job.scale": ScaleRequest,
    "job.hosts": HostsRequest,
}
WRITE_ENDPOINTS = (
    "job.submit",
    "job.submit_many",
    "job.kill",
    "job.update",
    "pool.apply",
    "partition.apply",
    "partition.move",
    "partition.break_glass",
    "partition.restore",
    "job.scale",
)
BAD_CODES = ("INTERNAL", "NOT_LEADER", "UNAVAILABLE")


def api_case(rng: random.Random, endpoint: str) -> tuple[str, bytes]:
    cls = API_TARGETS[endpoint]
    if cls is None:  # endpoints that read no request: anything goes
        return wire_case(rng, JobRef, limit=API_LIMIT)
    pools = cls is PoolApplyRequest
    return wire_case(rng, cls, limit=API_LIMIT, yaml_case=lambda r: spec_input(r, pools=pools)[1])


def wrote(endpoint: str, reply: dict) -> int:
    """How many log entries an acknowledged reply stands for (requests are sequential)."""
    if not reply.get("ok") or endpoint not in WRITE_ENDPOINTS:
        return 0
    if endpoint == "job.submit":
        return 0 if reply.get("duplicate") else 1
    if endpoint == "job.submit_many":
        fresh = [r for r in reply.get("results", []) if "job_id" in r and not r["duplicate"]]
        return 1 if fresh else 0
    if endpoint == "job.scale":
        return 0 if reply.get("workers") == reply.get("was") else 1
    return 1  # job.kill of a live job, pool.apply: one append each (kill may be 0; see below)


class ApiFuzzer:
    """Send hostile requests over one connection and judge each reply."""

    def __init__(self, nc: Any, region: str, rng: random.Random, timeout: float = 10.0) -> None:
        from mesh import subjects

        self.nc = nc
        self.prefix = subjects.api_prefix(region)
        self.rng = rng
        self.timeout = timeout
        self.tally = Tally()
        self.codes: Counter[str] = Counter()
        self.ok_writes = 0
        self.liveness_failures = 0

    async def request(self, endpoint: str, data: bytes) -> dict:
        from mesh.codec import unpack

        msg = await self.nc.request(f"{self.prefix}.{endpoint}", data, timeout=self.timeout)
        # A request that looks like JSON (first byte `{` after white space) is answered
        # in JSON (mesh.jsonwire); random bytes can start so.
        reply = json.loads(msg.data) if msg.data[:1] == b"{" else unpack(msg.data)
        if not isinstance(reply, dict):
            raise TypeError(f"reply is {type(reply).__name__}, not a map")
        return reply

    async def alive(self) -> bool:
        try:
            reply = await self.request("cluster.info", b"\x80")
            return bool(reply.get("ok")) and reply.get("leader") is not None
        except Exception:
            return False

    async def one(self, endpoint: str) -> None:
        kind, data = api_case(self.rng, endpoint)
        if len(data) > 4 * API_LIMIT:  # past what the server lets a client publish
            kind, data = "oversized", oversized(API_LIMIT)
        t0 = time.perf_counter()
        crash = None
        rejected = False
        try:
            reply = await self.request(endpoint, data)
            if reply.get("ok"):
                self.codes["ok"] += 1
                self.ok_writes += wrote(endpoint, reply)
            else:
                code = str((reply.get("error") or {}).get("code"))
                self.codes[code] += 1
                rejected = True
                if code in BAD_CODES:
                    crash = f"{code}: {(reply.get('error') or {}).get('message')}"
        except Exception as exc:
            crash = f"{type(exc).__name__}: {exc}"
        self.tally.record(f"api:{endpoint}", kind, time.perf_counter() - t0, rejected, crash)

    async def run(self, cases: int, check_every: int = 50) -> None:
        endpoints = list(API_TARGETS)
        for i in range(cases):
            await self.one(endpoints[i % len(endpoints)])
            if (i + 1) % check_every == 0 and not await self.alive():
                self.liveness_failures += 1
                self.tally.crashes.append(
                    {
                        "target": "api",
                        "kind": "liveness",
                        "error": f"cluster.info failed after case {i}",
                    }
                )


async def _live(cases: int, seed: int, work: Path) -> dict:
    import psutil

    from bench._util import mesh_command, spawn, stop_process
    from mesh import subjects
    from mesh.connect import close_quietly, connect
    from mesh.server import EmbeddedServer, ServerConfig

    server = EmbeddedServer(ServerConfig(store_dir=str(work / "nats")))
    server.start()
    proc = spawn(mesh_command(server.url, REGION, "coordinator", "--id", "c1"), work / "coord.log")
    nc = None
    try:
        nc = await connect(server.url, name="bench-fuzz")
        js = nc.jetstream(timeout=10.0)
        fz = ApiFuzzer(nc, REGION, random.Random(seed + 1))
        deadline = time.monotonic() + 60
        while not await fz.alive():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"coordinator not ready; see {work / 'coord.log'}")
            await asyncio.sleep(0.25)
        pinfo = psutil.Process(proc.pid)
        # warm-up: one of each, so imports and caches do not count as growth
        for endpoint in API_TARGETS:
            await fz.one(endpoint)
        rss0 = pinfo.memory_info().rss
        seq0 = (await js.stream_info(subjects.log_stream(REGION))).state.last_seq
        writes0 = fz.ok_writes
        t0 = time.perf_counter()
        samples = []
        for start in range(0, cases, 1000):  # RSS after each 1000: a leak is a trend
            await fz.run(min(1000, cases - start))
            if proc.poll() is None:
                samples.append(round(pinfo.memory_info().rss / 2**20, 1))
        took = time.perf_counter() - t0
        alive = proc.poll() is None and await fz.alive()
        rss1 = pinfo.memory_info().rss if proc.poll() is None else 0
        seq1 = (await js.stream_info(subjects.log_stream(REGION))).state.last_seq
        info = await fz.request("cluster.info", b"\x80")
    finally:
        if nc is not None:
            await close_quietly(nc)
        stop_process(proc, timeout=20)
        server.stop()
    # leadership changes and errors the coordinator logged (its log goes with the temp dir)
    notes = [
        line.strip()[:300]
        for line in (work / "coord.log").read_text(errors="replace").splitlines()
        if any(w in line for w in ("lead", "lease", "step", "fenced", "Traceback", "ERROR"))
    ]
    writes = fz.ok_writes - writes0
    if seq1 - seq0 > writes:  # entries nobody acknowledged: bad input changed state
        fz.tally.crashes.append(
            {
                "target": "api",
                "kind": "state",
                "error": f"log grew by {seq1 - seq0}, {writes} acked writes",
            }
        )
    if not alive:
        fz.tally.crashes.append({"target": "api", "kind": "liveness", "error": "service dead"})
    return {
        "tally": fz.tally,
        "codes": dict(fz.codes),
        "seconds": round(took, 2),
        "alive": alive,
        "log_seq_before": seq0,
        "log_seq_after": seq1,
        "acked_writes": writes,
        "leader_term": info.get("term"),
        "rss_mb_before": round(rss0 / 2**20, 1),
        "rss_mb_after": round(rss1 / 2**20, 1),
        "rss_growth_mb": round((rss1 - rss0) / 2**20, 1),
        "rss_mb_per_1000_cases": samples,
        "coordinator_log_notes": notes[-20:],
    }


# --------------------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=10_000, help="cases per part (in-process, API)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-live", action="store_true", help="in-process targets only")
    p.add_argument("--no-local", action="store_true", help="live API targets only")
    p.add_argument("--quick", action="store_true", help="a smoke run: 300 cases per part")
    args = p.parse_args(argv)
    if args.quick:
        args.cases = 300
    return args


def _summary(tally: Tally) -> dict:
    return {
        t: {
            "cases": n,
            "rejected": tally.rejected[t],
            "slowest_ms": round(tally.slowest.get(t, (0.0, ""))[0] * 1000, 1),
            "slowest_kind": tally.slowest.get(t, (0.0, ""))[1],
        }
        for t, n in sorted(tally.cases.items())
    }


def main(argv: list[str]) -> dict:
    args = parse(argv)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    local = run_in_process(0 if args.no_local else args.cases, rng)
    local_s = time.perf_counter() - t0
    print(
        f"in-process: {sum(local.cases.values())} cases in {local_s:.1f}s, "
        f"{len(local.crashes)} crashes"
    )
    for target, row in _summary(local).items():
        print(f"  {target:28s} {row}")
    for c in local.crashes[:20]:
        print("  CRASH", c)
    result: dict[str, Any] = {
        "seed": args.seed,
        "in_process": {
            "cases": sum(local.cases.values()),
            "crashes": len(local.crashes),
            "seconds": round(local_s, 2),
            "targets": _summary(local),
            "crash_samples": local.crashes[:10],
        },
    }
    crashes = len(local.crashes)
    if not args.no_live:
        with tempfile.TemporaryDirectory(prefix="mesh-bench-fuzz-") as d:
            live = asyncio.run(_live(args.cases, args.seed, Path(d)))
        tally = live.pop("tally")
        print(
            f"live API: {sum(tally.cases.values())} cases in {live['seconds']}s, "
            f"{len(tally.crashes)} crashes; replies {live['codes']}"
        )
        for target, row in _summary(tally).items():
            print(f"  {target:28s} {row}")
        for c in tally.crashes[:20]:
            print("  CRASH", c)
        print(
            f"  log seq {live['log_seq_before']} -> {live['log_seq_after']} "
            f"({live['acked_writes']} acknowledged writes); coordinator rss "
            f"{live['rss_mb_before']} -> {live['rss_mb_after']} MiB "
            f"(after each 1000 cases: {live['rss_mb_per_1000_cases']})"
        )
        result["live_api"] = {
            **live,
            "cases": sum(tally.cases.values()),
            "crashes": len(tally.crashes),
            "targets": _summary(tally),
            "crash_samples": tally.crashes[:10],
        }
        crashes += len(tally.crashes)
    result["crashes"] = crashes
    result["seconds"] = round(time.perf_counter() - t0, 2)
    result["targets"] = {"crashes_eq_0": crashes == 0}
    return result
