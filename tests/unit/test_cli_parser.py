"""The CLI's arguments: global flags before or after the subcommand, output formats,
and the bulk forms of `job run` and `job kill`."""

from __future__ import annotations

import argparse

import pytest

from mesh.cli import output
from mesh.cli.parser import build_parser, subparsers


def parse(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(list(argv))
    output.normalise(args)
    return args


@pytest.mark.parametrize(
    "argv",
    [
        ("--json", "job", "list"),
        ("job", "list", "--json"),
        ("job", "--json", "list"),
        ("-o", "json", "job", "list"),
        ("job", "list", "-o", "json"),
    ],
)
def test_json_anywhere(argv):
    args = parse(*argv)
    assert args.output == "json" and args.json and args.job_cmd == "list"


def test_connection_flags_after_the_subcommand():
    args = parse(
        "job", "status", "j1", "--nats", "tls://h:4222", "--region", "eu", "--certs", "/c",
        "--user", "bob", "--context", "prod", "--log-level", "info", "--insecure",
    )  # fmt: skip
    assert (args.nats, args.region, args.certs, args.user) == ("tls://h:4222", "eu", "/c", "bob")
    assert (args.context, args.log_level, args.insecure) == ("prod", "info", True)


def test_absent_after_subcommand_keeps_the_value_before_it():
    args = parse("--region", "eu", "-o", "yaml", "node", "list")
    assert args.region == "eu" and args.output == "yaml" and args.json
    args = parse("node", "list")
    assert args.region is None and args.output == "table" and not args.json
    assert args.log_level is None  # main() picks the command's default (warning here)


def test_server_commands_take_the_connection_flags_after_too():
    args = parse("agent", "--region", "eu", "--nats", "tls://x:4222", "--node-id", "n1")
    assert (args.region, args.nats, args.node_id) == ("eu", "tls://x:4222", "n1")
    args = parse("coordinator", "--certs", "/c", "--region", "eu")
    assert (args.certs, args.region) == ("/c", "eu")


def test_subcommands_own_flags_win():
    args = parse("up", "--insecure")
    assert args.up_insecure and not args.insecure
    args = parse("--certs", "/c", "certs", "issue", "--user", "bob")
    assert args.user == "bob" and args.certs == "/c"


def test_every_subcommand_has_the_global_flags():
    def walk(p, path):
        for name, sp in subparsers(p):
            yield f"{path} {name}".strip(), sp
            yield from walk(sp, f"{path} {name}")

    for path, sp in walk(build_parser(), ""):
        for flag in ("--json", "-o", "--nats", "--region", "--log-level", "--context"):
            assert flag in sp._option_string_actions, (path, flag)


def test_bad_output_format_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("job", "list", "-o", "xml")
    assert exc.value.code == 2 and "invalid choice: 'xml'" in capsys.readouterr().err


def test_bulk_forms():
    args = parse("job", "run", "a.yaml", "b.yaml", "--wait")
    assert args.file == ["a.yaml", "b.yaml"] and args.wait
    args = parse("job", "kill", "j1", "j2", "j3")
    assert args.job_id == ["j1", "j2", "j3"]
    args = parse("job", "kill", "--state", "PENDING", "--pool", "/batch")
    assert (args.job_id, args.state, args.pool) == ([], "PENDING", "/batch")


def test_task_help_says_what_it_takes(capsys):
    with pytest.raises(SystemExit):
        parse("job", "logs", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "unique prefix or suffix" in text and "its index (0)" in text


@pytest.mark.parametrize("cmd", [("job", "run"), ("pool", "apply"), ("model", "deploy")])
def test_non_utf8_file_is_a_clear_usage_error(tmp_path, monkeypatch, capsys, cmd):
    monkeypatch.setenv("MESH_HOME", str(tmp_path / "home"))
    path = tmp_path / "spec.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    from mesh.cli.main import main

    # Nothing listens on port 1: the file is refused before any connection is tried.
    assert main(["--nats", "nats://127.0.0.1:1", *cmd, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not UTF-8 text (byte 0xe9 at offset 9)" in err and "Traceback" not in err
