"""docs/api.md is true to coordinator/api.py: every endpoint served is documented and
every documented one served; each example request decodes as its endpoint's request
and each example reply has the reply's shape; the codes and limits are the code's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from coordinator.api import ENDPOINTS, Api
from mesh import jsonwire
from mesh.codec import decode
from mesh.schema import (
    MAX_BATCH,
    MAX_REQUEST,
    MAX_SPEC_BYTES,
    BreakGlassRequest,
    ErrorCode,
    HostsRequest,
    JobListRequest,
    JobRef,
    KillRequest,
    NodeRef,
    PartitionApplyRequest,
    PartitionMoveRequest,
    PartitionRef,
    PoolApplyRequest,
    PoolRef,
    RestoreRequest,
    ScaleRequest,
    SubmitManyRequest,
    SubmitRequest,
    UpdateRequest,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "api.md").read_text()
# What each endpoint's handler decodes; those that read no request take `{}`.
REQUESTS: dict[str, type | None] = {
    "job.submit": SubmitRequest,
    "job.submit_many": SubmitManyRequest,
    "job.get": JobRef,
    "job.list": JobListRequest,
    "job.kill": KillRequest,
    "job.update": UpdateRequest,
    "node.list": None,
    "node.get": NodeRef,
    "cluster.info": None,
    "region.list": None,
    "site.list": None,
    "pool.apply": PoolApplyRequest,
    "pool.list": None,
    "pool.get": PoolRef,
    "partition.list": None,
    "partition.get": PartitionRef,
    "partition.apply": PartitionApplyRequest,
    "partition.move": PartitionMoveRequest,
    "partition.break_glass": BreakGlassRequest,
    "partition.restore": RestoreRequest,
    "job.scale": ScaleRequest,
    "job.hosts": HostsRequest,
}


def sections() -> dict[str, str]:
    """Each `### \\`endpoint\\`` section's text."""
    parts = re.split(r"^### `([a-z_.]+)`\n", DOC, flags=re.M)
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return {name: body.split("\n## ")[0] for name, body in pairs}


def test_every_endpoint_served_is_documented_and_no_other():
    served = set(Api(SimpleNamespace()).handlers)  # what a request can reach
    assert served == set(ENDPOINTS)  # what the micro service registers
    assert set(sections()) == served


def test_each_endpoint_has_a_json_example_request_and_reply():
    for endpoint, body in sections().items():
        blocks = re.findall(r"```json\n(.*?)```", body, re.S)
        assert len(blocks) == 2, (endpoint, len(blocks))
        request, reply = (json.loads(b) for b in blocks)
        # as the API reads it: a JSON object, turned into its msgpack twin and decoded
        packed = jsonwire.to_msgpack(blocks[0].encode())
        cls = REQUESTS.get(endpoint)
        if cls is not None:
            decode(cls, packed)
        else:
            assert request == {}
        assert reply["ok"] in (True, False), endpoint
        assert "Request:" in body and "Reply:" in body, endpoint


def test_codes_and_limits_are_the_codes():
    table = DOC.split("## Replies and codes")[1].split("## Limits")[0]
    assert set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.M)) == {str(c) for c in ErrorCode}
    limits = DOC.split("## Limits")[1].split("## Service discovery")[0]
    assert f"`MAX_SPEC_BYTES`) | {MAX_SPEC_BYTES} bytes" in limits
    assert f"`MAX_REQUEST`) | {MAX_REQUEST} bytes" in limits
    assert f"`MAX_BATCH`) | {MAX_BATCH} |" in limits
    assert f"limit of {MAX_SPEC_BYTES} bytes" in limits  # the TOO_LARGE message as sent


def test_the_readme_points_here():
    readme = (ROOT / "README.md").read_text()
    assert "docs/api.md" in readme
