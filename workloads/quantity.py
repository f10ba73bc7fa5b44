"""Resource quantities in Kubernetes notation, parsed to exact integers.

Everything downstream (entitlement, placement, packing) does integer arithmetic, so the
units are fixed here once: CPU in millicores, memory/disk in bytes, GPUs in milli-GPUs,
durations in float seconds. Parsing goes through ``Decimal`` so that ``0.1`` cores is
exactly 100m and never 99.99999m.

Every rejection is a :class:`SpecError` that names the field and says what was expected,
because these messages are shown verbatim to the person who wrote the job spec.
"""

from __future__ import annotations

import datetime
import math
import re
from decimal import ROUND_CEILING, Context, Decimal, InvalidOperation
from functools import lru_cache

__all__ = [
    "MAX_BYTES",
    "MAX_CPU_CORES",
    "MAX_GPUS",
    "SpecError",
    "format_bytes",
    "format_cpu",
    "format_gpu",
    "parse_bytes",
    "parse_cpu",
    "parse_duration",
    "parse_gpu",
]

MAX_CPU_CORES = 1_000_000
"""Largest CPU request, in whole cores: far above any node, low enough to catch typos."""

MAX_GPUS = 1_000_000
"""Largest GPU request, in whole GPUs."""

MAX_BYTES = 2**60
"""Largest memory/disk quantity (1Ei): keeps every sum well inside a signed 64-bit int."""

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_SUFFIXES = {**_BINARY, **_DECIMAL}

_MAX_TEXT = 64  # a quantity string longer than this is garbage, not a number to round
# Enough digits that no accepted input is ever rounded by arithmetic (the default is 28).
# Passed explicitly to each operation, so no thread's decimal context is touched.
_CTX = Context(prec=200)

# A signed plain decimal; exponents are not accepted (they collide with the "E" suffix).
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_CPU_RE = re.compile(rf"({_NUMBER})(m?)")
_BYTES_RE = re.compile(rf"({_NUMBER})((?:[KMGTPE]i)|[kMGTPE])?")
_GPU_RE = re.compile(_NUMBER)
_DURATION_PART = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ms|s|m|h|d)"
_DURATION_RE = re.compile(rf"(?:{_DURATION_PART})+")
_DURATION_PART_RE = re.compile(_DURATION_PART)
_DURATION_UNITS = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}


class SpecError(ValueError):
    """A job spec or quantity that cannot be accepted.

    ``field`` is the dotted path of the offending value (``tasks[1].resources.memory``) so a
    user can find it in a long spec; ``problem`` says what is wrong with it.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)

    def __reduce__(self):  # keep pickling (e.g. across processes) working with two args
        return (type(self), (self.field, self.problem))


def _show(value: object) -> str:
    """A short, safe rendering of a user value for an error message.

    Never the repr of a container (a YAML alias bomb is a few hundred bytes of text but
    a list whose repr is gigabytes), nor of a huge int (its repr raises ValueError past
    4300 digits) or a huge string: those are described by their type and size."""
    if isinstance(value, str | bytes | bytearray):
        text = repr(value[:61])
    elif isinstance(value, bool | float | type(None) | datetime.date):
        text = repr(value)
    elif isinstance(value, int):
        bits = value.bit_length()
        text = repr(value) if bits <= 256 else f"an integer of {bits} bits"
    elif isinstance(value, list | tuple | dict | set | frozenset):
        return f"a {type(value).__name__} of {len(value)} items"
    else:
        text = f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _decimal(value: object, field: str, expected: str) -> Decimal:
    """A finite Decimal from an int or float (never a bool: ``True`` is not a quantity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, f"{expected}, got {_show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field, f"{expected}, got {_show(value)}")
    # str(float) is the shortest repr, so 0.1 becomes Decimal("0.1"), not 0.1000000000000000055...
    return Decimal(str(value)) if isinstance(value, float) else Decimal(value)


def _match(regex: re.Pattern[str], value: object, field: str, expected: str) -> re.Match[str]:
    if not isinstance(value, str):
        raise SpecError(field, f"{expected}, got {_show(value)}")
    m = regex.fullmatch(value.strip()) if len(value) <= _MAX_TEXT else None
    if m is None:
        raise SpecError(field, f"{expected}, got {_show(value)}")
    return m


def _check_sign(amount: Decimal, value: object, field: str) -> None:
    if amount < 0:
        raise SpecError(field, f"must not be negative, got {_show(value)}")


def parse_cpu(value: object, field: str = "cpu") -> int:
    """CPU in millicores from cores (``2``, ``0.5``, ``"0.5"``) or millicores (``"500m"``)."""
    expected = "expected a CPU quantity like 500m, 0.5 or 2"
    if isinstance(value, str):
        m = _match(_CPU_RE, value, field, expected)
        amount = Decimal(m.group(1))
        scale = 1 if m.group(2) else 1000
    else:
        amount = _decimal(value, field, expected)
        scale = 1000
    _check_sign(amount, value, field)
    milli = _CTX.multiply(amount, scale)
    if milli != milli.to_integral_value():
        raise SpecError(
            field, f"CPU is counted in whole millicores (1m = 0.001), got {_show(value)}"
        )
    if milli > MAX_CPU_CORES * 1000:
        raise SpecError(field, f"at most {MAX_CPU_CORES} cores, got {_show(value)}")
    return int(milli)


def parse_bytes(value: object, field: str = "memory") -> int:
    """Bytes from an int or a quantity string (``64Mi``, ``2Gi``, ``500M``, ``1.5Gi``).

    Binary suffixes (Ki, Mi, ...) are powers of 1024, decimal ones (k, M, G, ...) powers of
    1000, as in Kubernetes. A fractional result is rounded up, also as Kubernetes does: a
    request must never shrink below what was written.
    """
    expected = "expected a quantity like 64Mi or 2Gi"
    if isinstance(value, str):
        m = _match(_BYTES_RE, value, field, expected)
        amount = _CTX.multiply(Decimal(m.group(1)), _SUFFIXES.get(m.group(2) or "", 1))
    else:
        amount = _decimal(value, field, expected)
    _check_sign(amount, value, field)
    if amount > MAX_BYTES:
        raise SpecError(field, f"at most 1Ei (2**60 bytes), got {_show(value)}")
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def parse_gpu(value: object, field: str = "gpu") -> int:
    """GPUs in milli-GPUs: ``0.25`` -> 250, ``1`` -> 1000, ``2`` -> 2000.

    A fraction is a share of one GPU, so it only makes sense below 1: ``1.5`` GPUs would
    split a device across two tasks' gangs in a way no node can enforce.
    """
    expected = "expected a GPU count like 1, 2 or a fraction like 0.25"
    if isinstance(value, str):
        amount = Decimal(_match(_GPU_RE, value, field, expected).group(0))
    else:
        amount = _decimal(value, field, expected)
    _check_sign(amount, value, field)
    milli = _CTX.multiply(amount, 1000)
    if milli != milli.to_integral_value():
        raise SpecError(field, f"at most 3 decimal places (0.001 GPU), got {_show(value)}")
    if amount > 1 and amount != amount.to_integral_value():
        raise SpecError(
            field,
            f"fractional GPUs must be below 1; ask for whole GPUs above 1, got {_show(value)}",
        )
    if amount > MAX_GPUS:
        raise SpecError(field, f"at most {MAX_GPUS} GPUs, got {_show(value)}")
    return int(milli)


def parse_duration(value: object, field: str) -> float:
    """Seconds from a number or a string like ``30s``, ``5m``, ``2h``, ``1h30m``, ``250ms``."""
    expected = "expected a duration like 30s, 5m, 1h30m or a number of seconds"
    if isinstance(value, str):
        text = value.strip() if len(value) <= _MAX_TEXT else ""
        if _GPU_RE.fullmatch(text):  # a plain number in a string: seconds
            amount = Decimal(text)
        elif text.startswith("-") and _DURATION_RE.fullmatch(text[1:]):
            raise SpecError(field, f"must not be negative, got {_show(value)}")
        elif _DURATION_RE.fullmatch(text):
            amount = Decimal(0)
            for number, unit in _DURATION_PART_RE.findall(text):
                amount = _CTX.add(amount, _CTX.multiply(Decimal(number), _DURATION_UNITS[unit]))
        else:
            raise SpecError(field, f"{expected}, got {_show(value)}")
    else:
        amount = _decimal(value, field, expected)
    _check_sign(amount, value, field)
    try:
        seconds = float(amount)
    except (OverflowError, InvalidOperation):  # pragma: no cover - float() saturates to inf
        seconds = math.inf
    if not math.isfinite(seconds):
        raise SpecError(field, f"duration too large, got {_show(value)}")
    return seconds


def format_cpu(milli: int) -> str:
    """``500`` -> ``"500m"``, ``2000`` -> ``"2"``: whole cores when exact, else millicores."""
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"


def _fraction(n: int, unit: int) -> str | None:
    """``n / unit`` as a decimal with at most 3 places, or None when that is not exact."""
    if (n * 1000) % unit:
        return None
    whole, rest = divmod(n * 1000 // unit, 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}".rstrip("0")


def _in_units(n: int, units: dict[str, int]) -> str | None:
    """``n`` in the largest unit of ``units`` that states it exactly and readably: a whole
    number, or at most three decimals on a value below 1024 (``1.5Ki``, not ``488281.25Ki``)."""
    for suffix, unit in reversed(units.items()):
        if n < unit:
            continue
        text = _fraction(n, unit)
        if text is not None and ("." not in text or n < 1024 * unit):
            return text + suffix
    return None


@lru_cache(maxsize=4096)  # few sizes recur: every job spec logged formats its own
def format_bytes(n: int) -> str:
    """A short, exact quantity string for ``n`` bytes: ``67108864`` -> ``"64Mi"``,
    ``1536`` -> ``"1.5Ki"``, ``500000000`` -> ``"500M"``, ``0`` -> ``"0"``.

    Exact means ``parse_bytes(format_bytes(n)) == n`` for every ``n``. Binary units come
    first, since memory sizes are nearly always powers of two: a whole number of them always
    wins; a decimal unit is used when no binary one is exact or it is shorter than a
    fractional binary one; plain bytes when neither is exact or shorter.
    """
    if n < 0:
        return "-" + format_bytes(-n)
    binary, decimal = _in_units(n, _BINARY), _in_units(n, _DECIMAL)
    if binary is not None and ("." not in binary or decimal is None or len(binary) <= len(decimal)):
        return binary
    if decimal is not None and len(decimal) < len(str(n)):
        return decimal
    return str(n)


@lru_cache(maxsize=4096)
def format_gpu(milli: int) -> str:
    """``250`` -> ``"0.25"``, ``2000`` -> ``"2"``."""
    if milli < 0:
        return "-" + format_gpu(-milli)
    return _fraction(milli, 1000) or "0"
