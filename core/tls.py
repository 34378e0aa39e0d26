"""HTTPS between the controller and its clients (agents, the CLI): who trusts what.

The controller serves HTTPS with ``mqttbed serve --tls-cert F --tls-key K``. A client
verifies its certificate against the system's CAs, or, given a CA file
(``--ca-file`` / ``MQTTBED_CA_FILE``), against that file alone: a lab CA, or the
controller's self-signed certificate itself (a certificate in the file is a trust anchor
even when it is not a CA's: ``VERIFY_X509_PARTIAL_CHAIN``). Verification is never
switched off.
"""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

from mqttbed.core.errors import MqttbedError

CA_FILE_HINT = ("pass the controller's certificate or its CA with --ca-file "
                "(or MQTTBED_CA_FILE)")


def add_ca_file_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                       default: str | None) -> None:
    """The ``--ca-file`` option of every client command (agent, campaigns)."""
    parser.add_argument("--ca-file", default=default or None,
                        help="trust only this CA or certificate for an https controller "
                             "(default: MQTTBED_CA_FILE, else the system's CAs)")


class TlsSetupError(MqttbedError):
    """A certificate, key or CA file cannot be used; the message names the file."""


def client_verify(ca_file: str | None) -> ssl.SSLContext | bool:
    """What an httpx client verifies the controller with: True (the system's CAs) or a
    context trusting ``ca_file`` alone."""
    if not ca_file:
        return True
    path = Path(ca_file).expanduser()
    if not path.is_file():
        raise TlsSetupError(f"CA file {ca_file!r} does not exist (--ca-file / "
                            "MQTTBED_CA_FILE)")
    try:
        context = ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise TlsSetupError(f"CA file {ca_file!r} holds no usable PEM certificate: "
                            f"{exc}") from None
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def is_untrusted_certificate(exc: BaseException) -> bool:
    """Whether a connection failed because the server's certificate was not trusted."""
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def check_server_files(cert: str | None, key: str | None) -> None:
    """Refuse half a TLS setup, or files a server could not load, naming the file."""
    if bool(cert) != bool(key):
        raise TlsSetupError("--tls-cert and --tls-key go together (MQTTBED_TLS_CERT, "
                            "MQTTBED_TLS_KEY): give both for HTTPS, neither for HTTP")
    if cert and key:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise TlsSetupError(f"cannot serve HTTPS with certificate {cert!r} and key "
                                f"{key!r}: {exc}") from None
