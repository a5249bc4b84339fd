"""``manage.py runweb``: the web process of a deployment, on every core.

Several uvicorn worker processes share one listening socket (see ``akri_site.webserve``);
websockets stay on Channels, and the workers reach each other's sockets through Redis.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from akri_site import env
from akri_site.webserve import default_workers, serve, shared_layer


class Command(BaseCommand):
    help = "Serve pages, the JSON API, websockets and /metrics from several worker processes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=env.string("AKRI_WEB_HOST", "127.0.0.1"))
        parser.add_argument(
            "--port", type=int, default=env.integer("AKRI_WEB_PORT", 8000, minimum=1)
        )
        parser.add_argument(
            "--workers",
            type=int,
            default=env.integer("AKRI_WEB_WORKERS", 0, minimum=0),
            help="worker processes (default: one per core)",
        )
        parser.add_argument("--access-log", action="store_true", help="log every request")
        parser.add_argument("--ssl-certfile", default="", help="serve HTTPS with this certificate")
        parser.add_argument("--ssl-keyfile", default="", help="the certificate's private key")
        parser.add_argument(
            "--webhook",
            action="store_true",
            help="serve only the admission webhook (over TLS: needs --ssl-certfile)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workers = options["workers"] or default_workers()
        if workers > 1 and not shared_layer():
            raise CommandError(
                f"{workers} workers need a channel layer shared between processes, or "
                "websockets miss the live feed: set REDIS_URL, or use --workers 1"
            )
        if bool(options["ssl_certfile"]) != bool(options["ssl_keyfile"]):
            raise CommandError("--ssl-certfile and --ssl-keyfile go together")
        scheme = "https" if options["ssl_certfile"] else "http"
        if options["webhook"]:
            if scheme != "https":
                raise CommandError("--webhook serves the API server, over TLS: give --ssl-certfile")
            # Read by akri_site.asgi: here for one worker, from the environment for several
            # (uvicorn spawns them).
            os.environ["AKRI_WEB_ROLE"] = settings.AKRI_WEB_ROLE = "webhook"
        self.stdout.write(
            f"web: {scheme}://{options['host']}:{options['port']}/ with {workers} worker(s)"
        )
        serve(
            options["host"],
            options["port"],
            workers,
            access_log=options["access_log"],
            ssl_certfile=options["ssl_certfile"] or None,
            ssl_keyfile=options["ssl_keyfile"] or None,
        )
