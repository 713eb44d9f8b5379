"""The rehearsal's site CA: one certificate authority that signs every TLS server of the
rehearsal (the registry, the gated hub, the loopback hubs of the weights tests), as a site's own
CA signs its registry and its hub mirror. Hosts trust it the way a site's hosts trust theirs: the
registry's `ca.crt` under /etc/containers/certs.d, the hub's through `specdeploy fetch --ca-file`.

Failure prevented: a rehearsal that fetched its gated weights over http:// (the token and the
file list in clear) because only the registry had a certificate; production fetches https://
only, so the rehearsal does too, with no exception for it.

Made once per cache (`ca.crt`, `ca.key` mode 0600) and reused: the certificates it issues are
re-issued when the CA or the names they are for change.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
from dataclasses import dataclass
from pathlib import Path

from specdeploy.core import atomic
from specdeploy.core.cache import cache_dir


@dataclass(frozen=True)
class Issued:
    ca: Path  # the site CA's certificate (PEM), beside the server's
    cert: Path
    key: Path  # mode 0600


def _name(common: str):  # type: ignore[no-untyped-def]
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _validity() -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    return now, now + dt.timedelta(days=3650)


def authority(directory: Path | None = None) -> tuple[Path, Path]:
    """The site CA's certificate and key, made on first use."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = directory or cache_dir() / "site-ca"
    crt, key_path = directory / "ca.crt", directory / "ca.key"
    if crt.is_file() and key_path.is_file() and _has_key_identifier(crt):
        return crt, key_path
    atomic.ensure_dir(directory)
    directory.chmod(0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("specdeploy rehearsal site CA"))
        .issuer_name(_name("specdeploy rehearsal site CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    atomic.write_bytes(
        key_path, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), mode=0o600
    )
    atomic.write_bytes(crt, cert.public_bytes(pem), mode=0o644)  # last: its presence means both are there
    return crt, key_path


def _has_key_identifier(crt: Path) -> bool:
    """A CA made before key identifiers were added (Python 3.13's strict verification needs them) is
    made anew."""
    from cryptography import x509

    try:
        x509.load_pem_x509_certificate(crt.read_bytes()).extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except (x509.ExtensionNotFound, ValueError):
        return False
    return True


def issue(
    directory: Path,
    *,
    ips: list[str],
    dns: list[str] | None = None,
    ca_dir: Path | None = None,
    client: bool = False,
    common_name: str | None = None,
) -> Issued:
    """A server certificate for `ips` and `dns` names signed by the site CA, in `directory`
    (`ca.crt`, `server.crt`, `server.key`); kept while the CA and the names are the same. `client`:
    a client certificate instead (TLS client authentication: the front's, to the engine hosts'
    listeners); `common_name`: its subject's CN (default the first name)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca_crt, ca_key_path = authority(ca_dir)
    issued = Issued(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    names = sorted(ips) + sorted(dns or [])
    subject = common_name or names[0]
    stamp = directory / "issued.json"
    wanted = json.dumps({"names": names, "ca": ca_crt.read_text(), "client": client, "cn": subject}, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == wanted and issued.cert.is_file() and issued.key.is_file():
        return issued
    atomic.ensure_dir(directory)
    ca = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity()
    alt: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    alt += [x509.DNSName(name) for name in dns or []]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(  # Python 3.13 verifies strictly (VERIFY_X509_STRICT): it needs the issuer's key id
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    pem = serialization.Encoding.PEM
    atomic.write_bytes(
        issued.key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), mode=0o600
    )
    atomic.write_bytes(issued.cert, cert.public_bytes(pem), mode=0o644)
    atomic.write_bytes(issued.ca, ca_crt.read_bytes(), mode=0o644)
    atomic.write_bytes(stamp, wanted.encode(), mode=0o644)
    return issued


def pem_bundle(issued: Issued, path: Path) -> Path:
    """The certificate and its key in one PEM file (0600), as HAProxy's `crt` reads it."""
    atomic.write_bytes(path, issued.cert.read_bytes() + issued.key.read_bytes(), mode=0o600)
    return path


def trust(ca: Path) -> ssl.SSLContext:
    """A client context that trusts `ca` (the site CA) alone."""
    return ssl.create_default_context(cafile=str(ca))
