#!/usr/bin/env python
"""Django's command-line utility for akri-site."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "akri_site.settings")
    if sys.argv[1:2] == ["runweb"]:
        # Before the settings load: the web bounds its database connections (settings.py); its
        # uvicorn workers inherit the variable. Set here, not in akri_site.asgi, so that no other
        # process that imports the ASGI app (a test run) passes it on to its children.
        os.environ.setdefault("AKRI_WEB_PROCESS", "true")
    # The project's package first: in the node agent's process it defers the parts of Django
    # that Django's command machinery would load otherwise (akri_site.deferred).
    from akri_site.env import EnvError  # isort: skip

    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except EnvError as exc:
        # A setting the operator must fix: one line, not a traceback.
        sys.exit(f"akri-site: configuration error: {exc}")


if __name__ == "__main__":
    main()
