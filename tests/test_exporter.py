"""agent.exporter: the ``/metrics`` server of the agent, the controller and the Celery worker,
in this process: what it answers, to whom, and that a port it cannot have stops nothing."""

from __future__ import annotations

import logging
import socket
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from agent import exporter
from akri_site import env
from akri_site.dashboard.prom import authorized


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("akri_test_things", "Things counted by the test", registry=registry).inc(3)
    return registry


@pytest.fixture
def serve(registry):
    started: list[exporter.MetricsServer] = []

    def start(**options) -> exporter.MetricsServer:
        server = exporter.MetricsServer(registry, port=0, address="127.0.0.1", **options)
        assert server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def get(port: int, path: str = "/metrics", token: str = "") -> tuple[int, dict, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_it_serves_its_registry_at_metrics_in_prometheus_text_format(serve):
    server = serve()

    status, headers, body = get(server.port)

    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "akri_test_things_total 3.0" in body


def test_it_answers_nothing_but_metrics(serve):
    server = serve()

    status, _, body = get(server.port, "/")

    assert status == 404 and "only /metrics" in body
    assert get(server.port, "/metrics/other")[0] == 404


def test_with_a_token_it_wants_the_bearer_token_like_the_webs_metrics(serve, rf, settings):
    server = serve(token="s3cret")

    assert get(server.port)[:1] == (401,)
    status, headers, _ = get(server.port, token="wrong")
    assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert get(server.port, token="s3cret")[0] == 200
    # The web's /metrics and this server judge a header alike.
    settings.METRICS_TOKEN = "s3cret"
    for header in ("Bearer s3cret", "bearer s3cret", "Bearer wrong", "Basic s3cret", ""):
        request = rf.get("/metrics", HTTP_AUTHORIZATION=header)
        assert authorized(request) == exporter.bearer_matches(header, "s3cret"), header


def test_a_port_in_use_is_one_error_line_and_no_thread(registry, caplog):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    threads = set(threading.enumerate())
    try:
        server = exporter.MetricsServer(registry, port=port, address="127.0.0.1", name="agent")
        with caplog.at_level(logging.INFO, logger="agent.exporter"):
            assert server.start() is False
    finally:
        taken.close()

    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert f"cannot listen on 127.0.0.1 port {port}" in record.getMessage()
    assert "METRICS_PORT" in record.getMessage()
    assert set(threading.enumerate()) == threads
    server.stop()  # nothing to stop: no error either


def test_stop_frees_the_port_and_joins_its_threads(registry):
    before = set(threading.enumerate())
    server = exporter.MetricsServer(registry, port=0, address="127.0.0.1", name="worker")
    assert server.start()
    port = server.port
    assert get(port)[0] == 200

    server.stop()

    assert set(threading.enumerate()) == before
    with pytest.raises(ConnectionRefusedError), socket.socket() as client:
        client.connect(("127.0.0.1", port))  # nobody listens there any more


def test_it_listens_on_ipv6_when_given_an_ipv6_address(registry):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    server = exporter.MetricsServer(registry, port=0, address="::1")
    assert server.start()
    try:
        with urllib.request.urlopen(f"http://[::1]:{server.port}/metrics", timeout=10) as r:
            assert r.status == 200
    finally:
        server.stop()


def test_metrics_port_0_serves_nothing(settings, caplog):
    settings.METRICS_PORT = 0
    with caplog.at_level(logging.INFO, logger="agent.exporter"):
        assert exporter.serve("controller") is None
    assert "METRICS_PORT=0" in caplog.text


def test_the_settings_port_and_address_are_used(settings):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.METRICS_PORT, settings.METRICS_ADDRESS, settings.METRICS_TOKEN = port, "127.0.0.1", ""
    server = exporter.serve("controller")
    assert server is not None
    try:
        assert server.port == port and get(port)[0] == 200
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("given", "parsed"),
    [("", "0.0.0.0"), ("127.0.0.1", "127.0.0.1"), (" :: ", "::"), ("::ffff:1.2.3.4", None)],
)
def test_the_metrics_address_is_an_ip_address(monkeypatch, given, parsed):
    monkeypatch.setenv("AKRI_METRICS_ADDRESS", given)
    expected = parsed or "::ffff:102:304"
    assert env.ip_address("AKRI_METRICS_ADDRESS", "0.0.0.0") == expected


@pytest.mark.parametrize("given", ["localhost", "0.0.0.0:8080", "300.1.1.1", "*"])
def test_a_metrics_address_that_is_not_an_ip_address_is_refused(monkeypatch, given):
    monkeypatch.setenv("AKRI_METRICS_ADDRESS", given)
    with pytest.raises(env.EnvError, match="AKRI_METRICS_ADDRESS"):
        env.ip_address("AKRI_METRICS_ADDRESS", "0.0.0.0")
