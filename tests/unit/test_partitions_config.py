"""The partition controller's config (coordinator.partitions.config): defaults, YAML, and a
clear error naming the field for every rule."""

from __future__ import annotations

import dataclasses

import pytest

from coordinator.partitions.config import (
    BATCH,
    STATELESS,
    PartitionsConfig,
    PartitionSpec,
    parse_partitions_config,
)
from workloads import SpecError


def test_defaults_are_the_agreed_ones():
    cfg = PartitionsConfig()
    assert cfg.names == (STATELESS, BATCH)
    assert (cfg.hot_fraction, cfg.cold_fraction, cfg.busy_line) == (0.6, 0.4, 0.7)
    assert (cfg.interval_s, cfg.window_s, cfg.stale_after_s) == (10.0, 300.0, 30.0)
    assert (cfg.borrow_after_s, cfg.return_after_s, cfg.cooldown_s) == (20.0, 600.0, 300.0)
    assert (cfg.nodes_per_move, cfg.moves_per_hour) == (10, 120)
    assert (cfg.max_draining, cfg.max_draining_per_zone, cfg.forecast) == (20, 10, True)
    assert cfg.default_partition == BATCH
    assert parse_partitions_config("") == cfg
    assert parse_partitions_config("{}") == cfg


def test_full_document_with_durations_and_virtual_partitions():
    cfg = parse_partitions_config(
        """
partitions:
  batch/critical: {protected: true, min_nodes: 1}   # above its parent: still fine
  stateless: {min_nodes: 2}
  batch: {oversubscribe: 2}
  batch/spot:
default_partition: batch
interval_s: 5s
window_s: 2m30s
stale_after_s: 15
borrow_after_s: 0s
return_after_s: 10m
cooldown_s: 1h
busy_line: 0.8
hot_fraction: 0.95
cold_fraction: 0.25
spike_fraction: 1
nodes_per_move: 3
moves_per_hour: 40
max_draining: 6
max_draining_per_zone: 2
forecast: false
"""
    )
    assert cfg.names == (STATELESS, BATCH, "batch/critical", "batch/spot")
    assert cfg.spec(STATELESS).min_nodes == 2
    assert cfg.spec(BATCH).oversubscribe == 2.0
    assert isinstance(cfg.spec(BATCH).oversubscribe, float)
    assert cfg.spec("batch/critical") == PartitionSpec("batch/critical", 1, 1.0, True)
    assert cfg.spec("nope") is None
    assert cfg.lenders() == (BATCH, "batch/spot")  # protected ones never lend
    assert (cfg.interval_s, cfg.window_s, cfg.stale_after_s) == (5.0, 150.0, 15.0)
    assert (cfg.borrow_after_s, cfg.return_after_s, cfg.cooldown_s) == (0.0, 600.0, 3600.0)
    assert (cfg.busy_line, cfg.hot_fraction, cfg.cold_fraction) == (0.8, 0.95, 0.25)
    assert cfg.spike_fraction == 1
    assert (cfg.nodes_per_move, cfg.moves_per_hour, cfg.max_draining) == (3, 40, 6)
    assert (cfg.max_draining_per_zone, cfg.forecast) == (2, False)


def test_bytes_and_mappings_are_read_too():
    assert parse_partitions_config(b"cooldown_s: 2m").cooldown_s == 120.0
    assert parse_partitions_config({"nodes_per_move": 4}).nodes_per_move == 4


BAD = [
    # (document, field named, words in the problem)
    ("cold_fraction: 0.7", "cold_fraction", "below hot_fraction"),
    ("cold_fraction: 0.6", "cold_fraction", "below hot_fraction"),  # no dead band
    ("cold_fraction: 0", "cold_fraction", "(0, 1]"),
    ("hot_fraction: 1.01", "hot_fraction", "(0, 1]"),
    ("spike_fraction: 0.5", "spike_fraction", "at least hot_fraction"),
    ("spike_fraction: 1.5", "spike_fraction", "(0, 1]"),
    ("busy_line: 0", "busy_line", "(0, 1]"),
    ("busy_line: 1.5", "busy_line", "(0, 1]"),
    ("busy_line: .nan", "busy_line", "(0, 1]"),
    ("busy_line: high", "busy_line", "expected a number"),
    ("busy_line: true", "busy_line", "expected a number"),
    ("interval_s: 0", "interval_s", "(0,"),
    ("window_s: -5s", "window_s", "negative"),
    ("cooldown_s: soon", "cooldown_s", "duration"),
    ("return_after_s: 30d", "return_after_s", "604800"),
    ("nodes_per_move: 0", "nodes_per_move", "between 1"),
    ("moves_per_hour: 2.5", "moves_per_hour", "whole number"),
    ("max_draining: -1", "max_draining", "between 1"),
    ("max_draining_per_zone: yes", "max_draining_per_zone", "whole number"),
    ("forecast: 1", "forecast", "true or false"),
    ("default_partition: gpu", "default_partition", "no configured partition"),
    ("default_partition: 3", "default_partition", "partition name"),
    ("nodes_per_mvoe: 3", "nodes_per_mvoe", "unknown field"),
    ("partitions: [stateless, batch]", "partitions", "mapping"),
    ("partitions: {stateless: {}}", "partitions", "must include 'batch'"),
    ("partitions: {batch: {}}", "partitions", "must include 'stateless'"),
    ("partitions: {stateless: {}, batch: {}, gpu: {}}", "partitions.gpu", "top-level"),
    ("partitions: {stateless: {}, batch: {}, batch/a/b: {}}", "partitions.batch/a/b", "one level"),
    ("partitions: {stateless: {}, batch: {}, gpu/a: {}}", "partitions.gpu/a", "inside stateless"),
    ("partitions: {stateless: {}, batch: {}, Batch/A: {}}", "partitions.Batch/A", "lowercase"),
    ("partitions: {stateless: {}, batch: 3}", "partitions.batch", "mapping of settings"),
    ("partitions: {stateless: {size: 3}, batch: {}}", "partitions.stateless.size", "unknown"),
    ("partitions: {stateless: {min_nodes: -1}, batch: {}}", "partitions.stateless.min_nodes", "0"),
    (
        "partitions: {stateless: {min_nodes: 1.5}, batch: {}}",
        "partitions.stateless.min_nodes",
        "whole number",
    ),
    (
        "partitions: {stateless: {}, batch: {oversubscribe: 0.9}}",
        "partitions.batch.oversubscribe",
        "[1, 100]",
    ),
    (
        "partitions: {stateless: {}, batch: {oversubscribe: .inf}}",
        "partitions.batch.oversubscribe",
        "[1, 100]",
    ),
    (
        "partitions: {stateless: {protected: true}, batch: {}}",
        "partitions.stateless.protected",
        "only a virtual",
    ),
    (
        "partitions: {stateless: {}, batch: {}, batch/c: {protected: 1}}",
        "partitions.batch/c.protected",
        "true or false",
    ),
]


@pytest.mark.parametrize(("doc", "field", "words"), BAD)
def test_bad_fields_are_named(doc, field, words):
    with pytest.raises(SpecError) as err:
        parse_partitions_config(doc)
    assert err.value.field == field
    assert words in err.value.problem


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ("a: [", "invalid YAML: line"),
        ("cooldown_s: 1m\ncooldown_s: 2m", "duplicate key"),
        ("- 1", "expected a mapping"),
        ("x" * (70 << 10), "over"),
    ],
)
def test_unreadable_documents(doc, words):
    with pytest.raises(SpecError) as err:
        parse_partitions_config(doc)
    assert words in str(err.value)


def test_duplicate_partition_is_refused():
    with pytest.raises(SpecError, match="duplicate key"):
        parse_partitions_config("partitions: {stateless: {}, batch: {}, batch: {}}")
    with pytest.raises(SpecError, match="named twice"):
        PartitionsConfig(
            partitions=(PartitionSpec(STATELESS), PartitionSpec(BATCH), PartitionSpec(BATCH))
        )


def test_a_config_built_in_code_is_checked_as_well():
    with pytest.raises(SpecError) as err:
        dataclasses.replace(PartitionsConfig(), cold_fraction=0.9)
    assert err.value.field == "cold_fraction"
    with pytest.raises(SpecError) as err:
        PartitionsConfig(
            partitions=(PartitionSpec(STATELESS), PartitionSpec("batch/x"), PartitionSpec(BATCH))
        )
    assert "parent 'batch' must be declared before it" in err.value.problem
    with pytest.raises(SpecError) as err:
        PartitionsConfig(cooldown_s=-1.0)
    assert err.value.field == "cooldown_s"


def test_the_readme_yaml_parses():
    from pathlib import Path

    readme = Path(__file__).parents[2] / "coordinator" / "partitions" / "README.md"
    text = readme.read_text()
    block = text[text.index("```yaml\n") + 8 :]
    cfg = parse_partitions_config(block[: block.index("```")])
    assert cfg.spec("batch/critical").protected and cfg.return_after_s == 600.0
