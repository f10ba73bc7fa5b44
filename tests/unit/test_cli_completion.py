"""`mesh completion bash|zsh`: the script is sourced in a real bash and its completion
function asked what `mesh jo<TAB>` and friends complete to."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mesh.cli.completion import script, tree
from mesh.cli.main import main
from mesh.cli.parser import build_parser

BASH = shutil.which("bash")


@pytest.fixture(scope="module")
def script_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("completion") / "mesh.bash"
    path.write_text(script(build_parser(), "bash"))
    return path


def complete(script_file, line: str) -> list[str]:
    """What bash offers for `line` (a trailing space: a new, empty word)."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    arr = " ".join(f"'{w}'" for w in words)
    cmd = (
        f"source {script_file}; COMP_WORDS=({arr}); COMP_CWORD={len(words) - 1}; "
        'COMP_LINE="$*"; _mesh; printf "%s\\n" "${COMPREPLY[@]}"; '
        "complete -p mesh"
    )
    r = subprocess.run([BASH, "--norc", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    *offers, registration = r.stdout.splitlines()
    assert registration == "complete -o default -F _mesh mesh"
    return sorted(o for o in offers if o)


def test_commands(script_file):
    assert complete(script_file, "mesh jo") == ["job"]
    assert complete(script_file, "mesh co") == ["completion", "context", "coordinator"]


def test_subcommands_after_global_flags_with_values(script_file):
    assert complete(script_file, "mesh job ") == [
        "hosts",
        "kill",
        "list",
        "logs",
        "run",
        "scale",
        "status",
        "update",
    ]
    assert complete(script_file, "mesh --region eu job k") == ["kill"]
    assert complete(script_file, "mesh -o json context u") == ["use"]


def test_flags_of_the_subcommand(script_file):
    offers = complete(script_file, "mesh job kill --")
    assert {"--state", "--pool", "--all", "--reason", "--json", "--nats"} <= set(offers)
    assert "--wait" not in offers
    assert complete(script_file, "mesh job run --wa") == ["--wait"]


def test_flag_choices(script_file):
    assert complete(script_file, "mesh job list -o ") == ["json", "table", "wide", "yaml"]
    assert complete(script_file, "mesh job kill --state R") == ["RUNNING"]
    assert complete(script_file, "mesh completion ") == ["bash", "zsh"]
    assert complete(script_file, "mesh --nats ") == []  # a value: no command words offered


def test_tree_follows_the_parser():
    levels = tree(build_parser())
    assert "job kill" in levels and "--state" in levels["job kill"].valued
    assert "--all" in levels["job kill"].flags and "--all" not in levels["job kill"].valued


def test_zsh_script_uses_bash_emulation(capsys):
    assert main(["completion", "zsh"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("#compdef mesh") and "bashcompinit" in text and "_mesh_words" in text
