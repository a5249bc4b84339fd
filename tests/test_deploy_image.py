"""The image (deploy/Containerfile via deploy/build-image) builds from Debian packages and its
processes start: ``manage.py check --deploy`` and ``runagent --help`` inside it.

Opt-in: it debootstraps Debian and installs every dependency (about ten minutes on a 2-core
machine). Run it as root with ``AKRI_TEST_IMAGE=1 python -m pytest tests/test_deploy_image.py``
(needs ``apt-get install debootstrap buildah``); ``AKRI_TEST_IMAGE=existing`` reuses an image
that deploy/build-image built before (tag ``AKRI_TEST_IMAGE_TAG``, default akri-site:0.1.0).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODE = os.environ.get("AKRI_TEST_IMAGE", "")
TAG = os.environ.get("AKRI_TEST_IMAGE_TAG", "akri-site:0.1.0")
STRONG_KEY = "k3Vq9xN2mR7tY4pL8sD1fG6hJ0wZcAqEuIoPaSdFgHjKlZxCvBnM5b"

pytestmark = pytest.mark.skipif(
    not MODE,
    reason="builds a container image (~10 min): set AKRI_TEST_IMAGE=1 (as root, with "
    "debootstrap and buildah installed) or AKRI_TEST_IMAGE=existing",
)


def buildah(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    command = ["buildah", "--storage-driver", "vfs"]
    if os.environ.get("BUILDAH_STORAGE_ROOT"):
        command += ["--root", os.environ["BUILDAH_STORAGE_ROOT"]]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def image():
    if MODE != "existing":
        done = subprocess.run(
            [str(ROOT / "deploy" / "build-image"), TAG],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    made = buildah("from", TAG)
    assert made.returncode == 0, made.stderr
    container = made.stdout.strip()
    yield container
    buildah("rm", container)


def run(container: str, *command: str, env: dict[str, str] | None = None):
    args = ["run", "--isolation", "chroot"]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    return buildah(*args, container, "--", *command, timeout=300)


def test_the_image_passes_djangos_deployment_checks(image):
    done = run(
        image,
        "python", "manage.py", "check", "--deploy", "--fail-level", "ERROR",
        env={"SECRET_KEY": STRONG_KEY, "DATABASE_URL": "postgres://akri@db.invalid/akri",
             "ALLOWED_HOSTS": "akri.example.com", "AKRI_ENV": "production"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified" in done.stdout + done.stderr


def test_the_agent_command_starts_in_the_image(image):
    done = run(image, "python", "manage.py", "runagent", "--help", env={"AKRI_AGENT_ONLY": "true"})
    assert done.returncode == 0, done.stderr
    assert "--node-name" in done.stdout


def test_the_image_runs_as_a_non_root_user(image):
    done = run(image, "id", "-u")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "10001"


def test_the_static_files_are_collected_in_the_image(image):
    done = run(image, "sh", "-c", "ls /app/var/static | head -5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "no collected static files"
