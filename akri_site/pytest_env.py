"""Loaded by pytest before Django's settings (``-p akri_site.pytest_env`` in pyproject.toml; importable wherever the project is installed).

The suite runs on PostgreSQL and Redis too, which alone would mean production: its secret and
HTTPS rules. Tests that mean production (tests/test_hardening_settings.py) start it in
subprocesses with an environment of their own.
"""

import os

os.environ.setdefault("AKRI_ENV", "development")
# The agent, controller and worker started by tests serve /metrics only where a test asks
# (METRICS_PORT), not on 8080 each, which many runs on one machine would fight over.
os.environ.setdefault("METRICS_PORT", "0")
