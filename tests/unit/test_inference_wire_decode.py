"""The hand-written decoders of the inference hot path accept and reject exactly what
the generic ``mesh.codec.decode`` does, with the same values and the same errors."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.wire import (
    MAX_BATCH,
    MAX_INPUT,
    BatchRequest,
    InferReply,
    InferRequest,
    WireError,
    decode,
    encode,
    ok_bytes,
    ok_encoder,
    parse_batch_request,
    parse_infer_request,
)

INT64 = 2**63 - 1

# Values around every limit the schemas set, and of every msgpack type.
ints = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(
        [-(2**63), -(2**63) + 1, INT64, INT64 + 1, 2**64 - 1, 10**18, 3_600_000, 3_600_001]
    ),
    st.integers(-(2**63), 2**64 - 1),
)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1e-9, 3_600_000.0, 3_600_000.0001, 1.5]),
)
blobs = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"\0" * MAX_INPUT, b"\0" * (MAX_INPUT + 1)]),
)
texts = st.one_of(st.text(max_size=70), st.sampled_from(["m" * 64, "m" * 65]))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, blobs, texts)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=5),
    st.lists(floats, max_size=5),
    st.lists(blobs, max_size=5),
    st.lists(ints, max_size=5),
    st.lists(texts, max_size=5),
    st.dictionaries(texts, scalars, max_size=2),
)


# Per field, values that usually fit it (so whole messages are often valid) or anything.
nat = st.integers(0, INT64)
small = st.integers(-(2**63), INT64)
REQ_FIELDS = {
    "input": st.binary(max_size=64),
    "values": st.lists(
        st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-1000, 1000)),
        max_size=4,
    ),
    "deadline_unix_ns": st.one_of(st.none(), nat),
    "timeout_ms": st.one_of(st.none(), st.floats(0, 3_600_000), st.integers(0, 3_600_000)),
    "v": small,
}
BATCH_FIELDS = {
    "batch_id": nat,
    "model": st.text(max_size=64),
    "inputs": st.lists(st.binary(max_size=16), max_size=4),
    "replies": st.lists(st.text(max_size=20), max_size=4),
    "deadlines_unix_ns": st.lists(small, max_size=4),
    "v": small,
}


def _messages(fields: dict):
    """Maps with every field, or some, each usually of its own type and range."""

    def mix(good):
        return st.booleans().flatmap(lambda fits: good if fits else values)

    mixed = {k: st.one_of(mix(good), good) for k, good in fields.items()}
    extra = st.dictionaries(st.one_of(texts, ints), scalars, max_size=2)
    maps = st.one_of(st.fixed_dictionaries(mixed), st.fixed_dictionaries({}, optional=mixed))
    both = st.builds(lambda a, b: {**b, **a}, maps, extra)
    return both.map(lambda o: msgpack.packb(o, use_bin_type=True))


def _same(fast, generic, data: bytes) -> None:
    try:
        want = generic(data)
    except WireError as exc:
        with pytest.raises(WireError) as got:
            fast(data)
        assert str(got.value) == str(exc)
        return
    assert fast(data) == want


def _generic_request(data: bytes):
    r = decode(InferRequest, data)
    return r.input, r.values, r.deadline_unix_ns, r.timeout_ms


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(_messages(REQ_FIELDS))
def test_infer_request_same_as_generic(data):
    _same(parse_infer_request, _generic_request, data)


@settings(max_examples=700, suppress_health_check=[HealthCheck.too_slow])
@given(_messages(BATCH_FIELDS))
def test_batch_request_same_as_generic(data):
    _same(parse_batch_request, lambda d: decode(BatchRequest, d), data)


@given(st.one_of(st.binary(max_size=40), values.map(lambda o: msgpack.packb(o, use_bin_type=True))))
def test_arbitrary_bytes_same_as_generic(data):
    _same(parse_infer_request, _generic_request, data)
    _same(parse_batch_request, lambda d: decode(BatchRequest, d), data)


@pytest.mark.parametrize(
    "req",
    [
        {"input": b"\1" * 128, "deadline_unix_ns": 1_700_000_000_000_000_000, "v": 1},
        {"input": b"", "timeout_ms": 20},
        {"input": b"x", "timeout_ms": 20.5, "extra": [1, 2]},
        {"values": [1.0, 2, -3.5], "timeout_ms": 1.0},
        {},
    ],
)
def test_usual_requests(req):
    data = encode(req)
    assert parse_infer_request(data) == _generic_request(data)


@pytest.mark.parametrize(
    "bad",
    [
        b"\xc1",
        encode([1, 2]),
        encode({"input": "text"}),
        encode({"timeout_ms": -5}),
        encode({"timeout_ms": float("nan")}),
        encode({"deadline_unix_ns": -1}),
        encode({"deadline_unix_ns": True}),
        encode({"input": b"\0" * (MAX_INPUT + 1)}),
        encode({"values": [True]}),
        encode({"v": 2**64 - 1}),
    ],
)
def test_bad_requests_same_error(bad):
    with pytest.raises(WireError) as want:
        decode(InferRequest, bad)
    with pytest.raises(WireError) as got:
        parse_infer_request(bad)
    assert str(got.value) == str(want.value)


def test_usual_batch():
    b = BatchRequest(7, "mlp", (b"a", b"bc"), ("_INBOX.x.1", "_INBOX.x.2"), (1, 2))
    assert parse_batch_request(encode(b)) == b
    legacy = BatchRequest(8, "mlp", (b"a",) * MAX_BATCH)
    assert parse_batch_request(encode(legacy)) == legacy
    with pytest.raises(WireError):
        parse_batch_request(
            encode({"batch_id": 1, "model": "m", "inputs": [b""] * (MAX_BATCH + 1)})
        )


@given(st.binary(max_size=300), st.text(min_size=1, max_size=64))
def test_ok_encoder_same_reply_as_ok_bytes(output, worker):
    ok = ok_encoder(worker)
    assert decode(InferReply, ok(output)) == decode(InferReply, ok_bytes(output, worker))
    assert decode(InferReply, ok(output)) == InferReply(ok=True, output=output, worker=worker)
