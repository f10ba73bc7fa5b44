"""Quantities (workloads.quantity) and the Resources vector (workloads.resources)."""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import (
    Resources,
    SpecError,
    format_bytes,
    format_cpu,
    format_gpu,
    parse_bytes,
    parse_cpu,
    parse_duration,
    parse_gpu,
)
from workloads.quantity import MAX_BYTES

Ki, Mi, Gi, Ti = 2**10, 2**20, 2**30, 2**40


def test_spec_error_str_and_fields():
    err = SpecError("tasks[1].resources.memory", "bad")
    assert str(err) == "tasks[1].resources.memory: bad"
    assert (err.field, err.problem) == ("tasks[1].resources.memory", "bad")
    assert str(SpecError("", "just this")) == "just this"
    assert isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.field, again.problem, str(again)) == (err.field, err.problem, str(err))


# --------------------------------------------------------------------------- cpu


@pytest.mark.parametrize(
    ("value", "milli"),
    [
        (0, 0),
        (2, 2000),
        (0.5, 500),
        ("0.5", 500),
        ("500m", 500),
        ("2", 2000),
        (" 2 ", 2000),
        (0.1, 100),
        ("0.001", 1),
        ("1m", 1),
        (1.25, 1250),
        ("+3", 3000),
        (".5", 500),
        ("1000000", 1_000_000_000),
    ],
)
def test_parse_cpu_good(value, milli):
    assert parse_cpu(value) == milli


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "must not be negative"),
        ("-500m", "must not be negative"),
        (math.nan, "expected a CPU quantity"),
        (math.inf, "expected a CPU quantity"),
        (True, "expected a CPU quantity"),
        ("abc", "expected a CPU quantity like 500m, 0.5 or 2, got 'abc'"),
        ("", "expected a CPU quantity"),
        ("1.5m", "whole millicores"),
        (0.0005, "whole millicores"),
        ("2 cores", "expected a CPU quantity"),
        ("1e3", "expected a CPU quantity"),
        (None, "expected a CPU quantity"),
        ([1], "expected a CPU quantity"),
        (1_000_001, "at most 1000000 cores"),
        ("1000001", "at most 1000000 cores"),
        ("9" * 200, "expected a CPU quantity"),
    ],
)
def test_parse_cpu_bad(value, message):
    with pytest.raises(SpecError) as info:
        parse_cpu(value, "tasks[0].resources.cpu")
    assert info.value.field == "tasks[0].resources.cpu"
    assert message in info.value.problem


def test_parse_default_field_names():
    for fn, name in ((parse_cpu, "cpu"), (parse_bytes, "memory"), (parse_gpu, "gpu")):
        with pytest.raises(SpecError) as info:
            fn("junk")
        assert info.value.field == name
        assert str(info.value).startswith(f"{name}: ")


def test_format_cpu():
    assert format_cpu(500) == "500m"
    assert format_cpu(2000) == "2"
    assert format_cpu(0) == "0"
    assert format_cpu(1500) == "1500m"


@given(st.integers(0, 1_000_000_000))
def test_cpu_round_trip(milli):
    assert parse_cpu(format_cpu(milli)) == milli


# --------------------------------------------------------------------------- bytes


@pytest.mark.parametrize(
    ("value", "n"),
    [
        (0, 0),
        (1024, 1024),
        ("64Mi", 64 * Mi),
        ("2Gi", 2 * Gi),
        ("1Ti", Ti),
        ("1G", 10**9),
        ("500M", 500 * 10**6),
        ("1k", 1000),
        ("1Ki", 1024),
        ("123", 123),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1E", 10**18),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1.5Gi", 3 * Gi // 2),
        ("0.5Ki", 512),
        (" 64Mi ", 64 * Mi),
        # Fractions round up, as in Kubernetes: a request never shrinks below what was written.
        ("1.1", 2),
        ("0.001k", 1),
        ("1.0001Ki", 1025),
        (1.5, 2),
    ],
)
def test_parse_bytes_good(value, n):
    assert parse_bytes(value) == n


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("lots", "expected a quantity like 64Mi or 2Gi, got 'lots'"),
        ("-1Gi", "must not be negative, got '-1Gi'"),
        (-5, "must not be negative"),
        (True, "expected a quantity like 64Mi or 2Gi, got True"),
        (math.nan, "expected a quantity"),
        ("1K", "expected a quantity"),  # Kubernetes: decimal kilo is a lower-case k
        ("1mi", "expected a quantity"),
        ("1 Gi", "expected a quantity"),
        ("1GB", "expected a quantity"),
        ("Gi", "expected a quantity"),
        ({"a": 1}, "expected a quantity"),
        ("2Ei", "at most 1Ei"),
        (2**60 + 1, "at most 1Ei"),
    ],
)
def test_parse_bytes_bad(value, message):
    with pytest.raises(SpecError) as info:
        parse_bytes(value, "tasks[1].resources.memory")
    assert info.value.field == "tasks[1].resources.memory"
    assert message in info.value.problem


def test_parse_bytes_message_in_full():
    with pytest.raises(SpecError) as info:
        parse_bytes("lots", "tasks[1].resources.memory")
    assert str(info.value) == (
        "tasks[1].resources.memory: expected a quantity like 64Mi or 2Gi, got 'lots'"
    )


def test_parse_bytes_cap_is_inclusive():
    assert parse_bytes(MAX_BYTES) == MAX_BYTES


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (67108864, "64Mi"),
        (1536, "1.5Ki"),
        (0, "0"),
        (1, "1"),
        (1024, "1Ki"),
        (1000, "1k"),
        (500 * 10**6, "500M"),
        (3 * Gi // 2, "1.5Gi"),
        (2**60, "1Ei"),
        (1025, "1025"),
        (Gi + 1, str(Gi + 1)),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@settings(max_examples=200)
@given(st.integers(0, MAX_BYTES))
def test_bytes_round_trip_any(n):
    assert parse_bytes(format_bytes(n)) == n


@settings(max_examples=200)
@given(st.integers(1, 1023), st.sampled_from([Ki, Mi, Gi, Ti, 2**50]))
def test_bytes_round_trip_multiples(k, unit):
    text = format_bytes(k * unit)
    assert parse_bytes(text) == k * unit
    assert text[-2:] in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


# --------------------------------------------------------------------------- gpu


@pytest.mark.parametrize(
    ("value", "milli"),
    [
        (0, 0),
        (0.25, 250),
        ("0.25", 250),
        (1, 1000),
        (2, 2000),
        ("2", 2000),
        (1.0, 1000),
        (0.001, 1),
        ("0.5", 500),
        (8, 8000),
        ("3.0", 3000),
    ],
)
def test_parse_gpu_good(value, milli):
    assert parse_gpu(value) == milli


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.5, "fractional GPUs must be below 1; ask for whole GPUs above 1"),
        ("2.5", "fractional GPUs must be below 1"),
        (0.0001, "at most 3 decimal places"),
        ("0.1234", "at most 3 decimal places"),
        (-1, "must not be negative"),
        (-0.5, "must not be negative"),
        (True, "expected a GPU count"),
        ("one", "expected a GPU count"),
        ("250m", "expected a GPU count"),
        (math.inf, "expected a GPU count"),
        (10**7, "at most 1000000 GPUs"),
    ],
)
def test_parse_gpu_bad(value, message):
    with pytest.raises(SpecError) as info:
        parse_gpu(value, "tasks[0].resources.gpu")
    assert info.value.field == "tasks[0].resources.gpu"
    assert message in info.value.problem


def test_format_gpu():
    assert format_gpu(250) == "0.25"
    assert format_gpu(2000) == "2"
    assert format_gpu(0) == "0"
    assert format_gpu(1) == "0.001"
    assert format_gpu(500) == "0.5"


@given(st.one_of(st.integers(0, 1000), st.integers(1, 10_000).map(lambda n: n * 1000)))
def test_gpu_round_trip(milli):
    assert parse_gpu(format_gpu(milli)) == milli


# --------------------------------------------------------------------------- duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (1.5, 1.5),
        (0, 0.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("1d", 86400.0),
        ("1.5h", 5400.0),
        ("90", 90.0),
        ("1m30s500ms", 90.5),
        (" 10s ", 10.0),
    ],
)
def test_parse_duration_good(value, seconds):
    result = parse_duration(value, "max_run_time")
    assert result == seconds
    assert isinstance(result, float)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "must not be negative"),
        ("-5s", "must not be negative"),
        ("-5", "must not be negative"),
        ("soon", "expected a duration like 30s"),
        ("5 m", "expected a duration"),
        ("5x", "expected a duration"),
        ("", "expected a duration"),
        ("h", "expected a duration"),
        (True, "expected a duration"),
        (math.nan, "expected a duration"),
        (math.inf, "expected a duration"),
        (None, "expected a duration"),
    ],
)
def test_parse_duration_bad(value, message):
    with pytest.raises(SpecError) as info:
        parse_duration(value, "max_run_time")
    assert info.value.field == "max_run_time"
    assert message in info.value.problem


# --------------------------------------------------------------------------- Resources


def test_resources_arithmetic():
    a = Resources(cpu=500, memory=64 * Mi, gpu=250)
    b = Resources(cpu=100, memory=Mi, disk=Gi, gpu_memory=Gi)
    assert a + b == Resources(cpu=600, memory=65 * Mi, disk=Gi, gpu=250, gpu_memory=Gi)
    assert (a + b) - b == a
    assert b - a == Resources(cpu=-400, memory=-63 * Mi, disk=Gi, gpu=-250, gpu_memory=Gi)
    assert a.scaled(3) == Resources(cpu=1500, memory=192 * Mi, gpu=750)
    assert a.scaled(0).is_zero()
    assert Resources().is_zero() and not a.is_zero()
    with pytest.raises(TypeError):
        a + 1


def test_resources_fit_and_shortfall():
    cap = Resources(cpu=1000, memory=Gi, disk=Gi, gpu=1000, gpu_memory=Gi)
    assert Resources(cpu=1000, memory=Gi).fits_in(cap)
    assert Resources().fits_in(Resources())
    need = Resources(cpu=1001, memory=Gi, disk=2 * Gi, gpu=1000, gpu_memory=2 * Gi)
    assert not need.fits_in(cap)
    assert need.shortfall(cap) == ("cpu", "disk", "gpu_memory")
    assert Resources(gpu=250).shortfall(Resources()) == ("gpu",)
    assert Resources().shortfall(cap) == ()


def test_resources_dicts():
    r = Resources(cpu=500, memory=64 * Mi, disk=0, gpu=250, gpu_memory=10 * Gi)
    assert r.to_dict() == {
        "cpu": 500,
        "memory": 64 * Mi,
        "disk": 0,
        "gpu": 250,
        "gpu_memory": 10 * Gi,
    }
    assert Resources.from_dict(r.to_dict()) == r
    assert Resources.from_dict({"gpu": 1000}) == Resources(gpu=1000)
    assert Resources.KINDS == ("cpu", "memory", "disk", "gpu", "gpu_memory")


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"cpu": -1}, "cpu", "between 0 and"),
        ({"memory": "64Mi"}, "memory", "expected an integer"),
        ({"gpu": True}, "gpu", "expected an integer"),
        ({"gpu": 0.5}, "gpu", "expected an integer"),
        ({"ram": 1}, "ram", "unknown resource kind"),
        ({"disk": 2**63}, "disk", "between 0 and"),
        ([1, 2], "", "must be a mapping"),
    ],
)
def test_resources_from_dict_rejects(data, field, message):
    with pytest.raises(SpecError) as info:
        Resources.from_dict(data)
    assert info.value.field == field
    assert message in info.value.problem


def test_resources_str():
    r = Resources(cpu=500, memory=64 * Mi, gpu=250, gpu_memory=10 * Gi)
    assert str(r) == "cpu=500m memory=64Mi gpu=0.25 gpu_memory=10Gi"
    assert str(Resources()) == "none"
    assert str(Resources(cpu=2000, disk=Gi)) == "cpu=2 disk=1Gi"


def test_resources_is_frozen_and_hashable():
    r = Resources(cpu=1)
    with pytest.raises(AttributeError):
        r.cpu = 2  # type: ignore[misc]
    assert len({r, Resources(cpu=1)}) == 1


_amount = st.integers(-(2**40), 2**40)
_resources = st.builds(Resources, _amount, _amount, _amount, _amount, _amount)


@given(_resources, _resources)
def test_resources_properties(a, b):
    assert a + b - b == a
    assert (a + b).fits_in(a + b)
    assert a.fits_in(a + b) == Resources().fits_in(b)  # adding never shrinks a kind iff b >= 0
    short = a.shortfall(b)
    assert (short == ()) == a.fits_in(b)
    assert list(short) == [k for k in Resources.KINDS if getattr(a, k) > getattr(b, k)]
