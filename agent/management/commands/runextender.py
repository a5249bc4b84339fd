"""``manage.py runextender``: the kube-scheduler HTTP extender, a process of its own so that
the scheduler's path never waits on the dashboard (see agent.extender).

It binds pods and writes on them, so it serves the scheduler alone: over HTTPS, to a client
certificate the client CA signed (``--tls-cert-file``, ``--tls-key-file``,
``--client-ca-file``; README, "Scheduler extender and sharing policies"). Without them it
listens on the loopback address only, unless told ``--insecure-http`` (a network where only
the scheduler can reach it, a benchmark).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import ssl

from django.core.management.base import BaseCommand, CommandError

from agent.extender.service import ExtenderService
from agent.extender.tls import ServerTls
from agent.kube.client import new_api_client

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Command(BaseCommand):
    help = "Serve the kube-scheduler extender (filter, prioritize, bind)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--host",
            default=None,
            help="address to listen on (default: 0.0.0.0 with TLS, 127.0.0.1 without)",
        )
        parser.add_argument("--port", type=int, default=8888)
        parser.add_argument("--prefix", default="", help="URL prefix (urlPrefix's path)")
        parser.add_argument("--tls-cert-file", default="", help="the extender's certificate")
        parser.add_argument("--tls-key-file", default="", help="its private key")
        parser.add_argument(
            "--client-ca-file",
            default="",
            help="CA whose client certificates may call (kube-scheduler's tlsConfig.certFile)",
        )
        parser.add_argument(
            "--client-name",
            action="append",
            default=[],
            help="a client certificate's common name that may call (repeatable; default: any "
            "the client CA signed)",
        )
        parser.add_argument(
            "--health-port",
            type=int,
            default=None,
            help="serve /healthz alone in plain HTTP on this port (the kubelet's probes)",
        )
        parser.add_argument(
            "--insecure-http",
            action="store_true",
            help="serve plain HTTP with no client authentication on a non-loopback --host",
        )
        parser.add_argument(
            "--without-api",
            action="store_true",
            help="no API server: filter and prioritize from the cache only, bind refuses "
            "(benchmarks, dry runs)",
        )

    def handle(
        self,
        *args,
        host: str | None,
        port: int,
        prefix: str,
        without_api: bool,
        insecure_http: bool,
        health_port: int | None,
        **options,
    ):
        tls = self._tls(options)
        host = host or ("0.0.0.0" if tls else "127.0.0.1")
        if tls is None and not is_loopback(host) and not insecure_http:
            raise CommandError(
                f"refusing to serve the extender in plain HTTP on {host}: anyone who reaches it "
                "could bind pods. Give --tls-cert-file, --tls-key-file and --client-ca-file "
                "(README), or --insecure-http on a network only the scheduler reaches."
            )
        api_client = None if without_api else new_api_client()
        try:
            service = ExtenderService(
                api_client, host=host, port=port, prefix=prefix, tls=tls, health_port=health_port
            )
        except (OSError, ssl.SSLError) as exc:
            raise CommandError(f"cannot read the extender's TLS files: {exc}") from None
        # Books first (the feed's first read is synchronous, before the loop): the server
        # answers only once it knows the cluster.
        service.start_feeds()
        try:
            asyncio.run(self._serve(service))
        finally:
            service.stop_feeds()

    @staticmethod
    def _tls(options: dict) -> ServerTls | None:
        files = (options["tls_cert_file"], options["tls_key_file"], options["client_ca_file"])
        if not any(files):
            if options["client_name"]:
                raise CommandError("--client-name needs TLS (--tls-cert-file, ...)")
            return None
        if not all(files):
            raise CommandError(
                "TLS needs all three of --tls-cert-file, --tls-key-file and --client-ca-file"
            )
        return ServerTls(*files, client_names=tuple(options["client_name"]))

    async def _serve(self, service: ExtenderService) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await service.serve()
            self.stdout.write(f"extender serving at {service.url}", ending="\n")
            if service.health_url:
                self.stdout.write(f"health at {service.health_url}/healthz", ending="\n")
            self.stdout.flush()
            await stop.wait()
        finally:
            await service.shutdown()
