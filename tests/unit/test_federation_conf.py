"""Federation configuration without a server: `mesh certs nats-conf --gateway`, the
servers' peer certificate, the coordinators' federation subjects, and `mesh up
--regions` refusing what cannot be a federation (before starting anything)."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from mesh import subjects
from mesh.cli.federation_up import RegionsError, parse_regions
from mesh.cli.main import main
from mesh.security import pki
from mesh.security.identity import Identity
from mesh.security.permissions import permissions
from mesh.server import ServerConfig


def _gateway_cert(d) -> x509.Certificate:
    return x509.load_pem_x509_certificate((d / pki.GATEWAY_CERT).read_bytes())


GATEWAYS = ["--gateway", "eu=nats://localhost:7222", "--gateway", "us=nats://nats-us.example:7222"]


def test_nats_conf_with_gateways_emits_tls_gateway_and_cluster(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d, ["nats-us.example"])
    capsys.readouterr()
    assert main(["certs", "nats-conf", str(d), "--region", "eu", *GATEWAYS]) == 0
    out = capsys.readouterr()
    conf = out.out
    assert 'server_name: "nats-eu"' in conf
    gateway = conf[conf.index("gateway {") :]
    assert 'name: "eu"' in gateway and 'listen: "0.0.0.0:7222"' in gateway
    assert '{name: "us", url: "nats://nats-us.example:7222"}' in gateway
    assert f'cert_file: "{(d / pki.GATEWAY_CERT).resolve()}"' in gateway
    assert "verify: true" in gateway and "verify_cert_and_check_known_urls: true" in gateway
    cluster = conf[conf.index("cluster {") : conf.index("gateway {")]
    assert 'name: "eu"' in cluster and 'listen: "127.0.0.1:6222"' in cluster
    assert 'routes: ["nats://localhost:6222"]' in cluster and "verify: true" in cluster
    assert '"mesh.fed.>"' in conf  # the coordinators' federation subjects
    assert "gateway eu on 0.0.0.0:7222 (TLS) to us" in out.err and "made gateway.crt" in out.err
    # the peer certificate: both ends of a TLS connection, the server certificate's names
    cert = _gateway_cert(d)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert set(pki.gateway_hosts(d)) == {"localhost", "nats-us.example"}
    # gateway.crt is no identity: no server has a user for it
    assert {i.kind for i in pki.identities(d)} == {"coordinator", "user"}
    # a second region's config from the same directory: the same certificate, not remade
    argv = ["certs", "nats-conf", str(d), "--region", "us", *GATEWAYS, "--server-name", "us-1"]
    argv += ["--gateway-listen", "10.0.0.2:7333", "--route", "nats://nats-us.example:6222"]
    argv += ["--cluster-listen", "0.0.0.0:6222"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert 'server_name: "us-1"' in out.out and 'listen: "10.0.0.2:7333"' in out.out
    assert 'routes: ["nats://nats-us.example:6222"]' in out.out
    assert "made gateway.crt" not in out.err


def test_without_gateways_nats_conf_is_as_before(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d)
    assert main(["certs", "nats-conf", str(d), "--region", "eu"]) == 0
    conf = capsys.readouterr().out
    assert "gateway {" not in conf and "cluster {" not in conf and "server_name" not in conf
    assert not (d / pki.GATEWAY_CERT).exists()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--gateway", "us=nats://10.0.0.2:7222"], "use a DNS name, not an address"),
        (["--gateway", "us=nats://elsewhere.example:7222"], "'elsewhere.example' is not a name"),
        (["--gateway", "nats://localhost:7222"], "expected REGION=nats://HOST:PORT"),
        (["--gateway", "us=localhost:7222"], "expected nats://HOST:PORT"),
        (["--gateway", "us=nats://localhost"], "expected nats://HOST:PORT"),
        (["--gateway", "u.s=nats://localhost:1"], "region 'u.s'"),
        (["--gateway", "fed=nats://localhost:1"], "reserved"),
        ([*GATEWAYS[:2], *GATEWAYS[:2]], "named twice"),
        ([*GATEWAYS[:2], "--gateway-listen", "7222"], "--gateway-listen '7222': expected"),
        ([*GATEWAYS[:2], "--route", "nats://127.0.0.1:6222"], "use a DNS name"),
        (["--route", "nats://localhost:6222"], "need --gateway"),
    ],
)
def test_gateway_mistakes_exit_2_and_write_nothing(tmp_path, capsys, flags, says):
    d = tmp_path / "certs"
    pki.init(d)
    out = tmp_path / "nats.conf"
    capsys.readouterr()
    assert main(["certs", "nats-conf", str(d), "--region", "eu", "-o", str(out), *flags]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_issue_gateway_names_its_hosts_and_refuses_to_overwrite(tmp_path, capsys):
    d = tmp_path / "certs"
    pki.init(d)
    assert main(["certs", "issue", str(d), "--gateway", "--host", "gw.example"]) == 0
    assert set(pki.gateway_hosts(d)) == {"localhost", "gw.example"}
    assert main(["certs", "issue", str(d), "--gateway"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["certs", "issue", str(d), "--agent", "n1", "--host", "x"]) == 2
    assert "--host is for --gateway" in capsys.readouterr().err


def test_only_coordinators_get_the_federation_subjects():
    fed = subjects.fed_all()
    assert fed == "mesh.fed.>"
    coord = permissions("eu", Identity.coordinator())
    assert fed in coord.publish and fed in coord.subscribe
    others = [
        Identity.agent("n1"),
        Identity.user("admin"),
        Identity.worker("n1"),
        Identity.router("main"),
    ]
    for ident in [*others, Identity.fleet("sim")]:
        p = permissions("eu", ident, fleet_nodes=["sim-0000"] if ident.kind == "fleet" else ())
        assert not any(s.startswith("mesh.fed") for s in (*p.publish, *p.subscribe)), ident


def test_region_fed_is_reserved():
    # its own subjects would be the federation's: a user could publish summaries
    with pytest.raises(subjects.SubjectError, match="reserved"):
        permissions("fed", Identity.user("admin"))


def test_parse_regions():
    assert parse_regions("a,b,c") == ["a", "b", "c"]
    assert parse_regions(" eu , us ") == ["eu", "us"]
    for bad, says in [
        ("", "expected names"),
        ("a,,b", "expected names"),
        ("a,a", "named twice"),
        ("a,fed", "reserved"),
        ("a,all", "reserved"),
        ("a.b", "region 'a.b'"),
    ]:
        with pytest.raises(RegionsError, match=says):
            parse_regions(bad)


def test_up_regions_mistakes_exit_2_before_starting_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MESH_HOME", str(tmp_path))
    assert main(["up", "--regions", "a,a", "--state-dir", str(tmp_path / "s")]) == 2
    assert "named twice" in capsys.readouterr().err
    assert main(["up", "--regions", "a,b", "--nats-cluster", "3"]) == 2
    assert "one server per region" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_gateway_advertises_only_when_told():
    base = dict(gateway_name="eu", gateway_port=7222, gateways={"us": "nats://h:7223"})
    assert "advertise" not in ServerConfig(**base).render()
    text = ServerConfig(**base, gateway_advertise="127.0.0.1:1").render()
    gateway = text[text.index("gateway {") :]
    assert 'advertise: "127.0.0.1:1"' in gateway.split("}")[0]
