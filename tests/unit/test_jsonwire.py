"""The JSON form of the request API (mesh.jsonwire): which requests are JSON, how they
become the msgpack request they stand for, and how replies and their bytes look."""

from __future__ import annotations

import base64
import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh import jsonwire
from mesh.codec import WireError, decode
from mesh.schema import SubmitManyRequest, SubmitRequest, error_reply, ok

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), plain))
def test_no_msgpack_request_is_taken_for_json(request):
    """A msgpack request is a map, and no msgpack map starts with `{` or white space."""
    assert not jsonwire.is_json(msgpack.packb(request, use_bin_type=True))


def test_json_is_known_by_its_first_byte_or_its_header():
    assert jsonwire.is_json(b'{"job_id": "x"}')
    assert jsonwire.is_json(b' \r\n\t{"job_id": "x"}')
    assert not jsonwire.is_json(b'["x"]') and not jsonwire.is_json(b"")
    assert jsonwire.is_json(b"", {"Content-Type": "application/json"})
    assert jsonwire.is_json(b"", {"content-type": "Application/JSON; charset=utf-8"})
    # a header saying otherwise wins over the first byte
    assert not jsonwire.is_json(b"{", {"Content-Type": "application/msgpack"})
    assert not jsonwire.is_json(b"\x80", {"Nats-Msg-Id": "x"})


def test_a_json_request_decodes_as_its_msgpack_twin():
    body = json.dumps({"client_id": "c", "spec": {"name": "x", "tasks": [{"role": "a"}]}})
    req = decode(SubmitRequest, jsonwire.to_msgpack(body.encode()))
    assert req == SubmitRequest("c", {"name": "x", "tasks": [{"role": "a"}]})
    assert jsonwire.to_msgpack(b"  ") == msgpack.packb({})  # an empty body is {}


def test_b64_fields_are_bytes_at_the_request_and_item_level_only():
    yaml_bytes = "name: \u00e9\n".encode("latin-1")  # not UTF-8: only bytes can carry it
    b64 = base64.b64encode(yaml_bytes).decode()
    req = decode(
        SubmitRequest, jsonwire.to_msgpack(json.dumps({"client_id": "c", "spec_b64": b64}).encode())
    )
    assert req.spec == yaml_bytes
    many = {"jobs": [{"client_id": "a", "spec_b64": b64}, {"client_id": "b", "spec": "x"}]}
    got = decode(SubmitManyRequest, jsonwire.to_msgpack(json.dumps(many).encode()))
    assert [j.spec for j in got.jobs] == [yaml_bytes, "x"]
    # inside a spec given as an object, `_b64` is an ordinary name (an env variable, say)
    inner = {"client_id": "c", "spec": {"name": "x", "env_b64": b64}}
    assert decode(SubmitRequest, jsonwire.to_msgpack(json.dumps(inner).encode())).spec == {
        "name": "x",
        "env_b64": b64,
    }


@pytest.mark.parametrize(
    "body, words",
    [
        (b'{"spec": "a", "spec_b64": "YQ=="}', "spec_b64: give spec or spec_b64, not both"),
        (b'{"spec_b64": 1}', "spec_b64: expected base64 text"),
        (b'{"jobs": [{"spec_b64": "!"}]}', "jobs[0].spec_b64: not valid base64 text"),
        (b'{"a": 1, "a": 2}', "the key 'a' appears twice"),
        (b'{"a": Infinity}', "Infinity is not a JSON number"),
        (b'{"a": ' + b"1" * 25 + b"}", "an integer of 25 digits is out of range"),
        (b'{"a": 18446744073709551616}', "an integer is out of range"),
        (b'{"a": 1} x', "not valid JSON: extra text after the object at line 1 column 10"),
        (b'{"a": \xff}', "not valid JSON: not UTF-8 text (byte 6)"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"a":' + b"[" * 100_000, "not valid JSON: nested too deeply"),
    ],
)
def test_bad_json_is_refused_in_words(body, words):
    with pytest.raises(WireError) as err:
        jsonwire.to_msgpack(body)
    assert words in str(err.value), str(err.value)


def test_replies_as_json_with_bytes_in_base64():
    reply = ok(task_id="t", data=b"\x00\xffhello", parts=[b"ab", 1], size=float("inf"))
    out = json.loads(jsonwire.from_msgpack(reply))
    assert out == {
        "ok": True,
        "task_id": "t",
        "data_b64": base64.b64encode(b"\x00\xffhello").decode(),
        "parts": [{"_b64": "YWI="}, 1],
        "size": None,
    }
    assert json.loads(jsonwire.from_msgpack(error_reply("NOT_FOUND", "no job 'x'"))) == {
        "ok": False,
        "error": {"code": "NOT_FOUND", "message": "no job 'x'"},
    }
