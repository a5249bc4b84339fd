#!/usr/bin/env python
"""Django's command-line utility for akri-site."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "akri_site.settings")
    from django.core.management import execute_from_command_line

    from akri_site.env import EnvError

    try:
        execute_from_command_line(sys.argv)
    except EnvError as exc:
        # A setting the operator must fix: one line, not a traceback.
        sys.exit(f"akri-site: configuration error: {exc}")


if __name__ == "__main__":
    main()
