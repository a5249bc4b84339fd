"""TLS for the extender's protocol port, as kube-scheduler can use it: the extender presents a
server certificate, and asks every client for a certificate signed by the client CA
(``CERT_REQUIRED``): kube-scheduler sends one from its configuration's ``tlsConfig``
(``certFile``/``keyFile``, and ``caFile`` to check ours; ``enableHTTPS: true``). A client
without one never completes the handshake, so no request of it is ever read.

The files are read again when they change (``Reloader``): cert-manager or an operator renews
them in the mounted Secret, and the process keeps serving with the new ones, no restart. A CA
added to the client CA file is trusted from then on; one removed from it stays trusted until
the process restarts (OpenSSL's store only grows).
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerTls:
    cert_file: str
    key_file: str
    client_ca_file: str
    # Common names a client certificate must carry (empty: any the client CA signed).
    client_names: tuple[str, ...] = field(default=())

    def context(self) -> ssl.SSLContext:
        """A server context that requires a client certificate signed by the client CA.
        OSError or ssl.SSLError when a file is missing or does not hold what it should."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        context.load_verify_locations(cafile=self.client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def files(self) -> tuple[str, str, str]:
        return (self.cert_file, self.key_file, self.client_ca_file)


def _stamp(paths: tuple[str, ...]) -> tuple:
    stamps = []
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            stamps.append(None)
            continue
        stamps.append((status.st_mtime_ns, status.st_size, status.st_ino))
    return tuple(stamps)


class Reloader:
    """Loads ``tls``'s files into ``context`` again when they have changed since last time."""

    def __init__(self, tls: ServerTls, context: ssl.SSLContext) -> None:
        self.tls = tls
        self.context = context
        self._stamp = _stamp(tls.files())

    def check(self) -> bool:
        """Reload if the files changed; True when they were. A file that cannot be read (a
        rotation half done) is logged and tried again next time; the old ones keep serving."""
        stamp = _stamp(self.tls.files())
        if stamp == self._stamp:
            return False
        try:
            self.context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
            self.context.load_verify_locations(cafile=self.tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            log.warning("extender: cannot reload its TLS files yet (%s); serving the old ones", exc)
            return False
        self._stamp = stamp
        log.info("extender: reloaded its TLS certificate and client CA")
        return True


def peer_name(transport: Any) -> str:
    """The subject common name of the client certificate on ``transport`` ("" without one)."""
    if transport is None:
        return ""
    cert = transport.get_extra_info("peercert") or {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return ""
