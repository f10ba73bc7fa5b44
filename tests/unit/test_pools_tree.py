"""Pool tree: YAML parsing, validation and its error messages, the public surface."""

from __future__ import annotations

import pickle

import pytest

import coordinator.pools as pools
from coordinator.pools import (
    PoolConfigError,
    PoolSpec,
    PoolTree,
    PoolType,
    ResourceSpec,
    format_amount,
    parse_pool_tree,
)
from workloads.quantity import SpecError

Gi = 2**30

EXAMPLE = """
pools:
  /ml:
    description: machine learning
    type: elastic
    share: 2
    cpu:    {reservation: 20, limit: 100}
    memory: {reservation: 64Gi, limit: 256Gi, share: 1}
    gpu:    {reservation: 4, limit: 8, type: static}
  /ml/vision:
    gpu: {reservation: 2, limit: 4}
    cpu: {reservation: 500m}
  /ml/nlp:
    gpu: {reservation: 0.5}
  /web:
    type: static
    cpu: {reservation: 10}
"""


def problems(source) -> list[str]:
    with pytest.raises(PoolConfigError) as err:
        parse_pool_tree(source)
    return str(err.value).splitlines()


def test_public_surface():
    assert set(pools.__all__) == {
        "Admission", "POOL_KINDS", "PendingJob", "PoolConfigError", "PoolSpec", "PoolTree",
        "PoolType", "ROOT", "ResourceSpec", "RunningJob", "Victim", "VictimChoice", "admit",
        "any_over_entitlement", "choose_victims", "compute_entitlement", "demand_by_pool",
        "format_amount", "parse_pool_tree", "reservation_shortfall", "sum_by_pool", "wants",
    }
    assert all(hasattr(pools, name) for name in pools.__all__)


def test_parse_example():
    tree = parse_pool_tree(EXAMPLE)
    assert tree.order == ("/", "/ml", "/web", "/ml/nlp", "/ml/vision")
    ml = tree["/ml"]
    assert ml.description == "machine learning"
    assert ml.cpu == ResourceSpec(20_000, 100_000, 2, PoolType.ELASTIC)
    assert ml.memory == ResourceSpec(64 * Gi, 256 * Gi, 1, PoolType.ELASTIC)
    assert ml.gpu == ResourceSpec(4000, 8000, 2, PoolType.STATIC)
    assert ml.disk == ResourceSpec(0, None, 2, PoolType.ELASTIC)  # pool-wide defaults
    assert tree["/ml/vision"].cpu.reservation == 500
    assert tree["/ml/nlp"].gpu.reservation == 500
    assert tree["/web"].cpu.type is PoolType.STATIC and tree["/web"].gpu.type is PoolType.STATIC
    assert tree.children("/ml") == ("/ml/nlp", "/ml/vision")
    assert tree.leaves() == ("/web", "/ml/nlp", "/ml/vision")
    assert tree.ancestors("/ml/vision") == ("/ml", "/")
    assert tree.parent("/ml") == "/" and tree.parent("/") is None
    assert tree.is_leaf("/web") and not tree.is_leaf("/ml")
    # Limits: own, else the nearest ancestor's, else none.
    assert tree.effective_limit("/ml/vision", "gpu") == 4000
    assert tree.effective_limit("/ml/nlp", "gpu") == 8000
    assert tree.effective_limit("/web", "gpu") is None
    assert "/ml" in tree and "/nope" not in tree and len(tree) == 5


def test_parse_accepts_mapping_and_bytes_and_an_empty_tree():
    import yaml

    assert parse_pool_tree(yaml.safe_load(EXAMPLE)) == parse_pool_tree(EXAMPLE.encode())
    tree = parse_pool_tree("pools: {}")
    assert tree.order == ("/",) and tree.leaves() == ("/",)
    assert parse_pool_tree("pools:\n  /a:\n").order == ("/", "/a")


def test_limit_below_reservation_message():
    assert problems("""
pools:
  /ml: {cpu: {reservation: 20}}
  /ml/vision: {cpu: {reservation: 20, limit: 10}}
""") == ["/ml/vision: cpu limit 10 is below its reservation 20"]


def test_child_limit_above_parent_limit():
    assert problems("""
pools:
  /ml: {gpu: {limit: 8}}
  /ml/vision: {gpu: {limit: 16}}
""") == ["/ml/vision: gpu limit 16 is above its parent's limit 8"]
    # Against the nearest ancestor that has one, named.
    assert problems("""
pools:
  /ml: {memory: {limit: 1Gi}}
  /ml/vision: {}
  /ml/vision/a: {memory: {limit: 2Gi}}
""") == ["/ml/vision/a: memory limit 2Gi is above /ml's (inherited by /ml/vision) limit 1Gi"]


def test_children_reservations_above_parent():
    assert problems("""
pools:
  /ml: {cpu: {reservation: 20}}
  /ml/a: {cpu: {reservation: 15}}
  /ml/b: {cpu: {reservation: 10}}
  /ml/c: {}
""") == ["/ml: cpu reservations of its children sum to 25 (/ml/a 15, /ml/b 10), above its "
         "own reservation 20"]


def test_every_problem_reported_at_once_by_pool():
    lines = problems("""
pools:
  /ml: {cpu: {reservation: 20, limit: 100}}
  /ml/vision: {cpu: {reservation: 20, limit: 10}, gpu: {reservation: lots}, colour: red}
  /ml/nlp: {cpu: {limit: 200, share: 0, type: stati}}
  /x/y: {}
  /Bad: {}
""")
    assert lines == [
        "/Bad: expected '/' or a path like /ml/vision (segments of 1-32 a-z, 0-9, '_', '-')",
        "/ml/nlp: cpu share must be a number above 0 and at most 1000000, in steps of 0.001, "
        "got 0",
        "/ml/nlp: cpu type must be elastic or static, got 'stati'",
        "/ml/nlp: cpu limit 200 is above its parent's limit 100",
        "/ml/vision: unknown field 'colour' (known: type, share, description, cpu, memory, "
        "disk, gpu)",
        "/ml/vision: gpu reservation: expected a GPU count like 1, 2 or a fraction like 0.25, "
        "got 'lots'",
        "/ml/vision: cpu limit 10 is below its reservation 20",
        "/x/y: its parent pool /x is not defined",
    ]


def test_error_is_a_spec_error_with_field_and_problem():
    with pytest.raises(SpecError) as err:
        parse_pool_tree("pools:\n  /a: {cpu: {reservation: 2, limit: 1}}\n")
    assert err.value.field == "/a"
    assert err.value.problem == "cpu limit 1 is below its reservation 2"
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and again.problems == err.value.problems


@pytest.mark.parametrize("source, expected", [
    ("[", "invalid YAML: line 2: did not find expected node content"),
    ("pools: [1]", "pools: expected a mapping from pool path to its settings, got list"),
    ("other: 1", "unknown top-level field 'other' (known: pools)"),
    ("pools:\n  /a: {}\n  /a: {}\n", "invalid YAML: line 3: found duplicate key '/a'"),
    ("pools:\n  /a: 3\n", "/a: expected a mapping of settings, got int"),
    ("pools:\n  /a: {cpu: 3}\n", "/a: cpu: expected a mapping with reservation/limit/share/type, "
                                 "got int"),
    ("pools:\n  /a: {cpu: {reserve: 3}}\n", "/a: cpu: unknown field 'reserve' (known: "
                                            "reservation, limit, share, type)"),
    ("pools:\n  /a: {memory: {limit: -1Gi}}\n", "/a: memory limit: must not be negative, "
                                                "got '-1Gi'"),
    ("pools:\n  /a: {share: 0.0001}\n", "/a: share must be a number above 0 and at most "
                                        "1000000, in steps of 0.001, got 0.0001"),
    ("pools:\n  /a: {description: [1]}\n", "/a: description must be a string, got list"),
    ("pools:\n  /: {gpu: {reservation: 1}}\n", "/: gpu: the root stands for the whole cluster, "
     "whose capacity is its entitlement; set reservations, limits, shares and types on its "
     "children"),
    (b"\xff", "not valid UTF-8: invalid start byte at byte 0"),
    (42, "expected YAML text, bytes or a mapping, got int"),
])
def test_bad_documents(source, expected):
    assert problems(source) == [expected]


def test_too_deep():
    path = "/" + "/".join(f"l{i}" for i in range(9))
    specs = [PoolSpec("/" + "/".join(f"l{i}" for i in range(n))) for n in range(1, 9)]
    with pytest.raises(PoolConfigError, match="at most 8 levels deep"):
        PoolTree((*specs, PoolSpec(path)))


def test_python_built_trees_are_validated_too():
    with pytest.raises(PoolConfigError) as err:
        PoolTree((PoolSpec("/a", cpu=ResourceSpec(reservation=-1)),
                  PoolSpec("/b", gpu=ResourceSpec(share=1 / 3)),
                  PoolSpec("/b"), "junk"))
    assert err.value.problems == (
        ("", "expected a PoolSpec, got str"),
        ("/a", "cpu reservation must be a non-negative integer, got -1"),
        ("/b", "defined twice"),
        ("/b", "gpu share must be a number above 0 and at most 1000000, in steps of 0.001, "
               "got 0.3333333333333333"),
    )


def test_root_added_and_order_independent():
    a = PoolTree((PoolSpec("/b"), PoolSpec("/a"), PoolSpec("/a/x")))
    b = PoolTree((PoolSpec("/"), PoolSpec("/a/x"), PoolSpec("/a"), PoolSpec("/b")))
    assert a == b and a.order == ("/", "/a", "/b", "/a/x")
    assert a.parent_index == (-1, 0, 0, 1) and a.child_index == ((1, 2), (3,), (), ())


def test_format_amount():
    assert format_amount("gpu", 6000) == "6"
    assert format_amount("gpu", 500) == "0.5"
    assert format_amount("cpu", 500) == "500m"
    assert format_amount("cpu", 10_000) == "10"
    assert format_amount("memory", 2 * Gi) == "2Gi"
