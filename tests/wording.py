"""What an error message sent to a client may not be: empty, or a Python exception's class
name (`ExtraData: unpack(b) received extra data.`, an empty `StackError:`). Clients are
in any language; a message says what is wrong in words."""

from __future__ import annotations

import builtins
import json
import re

import msgpack.exceptions
import yaml

from coordinator.pools import PoolConfigError
from mesh.codec import WireError
from mesh.schema import ApiError
from workloads.quantity import SpecError


def _exception_names() -> frozenset[str]:
    names = {
        n
        for n, obj in vars(builtins).items()
        if isinstance(obj, type) and issubclass(obj, BaseException) and not n.endswith("Warning")
    }
    for module in (
        msgpack.exceptions,
        yaml,
        yaml.error,
        yaml.scanner,
        yaml.parser,
        yaml.reader,
        yaml.composer,
        yaml.constructor,
    ):
        names |= {
            n
            for n, obj in vars(module).items()
            if isinstance(obj, type) and issubclass(obj, BaseException)
        }
    names |= {json.JSONDecodeError.__name__, "UnpackException", "UnpackValueError"}
    names |= {c.__name__ for c in (WireError, SpecError, ApiError, PoolConfigError)}
    return frozenset(names - {"Exception"})  # the English word may appear


EXCEPTION_NAMES = _exception_names()
_WORD = re.compile(r"[A-Za-z_]+")


def assert_readable(message: object) -> None:
    assert isinstance(message, str) and message.strip(), f"empty message: {message!r}"
    leaked = set(_WORD.findall(message)) & EXCEPTION_NAMES
    assert not leaked, f"{sorted(leaked)} in {message[:300]!r}"
