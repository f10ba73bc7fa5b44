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


def _cli_reference() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## CLI reference") : text.index("## Benchmarks")]


def test_readme_cli_reference_matches_the_parser():
    """Every command the README's CLI table names exists, with every flag it shows;
    every command exists in the table; every global flag is in the global flags text."""
    from mesh.cli.completion import tree
    from mesh.cli.parser import build_parser

    levels = tree(build_parser())
    ref = _cli_reference()
    shown = re.findall(r"`(mesh [^`]+)`", ref)
    named = set()
    for usage in shown:
        words = usage.split()[1:]
        path: list[str] = []
        for w in words:
            if " ".join([*path, w]) in levels:
                path.append(w)
            else:
                break
        assert path, usage
        named.add(" ".join(path))
        level = levels[" ".join(path)]
        for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage):
            assert flag in level.flags, (usage, flag)
    for cmd in levels[""].words:
        assert cmd in {n.split()[0] for n in named}, cmd
    glob = ref[ref.index("Global flags") : ref.index("| command | does |")]
    for flag in levels["job list"].flags:
        if flag not in ("-h", "--help", "--state", "--pool", "--limit", "--output"):
            assert f"`{flag}" in glob, flag
