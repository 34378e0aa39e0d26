"""Throwaway TLS material for a managed broker: a CA and a server certificate made per run.

Nothing secret is committed or kept: each deploy makes a fresh CA (its key never leaves
memory: it signs and is dropped), a server key and certificate for the broker's address,
and writes them into the run's private broker directory (mode 0600 for the key). The
agents trust the CA's certificate alone (``Endpoint.tls.ca_pem``). The same maker gives
the bad-input cases their certificates: one from another CA, an expired one, one for
another name.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# P-256 keys: every TLS stack here speaks it, and a key takes microseconds to make.
_CURVE = ec.SECP256R1()
_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA that lives as long as this object: its certificate (PEM) and its key."""

    cert_pem: str
    _key: ec.EllipticCurvePrivateKey
    _name: x509.Name

    @classmethod
    def create(cls, common_name: str = "mqttbed throwaway CA") -> CertificateAuthority:
        """A new self-signed CA."""
        key = ec.generate_private_key(_CURVE)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        cert = (x509.CertificateBuilder()
                .subject_name(name).issuer_name(name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + _VALIDITY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False),
                    critical=True)
                .sign(key, hashes.SHA256()))
        return cls(_pem(cert), key, name)

    def issue(self, names: list[str], *, client: bool = False,
              expired: bool = False) -> tuple[str, str]:
        """A certificate for ``names`` (DNS names or IP addresses) and its key, both PEM.

        ``client``: for TLS client authentication instead of a server; ``expired``: its
        validity ended a day ago (a bad-input case)."""
        if not names:
            raise ValueError("a certificate needs at least one name")
        key = ec.generate_private_key(_CURVE)
        now = _now()
        start, end = ((now - datetime.timedelta(days=3), now - datetime.timedelta(days=1))
                      if expired else (now - datetime.timedelta(minutes=5), now + _VALIDITY))
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(self._name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]),
                               critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(self._key, hashes.SHA256()))
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        return _pem(cert), key_pem


@dataclass(frozen=True)
class ServerTls:
    """A broker's TLS files in its directory, and the CA its clients trust."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    ca_pem: str


def write_server_tls(directory: Path, names: list[str],
                     ca: CertificateAuthority | None = None) -> ServerTls:
    """Make a CA (unless given) and a server certificate for ``names``; write the CA's
    certificate, the server's certificate and its key (0600) into ``directory``."""
    ca = ca or CertificateAuthority.create()
    cert_pem, key_pem = ca.issue(names)
    ca_file, cert_file, key_file = (directory / "ca.crt", directory / "server.crt",
                                    directory / "server.key")
    ca_file.write_text(ca.cert_pem)
    cert_file.write_text(cert_pem)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key_pem)
    return ServerTls(ca_file, cert_file, key_file, ca.cert_pem)


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
