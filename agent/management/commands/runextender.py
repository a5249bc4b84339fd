"""``manage.py runextender``: the kube-scheduler HTTP extender, a process of its own so that
the scheduler's path never waits on the dashboard (see agent.extender)."""

from __future__ import annotations

import asyncio
import logging
import signal

from django.core.management.base import BaseCommand

from agent.extender.service import ExtenderService
from agent.kube.client import new_api_client

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Serve the kube-scheduler extender (filter, prioritize, bind)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
        parser.add_argument("--port", type=int, default=8888)
        parser.add_argument("--prefix", default="", help="URL prefix (urlPrefix's path)")
        parser.add_argument(
            "--without-api",
            action="store_true",
            help="no API server: filter and prioritize from the cache only, bind refuses "
            "(benchmarks, dry runs)",
        )

    def handle(self, *args, host: str, port: int, prefix: str, without_api: bool, **options):
        api_client = None if without_api else new_api_client()
        service = ExtenderService(api_client, host=host, port=port, prefix=prefix)
        # Books first (the feed's first read is synchronous, before the loop): the server
        # answers only once it knows the cluster.
        service.start_feeds()
        try:
            asyncio.run(self._serve(service))
        finally:
            service.stop_feeds()

    async def _serve(self, service: ExtenderService) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await service.serve()
            self.stdout.write(f"extender serving at {service.url}", ending="\n")
            self.stdout.flush()
            await stop.wait()
        finally:
            await service.shutdown()
