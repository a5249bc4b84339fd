"""The websocket closes when its session or role goes, and bad frames close it 4400 (#12)."""

from __future__ import annotations

import logging
from http.cookies import SimpleCookie

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client

from akri_site.asgi import application
from akri_site.dashboard.sample import make_cluster

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster():
    return make_cluster(instances=3, capacity=2)


@pytest.fixture
def signed_in(cluster):
    """A viewer's browser: the Django test client holding the session, and the user."""
    user = User.objects.create_user("wanda", password="pw-for-tests-1")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client, user


# The slot map's socket and the Queues page's socket re-check their session the same way.
SOCKETS = ["/ws/live/", "/ws/queues/"]


@pytest.fixture(params=SOCKETS)
def path(request):
    return request.param


def open_socket(client: Client, path: str = "/ws/live/") -> WebsocketCommunicator:
    cookie = SimpleCookie()
    cookie[settings.SESSION_COOKIE_NAME] = client.cookies[settings.SESSION_COOKIE_NAME].value
    return WebsocketCommunicator(
        application,
        path,
        headers=[
            (b"origin", b"http://localhost"),
            (b"host", b"localhost"),
            (b"cookie", cookie.output(header="", sep=";").strip().encode()),
        ],
    )


async def connected(client: Client, path: str = "/ws/live/") -> WebsocketCommunicator:
    communicator = open_socket(client, path)
    assert (await communicator.connect(timeout=10))[0]
    assert (await communicator.receive_json_from(timeout=10))["type"] == "snapshot"
    return communicator


async def expect_close(communicator: WebsocketCommunicator, code: int, words: str) -> None:
    answer = await communicator.receive_json_from(timeout=10)
    assert answer == {"type": "error", "error": words, "close_code": code}
    closed = await communicator.receive_output(timeout=10)
    assert closed["type"] == "websocket.close" and closed["code"] == code


def test_a_refresh_after_logout_closes_the_socket_instead_of_answering(signed_in):
    client, _ = signed_in

    async def scenario():
        communicator = await connected(client)
        await database_sync_to_async(client.logout)()
        await communicator.send_json_to({"type": "refresh"})
        await expect_close(communicator, 4401, "signed out")
        assert await communicator.receive_nothing()

    async_to_sync(scenario)()


def test_a_ping_on_the_queues_socket_after_logout_closes_it_instead_of_answering(signed_in):
    client, _ = signed_in

    async def scenario():
        communicator = await connected(client, "/ws/queues/")
        await database_sync_to_async(client.logout)()
        await communicator.send_json_to({"type": "ping"})
        await expect_close(communicator, 4401, "signed out")
        assert await communicator.receive_nothing()

    async_to_sync(scenario)()


def test_a_queues_update_after_the_socket_was_closed_by_the_check_is_not_sent(signed_in, settings):
    from channels.layers import get_channel_layer

    from agent.queues.live import GROUP

    client, _ = signed_in
    settings.AKRI = {**settings.AKRI, "WS_RECHECK_SECONDS": 0.05}

    async def scenario():
        communicator = await connected(client, "/ws/queues/")
        await database_sync_to_async(client.logout)()
        await expect_close(communicator, 4401, "signed out")
        await get_channel_layer().group_send(GROUP, {"type": "queues.update", "queues": []})
        assert await communicator.receive_nothing(timeout=0.3)

    async_to_sync(scenario)()


def test_a_socket_whose_role_is_removed_is_closed_on_its_next_frame(signed_in, path):
    client, user = signed_in

    async def scenario():
        communicator = await connected(client, path)
        await database_sync_to_async(user.groups.clear)()
        await communicator.send_json_to({"type": "ping"})
        await expect_close(communicator, 4403, "your dashboard role was removed")

    async_to_sync(scenario)()


def test_a_deactivated_user_is_signed_out(signed_in, path):
    client, user = signed_in

    async def scenario():
        communicator = await connected(client, path)
        user.is_active = False
        await database_sync_to_async(user.save)()
        await communicator.send_json_to({"type": "ping"})
        await expect_close(communicator, 4401, "signed out")

    async_to_sync(scenario)()


def test_a_quiet_socket_is_closed_by_the_periodic_check(signed_in, path, settings):
    client, _ = signed_in
    settings.AKRI = {**settings.AKRI, "WS_RECHECK_SECONDS": 0.1}

    async def scenario():
        communicator = await connected(client, path)
        await database_sync_to_async(client.logout)()
        # No frame from the browser: the check on its own timer closes the socket.
        await expect_close(communicator, 4401, "signed out")

    async_to_sync(scenario)()


def test_a_socket_still_signed_in_keeps_answering(signed_in, path, settings):
    client, _ = signed_in
    settings.AKRI = {**settings.AKRI, "WS_RECHECK_SECONDS": 0.05}

    async def scenario():
        communicator = await connected(client, path)
        assert await communicator.receive_nothing(timeout=0.3)
        await communicator.send_json_to({"type": "ping"})
        assert (await communicator.receive_json_from(timeout=10))["type"] == "pong"
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_a_frame_nested_5000_deep_closes_4400_without_a_traceback(signed_in, caplog):
    client, _ = signed_in
    caplog.set_level(logging.INFO)

    async def scenario():
        communicator = await connected(client)
        await communicator.send_to(text_data="[" * 5000 + "]" * 5000)
        answer = await communicator.receive_json_from(timeout=10)
        assert answer["type"] == "error" and "nested too deep" in answer["error"]
        closed = await communicator.receive_output(timeout=10)
        assert closed["code"] == 4400

    async_to_sync(scenario)()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_a_database_error_in_the_periodic_check_keeps_the_socket(
    signed_in, path, settings, monkeypatch
):
    from django.db import OperationalError

    from akri_site.dashboard import consumers

    client, _ = signed_in
    settings.AKRI = {**settings.AKRI, "WS_RECHECK_SECONDS": 0.05}
    failures = []

    def database_down(session_key):
        failures.append(session_key)
        raise OperationalError("database is down")

    async def scenario():
        communicator = await connected(client, path)
        monkeypatch.setattr(consumers, "recheck", database_down)
        assert await communicator.receive_nothing(timeout=0.5)
        monkeypatch.undo()
        await communicator.send_json_to({"type": "ping"})
        assert (await communicator.receive_json_from(timeout=10))["type"] == "pong"
        await communicator.disconnect()

    async_to_sync(scenario)()
    assert len(failures) >= 2  # asked again after each failure


def test_a_frame_nested_5000_deep_closes_the_queues_socket_4400_without_a_traceback(
    signed_in, caplog
):
    client, _ = signed_in
    caplog.set_level(logging.INFO)

    async def scenario():
        communicator = await connected(client, "/ws/queues/")
        await communicator.send_to(text_data="[" * 5000 + "]" * 5000)
        answer = await communicator.receive_json_from(timeout=10)
        assert answer == {"type": "error", "message": "frames must be JSON objects"}
        closed = await communicator.receive_output(timeout=10)
        assert closed["code"] == 4400

    async_to_sync(scenario)()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
