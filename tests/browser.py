"""What the browser tests share: Debian's Chromium, and Daphne in a process started by spawn.

Channels' live-server test case forks its Daphne process from the test process. By then this
process has run agents, plugins and watchers, and fork() copies their gRPC and SQLite state
half-way: seen here, a child that crashed (SIGSEGV) collecting gRPC objects inherited from
earlier tests, and one whose every write waited on a SQLite write lock that no thread held any
more (SQLite keeps the locks its connections hold in process memory, which the child
inherits without the locks themselves). So the server process is spawned: a fresh
interpreter that builds the ASGI application from the settings, told through its environment
what the test changed (channel layer, kubeconfig), as a deployment would be.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.testing import ChannelsLiveServerTestCase
from daphne.testing import DaphneProcess
from django.conf import settings
from django.test import override_settings

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REDIS_URL = os.environ.get("AKRI_TEST_REDIS_URL", "")
_SPAWN = multiprocessing.get_context("spawn")


def on_redis_channel_layer(prefix: str) -> Any:
    """Class decorator: a browser test class on the test Redis's channel layer, under a prefix
    of its own (other test runs may share this Redis), skipped when no Redis was given."""
    layer = {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": f"{prefix}-{uuid.uuid4().hex[:8]}"},
    }

    def decorate(cls: type) -> type:
        cls = override_settings(CHANNEL_LAYERS={"default": layer})(cls)
        reason = "needs AKRI_TEST_REDIS_URL (scripts/test sets it)"
        return pytest.mark.skipif(not REDIS_URL, reason=reason)(cls)

    return decorate


class SpawnedDaphneProcess(DaphneProcess):
    """``DaphneProcess`` started by spawn. Its shared values are made for spawn too (the
    default context's semaphores cannot be handed to a spawned child)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.port = _SPAWN.Value("i", self.port.value)
        self.ready = _SPAWN.Event()
        self.errors = _SPAWN.Queue()

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - multiprocessing's name
        return _SPAWN.Process._Popen(process_obj)

    def start(self) -> None:
        with _environ(server_environ()):
            super().start()


def server_environ() -> dict[str, str]:
    """The settings a test changed that the server process must share, as the environment
    variables the settings module reads."""
    environ = {}
    layer = settings.CHANNEL_LAYERS.get("default", {})
    if layer.get("BACKEND") == "channels_redis.core.RedisChannelLayer":
        config = layer.get("CONFIG", {})
        environ["REDIS_URL"] = config["hosts"][0]
        environ["AKRI_CHANNEL_PREFIX"] = config.get("prefix", "asgi")
    if settings.AKRI["KUBECONFIG"]:
        environ["KUBECONFIG"] = settings.AKRI["KUBECONFIG"]
    return environ


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class BrowserLiveServerCase(ChannelsLiveServerTestCase):
    """Daphne (spawned) serving the real ASGI application, and one Chromium for the class."""

    ProtocolServerProcess = SpawnedDaphneProcess

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        from playwright.sync_api import sync_playwright

        ARTIFACTS.mkdir(exist_ok=True)
        cls.playwright = sync_playwright().start()
        cls.browser = cls.playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

    @classmethod
    def tearDownClass(cls):
        cls.browser.close()
        cls.playwright.stop()
        super().tearDownClass()

    def new_context(self, **options: Any) -> Any:
        """A fresh browser context (cookies, theme) with the tests' defaults."""
        options = {"timezone_id": "UTC", "viewport": {"width": 1400, "height": 900}, **options}
        context = self.browser.new_context(**options)
        context.set_default_timeout(10_000)
        return context

    def sign_in(self, context: Any, user: Any) -> Any:
        """Hand ``user``'s session cookie, made by Django, to ``context`` (no password
        hashing); returns a test client signed in as the same user."""
        from django.test import Client

        client = Client()
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME]
        context.add_cookies(
            [{"name": cookie.key, "value": cookie.value, "url": self.live_server_url}]
        )
        return client
