"""The whole OpenAPI schema fuzzed by schemathesis, bounded (issue 29, item 10).

Every operation the schema serves is called with cases schemathesis generates from the schema
(valid and invalid parameters, its own odd strings and numbers), in process through Django's WSGI
application, signed in with a viewer's API token. Target: not one answer of 500 or more. The
cases are derandomized, so a run repeats the last one exactly. The bound keeps CI fast:
``AKRI_SCHEMATHESIS_EXAMPLES`` cases per operation (default 25), more when fuzzing on purpose.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import schemathesis
from django.contrib.auth.models import Group, User
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from akri_site.dashboard.sample import make_cluster

EXAMPLES = int(os.environ.get("AKRI_SCHEMATHESIS_EXAMPLES", "25"))


@pytest.fixture
def token():
    from akri_site.dashboard import tokens

    make_cluster()
    user = User.objects.create_user("schemathesis-viewer")
    user.groups.add(Group.objects.get(name="viewer"))
    _, key = tokens.issue(user, "schemathesis", days=1)
    return key


def _schema(token: str):
    import yaml
    from django.core.wsgi import get_wsgi_application
    from django.test import Client

    served = Client().get("/api/schema/", HTTP_AUTHORIZATION=f"Token {token}")
    assert served.status_code == 200
    schema = schemathesis.openapi.from_dict(yaml.safe_load(served.content))
    schema.app = get_wsgi_application()
    return schema


@contextlib.contextmanager
def connection_kept():
    """The WSGI handler closes the database connection after each request, which would close
    the test's own (the transaction the fixtures wrote in); Django's test client keeps it the
    same way (and connects the handler again after each of its requests)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.django_db
def test_no_operation_of_the_schema_answers_500(token):
    schema = _schema(token)
    headers = {"Authorization": f"Token {token}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    failures: list[str] = []
    calls = 0

    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,  # the same cases every run: a failure here is never a flake
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(case=operation.as_strategy() | operation.as_strategy(GenerationMode.NEGATIVE))
        def call(case):
            nonlocal calls
            calls += 1
            response = case.call(headers=headers)
            if response.status_code >= 500:
                failures.append(f"{case.as_curl_command()} -> {response.status_code}")

        with connection_kept():
            call()

    assert not failures, "\n".join(failures[:20])
    assert calls >= len(operations)
