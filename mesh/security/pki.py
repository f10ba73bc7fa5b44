"""A small CA for a mesh: the CA, the NATS servers' certificate (and their peer
certificate for gateways and routes, `gateway.crt`), and one client certificate per
identity (`mesh certs init` / `mesh certs issue`). One CA serves every region of a
federation (docs/federation.md).

Keys are ECDSA P-256 (fast to make and to handshake with); private keys are written
0600 and never overwritten. The CA key stays in the directory: whoever holds it can
mint any identity, so keep the directory where only the operator can read it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mesh import signing
from mesh.security.identity import (
    CA_CERT,
    CA_KEY,
    SERVER_CERT,
    SERVER_KEY,
    SITE,
    Identity,
    IdentityError,
)

CA_DAYS = 3650
LEAF_DAYS = 825
DEFAULT_HOSTS = ("127.0.0.1", "localhost")
# The servers' certificate towards each other (gateways, routes): see `ensure_gateway`.
GATEWAY_STEM = "gateway"
GATEWAY_CERT, GATEWAY_KEY = f"{GATEWAY_STEM}.crt", f"{GATEWAY_STEM}.key"


class CertError(RuntimeError):
    """A certificate directory that is missing, incomplete, or would be overwritten."""


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)  # whatever the umask


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key, days: int
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def has_ca(certs_dir: str | Path) -> bool:
    d = Path(certs_dir)
    return (d / CA_CERT).exists() and (d / CA_KEY).exists()


def _load_ca(certs_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if not has_ca(certs_dir):
        raise CertError(
            f"{certs_dir} holds no CA ({CA_CERT} and {CA_KEY}): run `mesh certs init {certs_dir}`"
        )
    cert = x509.load_pem_x509_certificate((certs_dir / CA_CERT).read_bytes())
    key = serialization.load_pem_private_key((certs_dir / CA_KEY).read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def _issue_leaf(
    certs_dir: Path,
    stem: str,
    cn: str,
    *,
    server_hosts: list[str] | None = None,
    peer: bool = False,
) -> Path:
    crt, keyp = certs_dir / f"{stem}.crt", certs_dir / f"{stem}.key"
    if crt.exists() or keyp.exists():
        raise CertError(f"{crt} already exists: remove it first to reissue it")
    ca_cert, ca_key = _load_ca(certs_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    b = _builder(_name(cn), ca_cert.subject, key.public_key(), LEAF_DAYS)
    b = b.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    b = b.add_extension(
        x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
    )
    b = b.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
    )
    if server_hosts is not None:
        sans: list[x509.GeneralName] = []
        for h in dict.fromkeys(server_hosts):
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH]
        if peer:  # a gateway or route dials its peers as well as accepting them
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    else:
        b = b.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    cert = b.sign(ca_key, hashes.SHA256())
    _write_private(keyp, _key_pem(key))
    _write_public(crt, cert.public_bytes(serialization.Encoding.PEM))
    return crt


def init(
    certs_dir: str | Path, hosts: list[str] | tuple[str, ...] = (), *, admin: str = "admin"
) -> list[Path]:
    """A new CA, the server certificate (loopback plus `hosts`), the coordinator's and
    the `admin` user's client certificates, and the region's assignment-signing key
    pair. Refuses a directory that already holds a CA. Returns the files written."""
    d = Path(certs_dir)
    if has_ca(d):
        raise CertError(f"{d} already holds a CA: use `mesh certs issue` to add certificates")
    if d.exists() and not d.is_dir():
        raise CertError(f"{d} exists and is not a directory")
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    for h in hosts:
        if not h or any(c.isspace() for c in h):
            raise CertError(f"bad host name {h!r}")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name("mesh CA")
    cert = (
        _builder(subject, subject, key.public_key(), CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(d / CA_KEY, _key_pem(key))
    _write_public(d / CA_CERT, cert.public_bytes(serialization.Encoding.PEM))
    written = [d / CA_CERT, d / CA_KEY]
    written.append(_issue_leaf(d, "server", "mesh server", server_hosts=[*DEFAULT_HOSTS, *hosts]))
    written.append(issue(d, Identity.coordinator()))
    written.append(issue(d, Identity.user(admin)))
    written += make_signing_keys(d)
    return written


def issue(
    certs_dir: str | Path, identity: Identity, hosts: list[str] | tuple[str, ...] = ()
) -> Path:
    """One client certificate (and key) for `identity`, signed by the directory's CA.
    A site's is also its leaf's server certificate towards the site's agents, so it is
    good for both ends and names loopback and `hosts`; other identities name no host."""
    d = Path(certs_dir)
    if not isinstance(identity, Identity):
        raise IdentityError(f"not an identity: {identity!r}")
    for h in hosts:
        if not h or any(c.isspace() for c in h):
            raise CertError(f"bad host name {h!r}")
    if identity.kind == SITE:
        names = [*DEFAULT_HOSTS, *hosts]
        return _issue_leaf(d, identity.stem, identity.common_name, server_hosts=names, peer=True)
    if hosts:
        raise CertError("--host is for --gateway and --site (client certificates name no host)")
    return _issue_leaf(d, identity.stem, identity.common_name)


def ensure(certs_dir: str | Path, identity: Identity) -> Path:
    """`issue` unless the identity already has its certificate and key."""
    if identity.cert_path(certs_dir).exists() and identity.key_path(certs_dir).exists():
        return identity.cert_path(certs_dir)
    return issue(certs_dir, identity)


def identities(certs_dir: str | Path) -> list[Identity]:
    """Every identity with a client certificate in the directory (from the certificates'
    common names, not their file names)."""
    out = []
    for crt in sorted(Path(certs_dir).glob("*.crt")):
        if crt.name in (CA_CERT, SERVER_CERT, GATEWAY_CERT):
            continue
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        try:
            out.append(Identity.parse(str(cns[0].value)))
        except (IdentityError, IndexError):
            continue
    return out


def server_files(certs_dir: str | Path) -> tuple[Path, Path, Path]:
    """(ca, server cert, server key), checked to exist."""
    d = Path(certs_dir)
    files = (d / CA_CERT, d / SERVER_CERT, d / SERVER_KEY)
    for f in files:
        if not f.exists():
            raise CertError(f"{f} is missing: run `mesh certs init {d}`")
    return files


def server_hosts(certs_dir: str | Path) -> list[str]:
    """The names and addresses the server certificate is good for."""
    crt = server_files(certs_dir)[1]
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(v) for v in san.get_values_for_type(x509.IPAddress)] + list(
        san.get_values_for_type(x509.DNSName)
    )


def gateway_hosts(certs_dir: str | Path) -> list[str]:
    """The DNS names in the gateway certificate: a peer's URL must use one of them
    (nats-server's `verify_cert_and_check_known_urls` matches DNS names only)."""
    cert = x509.load_pem_x509_certificate(gateway_files(certs_dir)[1].read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(san.get_values_for_type(x509.DNSName))


def ensure_gateway(certs_dir: str | Path, hosts: list[str] | tuple[str, ...] = ()) -> Path:
    """The servers' peer certificate (`gateway.crt`), made once from the server
    certificate's names: gateways and routes present it both when they dial a peer and
    when they accept one, so it is good for client and server authentication, which
    `server.crt` (server only) is not. A directory made before gateways existed gets it
    on first use; its names are the server certificate's, so `mesh certs init --host`
    names every region's server host; or `hosts` (beside loopback), e.g. the hosts of
    the gateway URLs when they are not the client URLs' (`mesh certs issue --gateway
    --host`)."""
    d = Path(certs_dir)
    crt = d / GATEWAY_CERT
    if crt.exists() and (d / GATEWAY_KEY).exists():
        return crt
    for h in hosts:
        if not h or any(c.isspace() for c in h):
            raise CertError(f"bad host name {h!r}")
    names = [*DEFAULT_HOSTS, *hosts] if hosts else server_hosts(d)
    return _issue_leaf(d, GATEWAY_STEM, "mesh gateway", server_hosts=names, peer=True)


def gateway_files(certs_dir: str | Path) -> tuple[Path, Path, Path]:
    """(ca, gateway cert, gateway key), checked to exist."""
    d = Path(certs_dir)
    files = (d / CA_CERT, d / GATEWAY_CERT, d / GATEWAY_KEY)
    for f in files:
        if not f.exists():
            raise CertError(f"{f} is missing: run `mesh certs issue {d} --gateway`")
    return files


def make_signing_keys(certs_dir: Path) -> list[Path]:
    """The region's Ed25519 assignment-signing key pair (`mesh.signing`): the
    coordinators sign with the private key, the agents verify with the public one."""
    return [Path(p) for p in signing.generate_keypair(certs_dir)]


def signing_key_path(certs_dir: str | Path) -> Path:
    return Path(certs_dir) / signing.KEY_FILE


def verify_key_path(certs_dir: str | Path) -> Path:
    return Path(certs_dir) / signing.PUB_FILE
