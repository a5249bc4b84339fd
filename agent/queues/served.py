"""The admission webhook as deploy/ serves it, started from Python: a CA and serving
certificate (openssl), ``manage.py runweb --webhook`` on this process's database, and the
ValidatingWebhookConfiguration of ``deploy/base/webhook.yaml`` rendered with that CA and a
``url:`` client config. The ``allocate`` benchmark registers it in the API-server simulator's
admission chain (``webhook_over_floor_p50``); the tests register it in the simulator and in a
real API server (tests/test_webhook_chain.py).
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "base" / "webhook.yaml"
SERVICE_DNS = "akri-site-webhook.akri-site.svc"


@dataclass(frozen=True)
class Tls:
    """A CA and a serving certificate it signed, for 127.0.0.1 and the webhook Service."""

    ca: Path
    cert: Path
    key: Path

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca.read_bytes()).decode()


def make_tls(directory: Path, names: tuple[str, ...] = ("127.0.0.1", SERVICE_DNS)) -> Tls:
    """A fresh CA and a certificate for ``names`` (IP addresses and DNS names), by openssl."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = directory / "tls.key", directory / "tls.csr", directory / "tls.crt"
    sans = ",".join(f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in names)
    ext = directory / "san.ext"
    ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", ca_key,
         "-out", ca, "-subj", "/CN=akri-site test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj",
         f"/CN={names[-1]}"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days",
         "1", "-out", cert, "-extfile", ext],
    ]  # fmt: skip
    for step in steps:
        subprocess.run(["openssl", *map(str, step)], check=True, capture_output=True, timeout=60)
    return Tls(ca, cert, key)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def manifest_configuration(ca_bundle: str, *, url: str | None = None) -> dict:
    """deploy/base/webhook.yaml as an operator applies it: caBundle set (deploy/set-webhook-ca),
    and, with ``url``, the Service replaced by that URL (path kept)."""
    with MANIFEST.open() as fh:
        body = yaml.safe_load(fh)
    for h in body["webhooks"]:
        config = h["clientConfig"]
        config["caBundle"] = ca_bundle
        if url is not None:
            path = config.pop("service")["path"]
            config["url"] = url.rstrip("/") + path
    return body


def database_env() -> dict[str, str]:
    """The environment that points another process at this test's database."""
    settings = connection.settings_dict
    if settings["ENGINE"].endswith("sqlite3"):
        return {"AKRI_SQLITE_PATH": str(settings["NAME"])}
    user = settings.get("USER") or "postgres"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or 5432
    return {"DATABASE_URL": f"postgres://{user}{password}@{host}:{port}/{settings['NAME']}"}


class ProjectWebhook:
    """``manage.py runweb --webhook`` with ``tls``, on this process's database, as deploy/ runs
    it (one worker here). ``env`` adds settings (AKRI_NAMESPACE, AKRI_QUEUE_LABEL_WRITERS...);
    this process's own ``AKRI_*`` settings are passed on only with ``inherit``."""

    def __init__(self, tls: Tls, env: dict[str, str], log: Path, *, inherit: bool = False) -> None:
        self.port = free_port()
        self.log = log
        base = {k: v for k, v in os.environ.items() if inherit or not k.startswith("AKRI_")}
        base.pop("DATABASE_URL", None)
        self.env = {**base, **database_env(), "LOG_LEVEL": "WARNING", **env}
        # On PostgreSQL (or with Redis) the settings are production's, which refuse to start
        # without a key of one's own; the webhook signs nothing a test reads.
        self.env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
        self.args = [
            sys.executable, "manage.py", "runweb", "--webhook", "--workers", "1",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key),
        ]  # fmt: skip
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> ProjectWebhook:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=out, stderr=out)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"runweb --webhook exited: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"runweb --webhook did not listen within {timeout} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            # uvicorn waits for kept-alive connections (the API server's) to close; a second
            # signal ends it at once, as a second Ctrl-C does.
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
