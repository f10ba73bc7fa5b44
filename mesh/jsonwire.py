"""The JSON form of the request API, for clients that have no msgpack (`nats req`, a shell
script, a client in another language).

A request is JSON when its `Content-Type` header says `application/json` or its first
byte after white space is `{`. Neither can be a msgpack request: a msgpack map starts
with 0x80-0x8f, 0xde or 0xdf, and `{` and white space are small integers there. A JSON
request is turned into the msgpack one it stands for, so one decoder validates both,
and the reply goes back as JSON.

Bytes have no JSON form: a bytes value under a key goes out as base64 text under the key
with `_b64` appended (`data` -> `data_b64`), and bytes in a list as `{"_b64": TEXT}`. In a
request the same suffix on a field of the request (or of an item of its list, a
`job.submit_many` job) gives bytes: `spec_b64` is the spec's YAML as base64.
All pure functions: no I/O, no state.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import msgpack

from mesh.codec import WireError

CONTENT_TYPE = "application/json"
B64 = "_b64"
MAX_INT_DIGITS = 20  # a 64-bit integer has at most 20 digits; more is out of range anyway
_JSON_START = re.compile(rb"[ \t\r\n]*\{")


def is_json(data: bytes, headers: Mapping[str, str] | None = None) -> bool:
    """Whether a request is JSON (see the module's docstring)."""
    for key, value in (headers or {}).items():
        if key.lower() == "content-type":
            return value.split(";", 1)[0].strip().lower() == CONTENT_TYPE
    return _JSON_START.match(data) is not None


def to_msgpack(data: bytes) -> bytes:
    """The msgpack request a JSON request stands for; WireError says what is wrong."""
    obj = parse(data)
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError):
        raise WireError("", "an integer is out of range (64 bits at most)") from None


def parse(data: bytes) -> dict[str, Any]:
    """A JSON request as a map, its top-level `*_b64` fields as bytes."""
    if not data.strip():
        return {}
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError("", f"not valid JSON: not UTF-8 text (byte {exc.start})") from None
    try:
        obj = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_int=_int
        )
    except json.JSONDecodeError as exc:
        problem = "extra text after the object" if exc.msg == "Extra data" else exc.msg.lower()
        raise WireError(
            "", f"not valid JSON: {problem} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise WireError("", "not valid JSON: nested too deeply") from None
    except _Refused as exc:
        raise WireError("", f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError("", "a JSON request must be an object ({...})")
    out = _unbase64(obj, "")
    for key, value in out.items():  # the items of a batch are requests too
        if isinstance(value, list):
            out[key] = [
                _unbase64(v, f"{key}[{i}].") if isinstance(v, dict) else v
                for i, v in enumerate(value)
            ]
    return out


class _Refused(ValueError):
    """JSON that the json module accepts and the API does not."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object as a map, refusing a key given twice (json keeps the last one silently:
    a spec sent twice in one request would be half ignored)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"the key {key[:64]!r} appears twice in one object")
            seen.add(key)
    return out


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text)} digits is out of range (64 bits at most)")
    return int(text)


def _unbase64(obj: dict[str, Any], path: str) -> dict[str, Any]:
    """A request object's own `*_b64` fields as bytes (not those inside a spec given as an
    object: an env variable may be called `X_b64`)."""
    out = dict(obj)
    for key, value in obj.items():
        if not key.endswith(B64) or len(key) == len(B64):
            continue
        name = key[: -len(B64)]
        if name in obj:
            raise WireError(path + key, f"give {name} or {key}, not both")
        if not isinstance(value, str):
            raise WireError(path + key, "expected base64 text")
        try:
            out[name] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise WireError(path + key, "not valid base64 text") from None
        del out[key]
    return out


def from_msgpack(reply: bytes) -> bytes:
    """A msgpack reply (the API's own) as JSON text, bytes in base64."""
    obj = msgpack.unpackb(reply, raw=False, strict_map_key=False)
    return json.dumps(jsonable(obj), ensure_ascii=False, separators=(",", ":")).encode()


def jsonable(x: Any) -> Any:
    """Plain data with bytes as base64 (keys renamed `*_b64`), map keys as strings and
    non-finite numbers (which JSON has not) as null."""
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            key = k if isinstance(k, str) else str(k)
            if isinstance(v, bytes):
                out[key + B64] = base64.b64encode(v).decode("ascii")
            else:
                out[key] = jsonable(v)
        return out
    if isinstance(x, list | tuple):
        return [
            {B64: base64.b64encode(v).decode("ascii")} if isinstance(v, bytes) else jsonable(v)
            for v in x
        ]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, bytes):
        return {B64: base64.b64encode(x).decode("ascii")}
    return x
