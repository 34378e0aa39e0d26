"""TLS for mqttbed's Python clients of a broker: a context from the run's PEM texts.

A run carries its TLS as text, never as paths (:class:`~mqttbed.core.broker_access.EndpointTls`
and :class:`~mqttbed.core.broker_access.ClientCredentials`): the CA certificates trusted
(or none: the system's) and, optionally, a client certificate and its key. OpenSSL loads
a CA from memory (``cadata=``) but a certificate chain from files only, so the client's
certificate and key are written into a private temporary directory (0700, the files 0600)
and removed as soon as the context holds them.

Every client of mqttbed (the deploy probes, the ``$SYS`` sampler, the agents' paho
clients) takes its context from :func:`ssl_context`. The context is a
:class:`ServerNameContext`: it puts ``broker.tls.server_name`` in place of the host the
client connected to, so that name is both sent as SNI and verified by OpenSSL, whatever
``server_hostname`` the client library passes (paho passes the host it connected to).
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
from pathlib import Path

from mqttbed.core.broker_access import ClientCredentials, EndpointTls


class ServerNameContext(ssl.SSLContext):
    """An SSLContext that sends and verifies ``server_name`` (when set) instead of the
    ``server_hostname`` a caller wraps a socket with; no check is turned off for it."""

    server_name: str | None = None

    def wrap_socket(self, sock: socket.socket, server_side: bool = False,
                    do_handshake_on_connect: bool = True, suppress_ragged_eofs: bool = True,
                    server_hostname: str | bytes | None = None,
                    session: ssl.SSLSession | None = None) -> ssl.SSLSocket:
        return super().wrap_socket(
            sock, server_side=server_side, do_handshake_on_connect=do_handshake_on_connect,
            suppress_ragged_eofs=suppress_ragged_eofs,
            server_hostname=self.server_name or server_hostname, session=session)


def ssl_context(tls: EndpointTls, credentials: ClientCredentials | None,
                context_class: type[ServerNameContext] = ServerNameContext
                ) -> ServerNameContext:
    """A TLS client context (TLS 1.2 or later) verifying as ``tls`` says (its CA, its
    server name), presenting the client certificate of ``credentials`` if it has one.

    ``context_class`` is for a client that does more in ``wrap_socket`` (paho's times the
    handshake). Raises ValueError naming the field whose text OpenSSL refused (never a
    key's content).
    """
    context = context_class(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.server_name = tls.server_name
    if tls.ca_pem is not None:
        try:
            context.load_verify_locations(cadata=tls.ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(f"endpoint tls.ca_pem is not a PEM CA certificate: "
                             f"{describe_tls_error(exc)}") from None
    else:
        context.load_default_certs()
    if not tls.verify:   # broker.tls.verify: false, a lab broker (the run records it)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if credentials is not None and (credentials.cert_pem or credentials.key_pem):
        load_client_certificate(context, credentials)
    return context


def load_client_certificate(context: ssl.SSLContext, credentials: ClientCredentials) -> None:
    """Load the client certificate and key into ``context`` through files only this
    process can read, gone again before this returns."""
    if credentials.cert_pem is None or credentials.key_pem is None:
        given = "cert_pem" if credentials.cert_pem is not None else "key_pem"
        raise ValueError(f"credentials.{given} is given alone: a client certificate needs "
                         "both cert_pem and key_pem")
    # (mkdtemp makes the directory 0700: no other user can list or open what is in it)
    with tempfile.TemporaryDirectory(prefix="mqttbed-client-tls-") as directory:
        cert_file, key_file = Path(directory) / "client.crt", Path(directory) / "client.key"
        for path, text in ((cert_file, credentials.cert_pem),
                           (key_file, credentials.key_pem.get_secret_value())):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
        try:
            context.load_cert_chain(cert_file, key_file)
        except (ssl.SSLError, ValueError) as exc:
            raise ValueError(f"credentials.cert_pem and key_pem are not a PEM certificate "
                             f"and its private key: {describe_tls_error(exc)}") from None


def describe_tls_error(exc: BaseException) -> str:
    """OpenSSL's reason for a failed handshake, as a user can act on it:
    ``certificate verify failed: certificate has expired``; any other exception's text."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        message = exc.verify_message or exc.reason or str(exc)
        return f"certificate verify failed: {message}"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or exc.strerror or str(exc)
        if reason == "WRONG_VERSION_NUMBER":
            # what OpenSSL says when the bytes back are not TLS at all
            return "the answer is not TLS (wrong version number): is the port a TLS one?"
        if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
            # TLS 1.3's alert 116, sent by a listener that wants a client certificate
            return ("the server requires a client certificate (TLS alert "
                    "certificate_required): give broker.tls.cert_file and key_file")
        return f"{reason} ({exc.library})" if exc.library else str(reason)
    return str(exc) or type(exc).__name__
