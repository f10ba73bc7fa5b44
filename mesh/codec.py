"""msgpack codec for wire dataclasses, validating on decode.

One generic converter per dataclass is compiled from its type hints, so every
message gets the same checks (types, sizes, ranges, required fields) without a
hand-written parser each. Unknown fields are ignored so old readers survive new
writers; anything else wrong raises `WireError`, the one error a receiver catches.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import msgpack

MAX_MESSAGE = 1024 * 1024  # default cap on one encoded message
MAX_STR = 64 * 1024  # default cap on one string field
MAX_ITEMS = 10_000  # default cap on one list/map field
MAX_DEPTH = 32  # cap on nesting of free-form (Any) data
INT64 = 2**63 - 1


class WireError(ValueError):
    """A message that cannot be decoded or does not validate. `field` names where."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


def wf(
    default: Any = dataclasses.MISSING,
    *,
    ge: float | None = None,
    le: float | None = None,
    max_len: int | None = None,
    choices: tuple[str, ...] | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with wire constraints (range, length, allowed values)."""
    meta = {"ge": ge, "le": le, "max_len": max_len, "choices": choices}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


# ---------------------------------------------------------------- encoding


_FIELD_NAMES: dict[type, tuple[tuple[str, ...], str | None]] = {}


def _field_names(cls: type) -> tuple[tuple[str, ...], str | None]:
    """A dataclass's field names and union tag, looked up once per class: asking
    `dataclasses` on every object was most of the cost of encoding a large log entry."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        tag = cls.__name__ if getattr(cls, "_wire_tagged", False) else None
        names = _FIELD_NAMES[cls] = (tuple(f.name for f in dataclasses.fields(cls)), tag)
    return names


def _fields(obj: Any) -> dict[str, Any] | None:
    """A dataclass as a map of its fields, one level deep (tagged with `_t` when it is a
    member of a union); None for anything else."""
    cls = type(obj)
    if cls in _FIELD_NAMES or (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        names, tag = _field_names(cls)
        out = {name: getattr(obj, name) for name in names}
        if tag is not None:
            out["_t"] = tag
        return out
    return None


def to_wire(obj: Any) -> Any:
    """Plain msgpack-able data, the whole tree: dataclasses become maps (`_fields`),
    tuples lists, enums their values. Encoding does not need it (`pack` lets msgpack
    walk the tree); signing and hand-built heartbeats do."""
    if type(obj) in _PLAIN:
        return obj
    fields = _fields(obj)
    if fields is not None:
        obj = fields
    elif isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [x if type(x) in _PLAIN else to_wire(x) for x in obj]
    if isinstance(obj, dict):
        # Plain values (most of them) are taken as they are, without a call each.
        return {k: v if type(v) in _PLAIN else to_wire(v) for k, v in obj.items()}
    return obj


_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})


def _default(obj: Any) -> Any:
    """What msgpack cannot pack itself, one level at a time: a dataclass becomes a map of
    its fields, an enum its value. Maps, lists, tuples and plain values inside are
    packed in C and come back here only for the next dataclass, so a log entry of 2,000
    events is not rebuilt as Python dicts first. The bytes are those of
    `packb(to_wire(obj))`: same maps in the same order (tested)."""
    fields = _fields(obj)
    if fields is not None:
        return fields
    if isinstance(obj, enum.Enum):
        return obj.value
    raise TypeError(f"cannot encode a {type(obj).__name__}")


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes, max_size: int = MAX_MESSAGE) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("", f"expected bytes, got {type(data).__name__}")
    if len(data) > max_size:
        raise WireError("", f"message of {len(data)} bytes exceeds the {max_size}-byte limit")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            max_str_len=max_size,
            max_bin_len=max_size,
            max_array_len=MAX_ITEMS * 10,
            max_map_len=MAX_ITEMS * 10,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise WireError("", f"not valid msgpack: {msgpack_problem(exc, data)}") from None


_TOO_LONG = re.compile(r"(\d+) exceeds max_(str|bin|array|map|ext)_len\((\d+)\)")
_WHAT = {
    "str": "a string",
    "bin": "a byte string",
    "array": "a list",
    "map": "a map",
    "ext": "an extension value",
}


def msgpack_problem(exc: Exception, data: bytes) -> str:
    """What is wrong with bytes msgpack refused, said for a person: msgpack's own errors
    are exception class names with an empty text (`StackError`, `FormatError`) or its
    internals (`unpack(b) received extra data.`), and they went back in API replies."""
    if isinstance(exc, msgpack.ExtraData):
        return "extra bytes after the first value (send exactly one map)"
    if isinstance(exc, msgpack.StackError):
        return "nested too deeply"
    if isinstance(exc, msgpack.FormatError):
        return "a byte that starts no msgpack value (0xc1, or a reserved type)"
    if isinstance(exc, UnicodeDecodeError):
        return f"a string that is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x})"
    if isinstance(exc, TypeError):  # a list or map as a map key: unhashable
        return "a map key that is a list or a map (keys must be strings or numbers)"
    m = _TOO_LONG.search(str(exc))
    if m is not None:
        size, kind, limit = m.groups()
        if kind == "ext":
            return "an extension value (msgpack ext types are not used here)"
        return f"{_WHAT[kind]} of {size} items or bytes, over the limit of {limit}"
    if not data:
        return "the message is empty"
    if "incomplete input" in str(exc) or isinstance(exc, msgpack.OutOfData):
        return "the message ends in the middle of a value (truncated?)"
    return "the bytes do not decode as msgpack"


def encode(msg: Any) -> bytes:
    return pack(msg)


def decode(cls: type, data: bytes, max_size: int = MAX_MESSAGE) -> Any:
    return from_wire(cls, unpack(data, max_size))


def from_wire(cls: type, obj: Any, path: str = "") -> Any:
    return _converter(cls)(obj, path)


# ---------------------------------------------------------------- decoding

Converter = Callable[[Any, str], Any]
_cache: dict[Any, Converter] = {}
_custom: dict[type, Converter] = {}


def register(cls: type, conv: Converter) -> None:
    """A hand-written converter for a type that validates itself (e.g. `Resources.from_dict`)."""
    _custom[cls] = conv
    _cache.pop(cls, None)


def tagged(cls: type) -> type:
    """Mark a dataclass as a member of a tagged union (encoded with `_t`)."""
    cls._wire_tagged = True
    return cls


def _name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def _converter(tp: Any, meta: dict | None = None) -> Converter:
    key = (tp, tuple(sorted((meta or {}).items())) if meta else None)
    conv = _cache.get(key)
    if conv is None:
        conv = _build(tp, meta or {})
        _cache[key] = conv
    return conv


def _build(tp: Any, meta: dict) -> Converter:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp in _custom:
        return _custom[tp]
    if tp is Any:
        return _any_text(meta["max_len"]) if meta.get("max_len") else _any
    if tp is bool:
        return _check_bool
    if tp is int:
        return _int_conv(meta)
    if tp is float:
        return _float_conv(meta)
    if tp is str:
        return _str_conv(meta)
    if tp is bytes:
        return _bytes_conv(meta)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_conv(tp)
    if dataclasses.is_dataclass(tp):
        return _dataclass_conv(tp)
    if origin in (typing.Union, types.UnionType):
        return _union_conv(args, meta)
    if origin is tuple:
        return _tuple_conv(args, meta)
    if origin is dict:
        return _dict_conv(args, meta)
    raise TypeError(f"no wire converter for {tp!r}")


def _check_bool(x: Any, path: str) -> bool:
    if not isinstance(x, bool):
        raise WireError(path, f"expected a boolean, got {kind(x)}")
    return x


_check_bool.ok = lambda x: type(x) is bool  # type: ignore[attr-defined]


def _int_conv(meta: dict) -> Converter:
    ge, le = meta.get("ge"), meta.get("le")
    lo = -INT64 - 1 if ge is None else ge
    hi = INT64 if le is None else le

    def conv(x: Any, path: str) -> int:
        if not isinstance(x, int) or isinstance(x, bool):
            raise WireError(path, f"expected an integer, got {kind(x)}")
        if not lo <= x <= hi:
            raise WireError(path, f"{x} is out of range [{lo}, {hi}]")
        return x

    conv.ok = lambda x: type(x) is int and lo <= x <= hi  # type: ignore[attr-defined]
    return conv


def _float_conv(meta: dict) -> Converter:
    ge, le = meta.get("ge"), meta.get("le")

    def conv(x: Any, path: str) -> float:
        if not isinstance(x, (int, float)) or isinstance(x, bool):
            raise WireError(path, f"expected a number, got {kind(x)}")
        x = float(x)
        if not math.isfinite(x):
            raise WireError(path, "expected a finite number")
        if (ge is not None and x < ge) or (le is not None and x > le):
            raise WireError(path, f"{x} is out of range [{ge}, {le}]")
        return x

    lo = -math.inf if ge is None else ge
    hi = math.inf if le is None else le
    # A float in range is returned as it is (an int is converted: not the fast path).
    conv.ok = lambda x: type(x) is float and lo <= x <= hi and -math.inf < x < math.inf  # type: ignore[attr-defined]
    return conv


def _str_conv(meta: dict) -> Converter:
    max_len = meta.get("max_len") or MAX_STR
    choices = meta.get("choices")

    def conv(x: Any, path: str) -> str:
        if not isinstance(x, str):
            raise WireError(path, f"expected a string, got {kind(x)}")
        if len(x) > max_len:
            raise WireError(path, f"string of {len(x)} characters exceeds the limit of {max_len}")
        if choices is not None and x not in choices:
            raise WireError(path, f"{_show(x)} is not one of {', '.join(choices)}")
        return x

    if choices is None:
        conv.ok = lambda x: type(x) is str and len(x) <= max_len  # type: ignore[attr-defined]
    else:
        conv.ok = lambda x: type(x) is str and x in choices and len(x) <= max_len  # type: ignore[attr-defined]
    return conv


def _bytes_conv(meta: dict) -> Converter:
    max_len = meta.get("max_len") or MAX_MESSAGE

    def conv(x: Any, path: str) -> bytes:
        if not isinstance(x, bytes):
            raise WireError(path, f"expected bytes, got {kind(x)}")
        if len(x) > max_len:
            raise WireError(path, f"{len(x)} bytes exceed the limit of {max_len}")
        return x

    conv.ok = lambda x: type(x) is bytes and len(x) <= max_len  # type: ignore[attr-defined]
    return conv


_KINDS = {
    type(None): "nil",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    bytes: "bytes",
    list: "a list",
    tuple: "a list",
    dict: "a map",
}


def kind(x: Any) -> str:
    """A received value's type as the wire calls it (an error message goes back to
    clients in any language, so never a Python type name such as `NoneType`)."""
    return _KINDS.get(type(x)) or next(
        (name for t, name in _KINDS.items() if isinstance(x, t)), "a value of another kind"
    )


def _sub(path: str, key: Any) -> str:
    """The path of a map's entry, with the key cut short: every entry below a long key
    copies the path, so a 1 MiB message of one 400 KB key over 100k small entries took
    seconds to decode."""
    return f"{path}.{key[:64] if isinstance(key, str) else key}"


def _show(x: Any) -> str:
    """A received value as an error message shows it: short, whatever was sent (the repr of
    a nested list from a 1 MiB message is megabytes, and it goes back in the reply)."""
    if isinstance(x, (list, tuple, dict)):
        return f"{kind(x)} of {len(x)} items"
    text = repr(x[:61] if isinstance(x, (str, bytes)) else x)
    return text if len(text) <= 60 else text[:57] + "..."


def _enum_conv(tp: type[enum.Enum]) -> Converter:
    values = {m.value: m for m in tp}

    def conv(x: Any, path: str) -> enum.Enum:
        try:
            return values[x]
        except (KeyError, TypeError):
            allowed = ", ".join(str(v) for v in values)
            raise WireError(path, f"{_show(x)} is not a valid {tp.__name__} ({allowed})") from None

    return conv


def _tuple_conv(args: tuple, meta: dict) -> Converter:
    max_len = meta.get("max_len") or MAX_ITEMS
    if len(args) == 2 and args[1] is Ellipsis:
        item = _converter(args[0])
        ok = getattr(item, "ok", None)

        def conv(x: Any, path: str) -> tuple:
            if not isinstance(x, (list, tuple)):
                raise WireError(path, f"expected a list, got {kind(x)}")
            if len(x) > max_len:
                raise WireError(path, f"list of {len(x)} items exceeds the limit of {max_len}")
            if ok is not None and all(map(ok, x)):
                return tuple(x)
            return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(x))

        return conv
    items = [_converter(a) for a in args]

    def conv_fixed(x: Any, path: str) -> tuple:
        if not isinstance(x, (list, tuple)) or len(x) != len(items):
            raise WireError(path, f"expected a list of {len(items)} items")
        return tuple(c(v, f"{path}[{i}]") for i, (c, v) in enumerate(zip(items, x, strict=False)))

    return conv_fixed


def _dict_conv(args: tuple, meta: dict) -> Converter:
    max_len = meta.get("max_len") or MAX_ITEMS
    key_conv = _converter(args[0])
    val_conv = _converter(args[1])
    key_ok = getattr(key_conv, "ok", None)
    val_ok = getattr(val_conv, "ok", None)

    def conv(x: Any, path: str) -> dict:
        if not isinstance(x, dict):
            raise WireError(path, f"expected a map, got {kind(x)}")
        if len(x) > max_len:
            raise WireError(path, f"map of {len(x)} entries exceeds the limit of {max_len}")
        if key_ok is not None and val_ok is not None:
            if all(map(key_ok, x)) and all(map(val_ok, x.values())):
                return dict(x)
        return {key_conv(k, path): val_conv(v, _sub(path, k)) for k, v in x.items()}

    return conv


def _union_conv(args: tuple, meta: dict) -> Converter:
    members = [a for a in args if a is not type(None)]
    nullable = len(members) < len(args)
    if len(members) == 1:
        inner = _converter(members[0], meta)

        def conv_opt(x: Any, path: str) -> Any:
            if x is None and nullable:
                return None
            return inner(x, path)

        inner_ok = getattr(inner, "ok", None)
        if inner_ok is not None:
            if nullable:
                conv_opt.ok = lambda x: x is None or inner_ok(x)  # type: ignore[attr-defined]
            else:
                conv_opt.ok = inner_ok  # type: ignore[attr-defined]
        return conv_opt
    if not all(dataclasses.is_dataclass(m) for m in members):
        raise TypeError(f"unions must be of tagged dataclasses: {args!r}")
    by_tag = {m.__name__: _converter(m) for m in members}

    def conv_tagged(x: Any, path: str) -> Any:
        if x is None and nullable:
            return None
        if not isinstance(x, dict):
            raise WireError(path, f"expected a map, got {kind(x)}")
        tag = x.get("_t")
        if not isinstance(tag, str) or tag not in by_tag:
            raise WireError(path, f"unknown message type {_show(tag)}")
        return by_tag[tag](x, path)

    return conv_tagged


def _dataclass_conv(cls: type) -> Converter:
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        has_default = not (
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        meta = {k: v for k, v in f.metadata.items() if v is not None}
        fields.append((f.name, has_default, hints[f.name], meta))
    names = tuple(f[0] for f in fields)
    compiled: dict[str, tuple[Converter, Callable[[Any], bool] | None]] = {}

    def field_value(name: str, v: Any, path: str) -> Any:
        if not compiled:  # lazily: a dataclass may name types defined after it
            for n, _, t, m in fields:
                c = _converter(t, m)
                compiled[n] = (c, getattr(c, "ok", None))
        c, ok = compiled[name]
        # A value the converter would return unchanged skips it (and the path).
        return v if ok is not None and ok(v) else c(v, f"{path}.{name}" if path else name)

    def make(kwargs: dict, path: str) -> Any:
        try:
            return cls(**kwargs)
        except WireError:
            raise
        except (TypeError, ValueError) as exc:
            raise WireError(path, str(exc)) from None

    def conv(x: Any, path: str) -> Any:
        if not isinstance(x, dict):
            raise WireError(path, f"expected a map, got {kind(x)}")
        kwargs = {}
        for name, has_default, _, _ in fields:
            if name in x:
                kwargs[name] = field_value(name, x[name], path)
            elif not has_default:
                raise WireError(f"{path}.{name}" if path else name, "required")
        return make(kwargs, path)

    def changed(old: Any, x: dict) -> Any:
        kwargs = {n: getattr(old, n) for n in names}
        for name, v in x.items():
            if name in kwargs:
                kwargs[name] = field_value(name, v, "")
        return make(kwargs, "")

    conv.changed = changed  # type: ignore[attr-defined]
    return conv


def with_changes(old: Any, changes: dict) -> Any:
    """`old` with the fields `changes` names (a map as the wire gives it) validated as
    `from_wire` would, and the others kept as they are: for a message that repeats the
    last one but for a field or two (a heartbeat's clock), so what did not change is not
    validated again. Names `old`'s class lacks are ignored, as `from_wire` ignores them."""
    return _converter(type(old)).changed(old, changes)  # type: ignore[attr-defined]


class RepeatDecoder:
    """Decodes the messages of `cls` a sender repeats but for a field or two (a node's
    heartbeats), validating only what changed since that sender's last one (5,000 nodes
    a second validated whole cost a coordinator a third of a core); the result is what
    `decode` gives. Each sender's last message is kept in a compared form of
    plain values (its lists and maps packed), which the collector does not track: kept
    as msgpack gave it, a heartbeat left 8 tracked objects alive for its whole period,
    and their promotion started a full collection (50-100 ms at 5,000 nodes) every few
    seconds. At most `limit` senders are remembered (then all are forgotten at once)."""

    def __init__(self, cls: type, limit: int = 100_000) -> None:
        self.cls = cls
        self.limit = limit
        # sender -> its last message's keys and compared form; and its decoded message
        # (apart, so that the pair holds plain values only)
        self.forms: dict[str, tuple[tuple, tuple]] = {}
        self.last: dict[str, Any] = {}

    def decode(self, sender: str, data: bytes) -> Any:
        raw = unpack(data)
        if type(raw) is not dict:
            return from_wire(self.cls, raw)  # says what is wrong
        keys = tuple(raw)
        form = _compared(raw)
        kept = self.forms.get(sender)
        if kept is not None and kept[0] == keys:
            changes = {
                k: raw[k]
                for k, now, before in zip(keys, form, kept[1], strict=True)
                if now != before or now.__class__ is not before.__class__
            }
            msg = with_changes(self.last[sender], changes)
        else:
            msg = from_wire(self.cls, raw)
            if len(self.forms) >= self.limit:
                self.forms.clear()
                self.last.clear()
        self.forms[sender] = (keys, form)
        self.last[sender] = msg
        return msg


def _compared(raw: dict) -> tuple:
    """A message's values with its lists and maps packed: equal packed forms only where
    msgpack gave equal values of the same types inside (1, 1.0 and True differ there, as
    they do to validation; `RepeatDecoder` compares the top-level values' types)."""
    return tuple(pack(v) if type(v) is list or type(v) is dict else v for v in raw.values())


def _any(x: Any, path: str, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(path, f"nested deeper than {MAX_DEPTH} levels")
    if x is None or isinstance(x, (bool, int, float, bytes)):
        return x
    if isinstance(x, str):
        if len(x) > MAX_STR:
            raise WireError(path, f"string of {len(x)} characters exceeds the limit of {MAX_STR}")
        return x
    if isinstance(x, (list, tuple)):
        if len(x) > MAX_ITEMS:
            raise WireError(path, f"list of {len(x)} items exceeds the limit of {MAX_ITEMS}")
        return [_any(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(x)]
    if isinstance(x, dict):
        if len(x) > MAX_ITEMS:
            raise WireError(path, f"map of {len(x)} entries exceeds the limit of {MAX_ITEMS}")
        out = {}
        for k, v in x.items():
            if not isinstance(k, str):
                raise WireError(path, f"map keys must be strings, got {kind(k)}")
            out[k] = _any(v, _sub(path, k), depth + 1)
        return out
    raise WireError(path, f"unsupported value: {kind(x)}")


def _any_text(max_len: int) -> Converter:
    """Free-form data that may also be one text (`wf(max_len=...)` on an `Any` field): a
    job spec or pool tree sent as YAML, whose length is its own limit's to judge, not
    MAX_STR's (a valid 100 KB spec was refused by the 64 KiB cap on a string). Anything
    else is checked as `_any` checks it."""

    def conv(x: Any, path: str) -> Any:
        if type(x) is str or type(x) is bytes:
            if len(x) > max_len:
                raise WireError(path, f"{len(x)} characters or bytes exceed the limit of {max_len}")
            return x
        return _any(x, path)

    conv.ok = lambda x: (type(x) in (str, bytes) and len(x) <= max_len) or _any_ok(x)  # type: ignore[attr-defined]
    return conv


def _any_ok(x: Any, depth: int = 0) -> bool:
    """Whether `_any` would take `x` and give back an equal value: then the decoder keeps
    `x` and builds no path (a path string for every value of 1,000 job specs was a
    fifth of what decoding a submit cost the leader). Strings and plain values inside are
    checked in the loop, not by a call each. False sends `x` through `_any`, which says
    what is wrong and where; so does anything unusual (a tuple, a subclass)."""
    if depth > MAX_DEPTH:
        return False
    t = type(x)
    if t is str:
        return len(x) <= MAX_STR
    if t in _PLAIN:
        return True
    if t is dict:
        if len(x) > MAX_ITEMS:
            return False
        for k in x:
            if type(k) is not str:
                return False
        values = x.values()
    elif t is list:
        if len(x) > MAX_ITEMS:
            return False
        values = x
    else:
        return False
    if depth == MAX_DEPTH:
        return not x  # anything inside would be nested past the cap
    for v in values:
        tv = type(v)
        if tv is str:
            if len(v) > MAX_STR:
                return False
        elif tv not in _PLAIN and not _any_ok(v, depth + 1):
            return False
    return True


_any.ok = _any_ok  # type: ignore[attr-defined]
