"""The examples in the docs are real: every job spec and pools file shown parses."""

from __future__ import annotations

import re
from pathlib import Path

from coordinator.pools import parse_pool_tree
from workloads.spec import parse_job_spec

ROOT = Path(__file__).resolve().parents[2]


def yaml_blocks(path: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S)


def test_readme_examples_parse():
    blocks = yaml_blocks(ROOT / "README.md")
    specs = [b for b in blocks if b.lstrip().startswith("name:")]
    pools = [b for b in blocks if "pools:" in b]
    assert specs and pools
    for block in specs:
        parse_job_spec(block)
    for block in pools:
        parse_pool_tree(block)


def test_workloads_readme_spec_parses():
    (spec,) = [b for b in yaml_blocks(ROOT / "workloads" / "README.md") if b.startswith("name:")]
    parse_job_spec(spec)


def test_example_files_parse():
    for path in (ROOT / "docs" / "examples").glob("*.yaml"):
        parse_job_spec(path.read_text())
