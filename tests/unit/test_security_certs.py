"""`mesh certs`: the CA, client certificates, key modes and clear errors."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mesh.cli.main import main
from mesh.security import bundle, pki
from mesh.security.identity import Identity, IdentityError


def cn(path) -> str:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def test_init_and_issue(tmp_path):
    d = tmp_path / "certs"
    assert main(["certs", "init", str(d), "--host", "mesh.example.org", "--host", "10.0.0.7"]) == 0
    names = {p.name for p in d.iterdir()}
    for stem in ("ca", "server", "coordinator", "user-admin"):
        assert f"{stem}.crt" in names and f"{stem}.key" in names
    assert pki.signing_key_path(d).exists() and pki.verify_key_path(d).exists()
    for key in [*d.glob("*.key"), pki.signing_key_path(d)]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert cn(d / "coordinator.crt") == "coordinator"
    assert cn(d / "user-admin.crt") == "user:admin"

    server = x509.load_pem_x509_certificate((d / "server.crt").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.0.0.7"}
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "mesh.example.org"}
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku

    assert main(["certs", "issue", str(d), "--agent", "node-7"]) == 0
    assert main(["--certs", str(d), "certs", "issue", "--user", "bob"]) == 0
    assert cn(d / "agent-node-7.crt") == "agent:node-7"
    client = x509.load_pem_x509_certificate((d / "agent-node-7.crt").read_bytes())
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.issuer == x509.load_pem_x509_certificate((d / "ca.crt").read_bytes()).subject
    assert set(pki.identities(d)) == {
        Identity.coordinator(),
        Identity.user("admin"),
        Identity.user("bob"),
        Identity.agent("node-7"),
    }


def test_errors_are_clear(tmp_path, capsys):
    d = tmp_path / "certs"
    assert main(["certs", "issue", str(d), "--agent", "n1"]) == 2
    assert "holds no CA" in capsys.readouterr().err
    assert main(["certs", "init", str(d)]) == 0
    capsys.readouterr()
    assert main(["certs", "init", str(d)]) == 2  # never a second CA over the first
    assert "already holds a CA" in capsys.readouterr().err
    assert main(["certs", "issue", str(d), "--agent", "a.b"]) == 2
    assert main(["certs", "issue", str(d), "--agent", "*"]) == 2
    assert main(["certs", "issue", str(d), "--user", "admin"]) == 2  # exists: not replaced
    assert "already exists" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["certs", "init", str(tmp_path / "file")]) == 2


def test_nats_conf_lists_every_identity(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d)
    pki.issue(d, Identity.agent("n1"))
    pki.issue(d, Identity.fleet("sim"))
    capsys.readouterr()
    assert main(["--region", "eu", "certs", "nats-conf", str(d), "--fleet-nodes", "sim=2"]) == 0
    conf = capsys.readouterr().out
    assert "verify_and_map: true" in conf
    for user in ("CN=coordinator", "CN=user:admin", "CN=agent:n1", "CN=fleet:sim"):
        assert f'"{user}"' in conf
    assert '"mesh.eu.state.sim-0001"' in conf and "sim-0002" not in conf


def test_issue_refuses_a_non_identity(tmp_path):
    pki.init(tmp_path)
    with pytest.raises(IdentityError):
        pki.issue(tmp_path, "agent:x")  # type: ignore[arg-type]


# ------------------------------------------------------------------ nats-conf


def test_nats_conf_takes_region_after_the_command_and_says_what_it_wrote(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d)
    capsys.readouterr()
    assert main(["certs", "nats-conf", str(d), "--region", "eu"]) == 0  # as docs write it
    out = capsys.readouterr()
    assert '"mesh.eu.api.>"' in out.out and "mesh.default." not in out.out
    assert 'store_dir: "/var/lib/nats"' in out.out  # the stated default
    assert 'pid_file: "/var/lib/nats/nats-server.pid"' in out.out
    # what it wrote, on stderr, so `> nats.conf` captures only the config
    assert "region eu" in out.err and "listen 0.0.0.0:4222" in out.err
    assert "store_dir /var/lib/nats" in out.err and "pid_file /var/lib/nats/" in out.err
    assert "coordinator" in out.err and "admin" in out.err


def test_nats_conf_flags_and_file(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d)
    pki.issue(d, Identity.agent("gpu-07"))
    conf = tmp_path / "nats.conf"
    argv = ["certs", "nats-conf", str(d), "--region", "eu", "--listen", "127.0.0.1:4333"]
    argv += ["--store-dir", str(tmp_path / "js"), "-o", str(conf)]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert out.out == ""
    text = conf.read_text()
    assert 'listen: "127.0.0.1:4333"' in text
    assert f'store_dir: "{tmp_path / "js"}"' in text
    assert f'pid_file: "{tmp_path / "js" / "nats-server.pid"}"' in text
    assert '"CN=agent:gpu-07"' in text
    assert f"wrote {conf}" in out.err and "agent: gpu-07" in out.err
    assert f"note: {tmp_path / 'js'} does not exist here" in out.err
    assert not list(tmp_path.glob(".nats.conf*"))  # the temporary file was renamed away
    pid = tmp_path / "run" / "n.pid"
    (tmp_path / "js").mkdir()
    assert main([*argv, "--pid-file", str(pid)]) == 0
    assert f'pid_file: "{pid}"' in conf.read_text()
    err = capsys.readouterr().err
    assert "js does not exist" not in err and f"{pid.parent} does not exist here" in err


def test_nats_conf_mistakes_exit_2(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d)
    capsys.readouterr()
    assert main(["certs", "nats-conf", str(d), "--region", "a.b"]) == 2
    assert "region 'a.b'" in capsys.readouterr().err
    assert main(["certs", "nats-conf", str(d), "--reload"]) == 2  # reload what?
    assert "--reload needs -o FILE" in capsys.readouterr().err
    assert main(["certs", "nats-conf", str(d), "--listen", "4222"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    conf = tmp_path / "nats.conf"
    pid = tmp_path / "nats.pid"
    argv = ["certs", "nats-conf", str(d), "-o", str(conf), "--pid-file", str(pid), "--reload"]
    assert main(argv) == 2
    assert "no pid file" in capsys.readouterr().err
    pid.write_text(str(os.getpid()))  # a live process, but not a nats-server: never signalled
    assert main(argv) == 2
    assert "not a nats-server: not signalled" in capsys.readouterr().err


# ----------------------------------------------------------------- bundle


def test_bundle_packs_one_nodes_identity(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d)
    pki.issue(d, Identity.agent("gpu-07"))
    out = tmp_path / "gpu-07.tar.gz"
    assert main(["certs", "bundle", str(d), "--agent", "gpu-07", "-o", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {
            "ca.crt",
            "agent-gpu-07.crt",
            "agent-gpu-07.key",
            "assignments.pub",
            "bundle.json",
        }
        assert members["agent-gpu-07.key"].mode == 0o600
        for name in ("ca.crt", "agent-gpu-07.crt", "agent-gpu-07.key", "assignments.pub"):
            assert tar.extractfile(name).read() == (d / name).read_bytes()
    assert "ca.key" not in members and "assignments.key" not in members  # never the secrets
    b = bundle.read(out)
    assert b.node_id == "gpu-07"
    written = bundle.unpack(b, tmp_path / "node")
    assert {p.name for p in written} == {
        "ca.crt",
        "agent-gpu-07.crt",
        "agent-gpu-07.key",
        "assignments.pub",
    }
    assert stat.S_IMODE((tmp_path / "node").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "node" / "agent-gpu-07.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "node" / "ca.crt").stat().st_mode) == 0o644

    capsys.readouterr()
    assert main(["certs", "bundle", str(d), "--agent", "gpu-07", "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["certs", "bundle", str(d), "--agent", "gpu-08", "-o", str(tmp_path / "x")]) == 2
    assert "mesh certs issue" in capsys.readouterr().err and not (tmp_path / "x").exists()


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/shadow"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(
    "extra",
    [
        ("../evil", b"x", tarfile.REGTYPE),
        ("sub/ca.crt", b"x", tarfile.REGTYPE),
        ("link", b"", tarfile.SYMTYPE),
        ("big", b"x" * (bundle.MAX_MEMBER + 1), tarfile.REGTYPE),
        ("other.crt", b"x", tarfile.REGTYPE),
    ],
)
def test_a_hostile_bundle_is_refused_whole(tmp_path, extra):
    manifest = json.dumps({"kind": "agent", "node_id": "n1"}).encode()
    good = [
        (n, b"pem", tarfile.REGTYPE)
        for n in ("ca.crt", "agent-n1.crt", "agent-n1.key", "assignments.pub")
    ] + [("bundle.json", manifest, tarfile.REGTYPE)]
    ok = tmp_path / "ok.tgz"
    _tar(ok, good)
    assert bundle.read(ok).node_id == "n1"
    bad = tmp_path / "bad.tgz"
    _tar(bad, [*good, extra])
    with pytest.raises(bundle.BundleError):
        bundle.read(bad)


def test_a_bundle_that_is_not_one(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a tar")
    with pytest.raises(bundle.BundleError, match="not a bundle"):
        bundle.read(junk)
    with pytest.raises(bundle.BundleError, match="no such file"):
        bundle.read(tmp_path / "absent")
    half = tmp_path / "half.tgz"
    _tar(half, [("ca.crt", b"pem", tarfile.REGTYPE)])
    with pytest.raises(bundle.BundleError, match="bundle.json"):
        bundle.read(half)
    lying = tmp_path / "lying.tgz"
    manifest = json.dumps({"kind": "agent", "node_id": "../x"}).encode()
    _tar(lying, [("bundle.json", manifest, tarfile.REGTYPE)])
    with pytest.raises(bundle.BundleError):
        bundle.read(lying)


def test_site_certificate_and_hub_leafnodes_conf(tmp_path, capsys):
    """`certs issue --site S --host H` names hosts (the leaf serves its agents with it);
    `nats-conf --leafnodes PORT --site-nodes S=...` makes the hub: domain hub, a leaf
    listener mapping certificates to users, the site's user with its nodes."""
    from cryptography import x509

    d = tmp_path / "certs"
    pki.init(d)
    assert main(["certs", "issue", str(d), "--site", "s1", "--host", "edge.example"]) == 0
    cert = x509.load_pem_x509_certificate((d / "site-s1.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "edge.example" in san.get_values_for_type(x509.DNSName)
    assert Identity.site("s1") in pki.identities(d)
    capsys.readouterr()
    argv = ["certs", "nats-conf", str(d), "--region", "eu", "--leafnodes", "7422"]
    assert main([*argv, "--site-nodes", "s1=e1,e2"]) == 0
    out = capsys.readouterr()
    leaf = out.out.split("leafnodes {")[1].split("\n}")[0]
    assert 'listen: "0.0.0.0:7422"' in leaf and "verify_and_map: true" in leaf
    assert 'domain: "hub"' in out.out
    site = next(line for line in out.out.splitlines() if '"CN=site:s1"' in line)
    assert '"mesh.eu.state.e2"' in site and '["LEAFNODE"]' in site
    assert "leafnodes on 0.0.0.0:7422" in out.err
    assert main([*argv, "--site-nodes", "s1"]) == 2
    assert "expected SITE=NODE" in capsys.readouterr().err
    assert main(["certs", "issue", str(d), "--agent", "n1", "--host", "x"]) == 2
    assert "--host is for --gateway and --site" in capsys.readouterr().err
