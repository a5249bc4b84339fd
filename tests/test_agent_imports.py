"""What the node agent's process loads (issue 32 §6): the agent-only settings defer packages
it does not use (akri_site.deferred), and nothing is missing for it; the in-cluster
configuration reads the service account from AKRI_SERVICE_ACCOUNT_DIR; and it runs as its
DaemonSet runs it, without docstrings and asserts (``OPTIMIZED``).

The import checks run in a fresh interpreter each: this one has loaded everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

from agent.kube.client import new_api_client

ROOT = Path(__file__).resolve().parent.parent
# Loaded by the sub-packages ``kubernetes/__init__`` imports, by the kubeconfig loader, and by
# ``django.views`` and ``django.forms``; and sqlparse, which Django's database operations
# import: the agent in its pod uses none of them.
NOT_LOADED = (
    "kubernetes.dynamic",
    "kubernetes.stream",
    "jsonschema",
    "requests",
    "oauthlib",
    "django.views.generic",
    "django.forms.fields",
    "django.template.base",
    "sqlparse.engine",
)
# As the agent's container runs it: -OO -X no_debug_ranges (deploy/base/agent.yaml), and no
# bytecode written (the image's environment), so nothing is left beside the sources.
OPTIMIZED = {"PYTHONOPTIMIZE": "2", "PYTHONNODEBUGRANGES": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def run_python(code: str, tmp_path: Path, **env: str) -> dict:
    """``code`` in a fresh interpreter with the agent-only settings; its last line, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "akri_site.settings",
            "AKRI_AGENT_ONLY": "true",
            "AKRI_SQLITE_PATH": str(tmp_path / "agent.sqlite3"),
            "DATABASE_URL": "",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("flags", [{}, OPTIMIZED], ids=["plain", "optimized"])
def test_the_agent_loads_no_client_sub_package_it_does_not_use(tmp_path, flags):
    found = run_python(
        # As manage.py runagent: the project's package, the command machinery, the settings
        # and apps, the model checks, the command.
        "import akri_site.env, django.core.management, django, json, sys; django.setup()\n"
        "from django.core import checks; checks.run_checks(tags=['models'])\n"
        "from django.core.management import load_command_class\n"
        "load_command_class('agent', 'runagent')\n"
        "from agent.kube.client import new_api_client\n"
        "new_api_client()\n"
        f"loaded = [m for m in {NOT_LOADED!r} if m in sys.modules]\n"
        "print(json.dumps({'loaded': loaded, 'optimize': sys.flags.optimize,\n"
        "    'docstring': new_api_client.__doc__ is not None}))",
        tmp_path,
        # In-cluster, as in its pod: a service account beside the test.
        **service_account(tmp_path),
        **flags,
    )
    optimized = bool(flags)
    assert found == {"loaded": [], "optimize": 2 if optimized else 0, "docstring": not optimized}


def test_a_deferred_package_still_has_everything_when_asked(tmp_path):
    found = run_python(
        "import django, json, sys; django.setup()\n"
        "import kubernetes\n"
        "deferred = 'kubernetes.dynamic' not in sys.modules\n"
        "client = kubernetes.dynamic.DynamicClient\n"  # a sub-package, imported on first use
        "from kubernetes.config import load_kube_config\n"  # a name its __init__ binds
        "from django import forms\n"
        "from django.db import connection\n"  # its operations split scripts with sqlparse
        "script = connection.ops.prepare_sql_script('select 1; select 2')\n"
        "print(json.dumps({'deferred': deferred, 'version': kubernetes.__version__,\n"
        "    'client': client.__name__, 'loader': load_kube_config.__module__,\n"
        "    'stream': kubernetes.stream.__name__, 'form': forms.Form.__name__,\n"
        "    'script': script}))",
        tmp_path,
    )
    assert found.pop("deferred") is True
    assert found.pop("version").split(".")[0].isdigit()
    assert found == {
        "client": "DynamicClient",
        "loader": "kubernetes.config.kube_config",
        "stream": "kubernetes.stream",
        "form": "Form",
        "script": ["select 1;", "select 2"],
    }


def test_an_unknown_name_of_a_deferred_package_is_an_attribute_error(tmp_path):
    answer = run_python(
        "import django, json; django.setup()\n"
        "import kubernetes\n"
        "try:\n"
        "    kubernetes.no_such_thing\n"
        "except AttributeError as exc:\n"
        "    print(json.dumps(str(exc)))",
        tmp_path,
    )
    assert "no_such_thing" in answer


def test_the_agents_watchers_work_without_docstrings(tmp_path):
    # The official client's Watch types each event from its list function's docstring, gone
    # under -OO; the agent's watchers (CacheSync's two, the reconciler's pods) read the raw
    # JSON and ask it for no type. The Configurations' and the pods' watchers each see an
    # event from the API-server simulator.
    found = run_python(
        "import akri_site.env, django, json, sys, time; django.setup()\n"
        "from django.core.management import call_command\n"
        "call_command('migrate', verbosity=0)\n"  # as the DaemonSet's init container
        "from agent.kube.client import AkriApi, CoreApi, new_api_client\n"
        "from agent.kube.watch import CacheSync, _Watch\n"
        "from agent.models import Configuration\n"
        "from agent.node.reconcile import NodeReconciler\n"
        "from agent.simulator.apiserver import ApiServerSimulator\n"
        "class NoDevices:\n"
        "    def list(self): return []\n"
        "def until(ready):\n"
        "    deadline = time.monotonic() + 10\n"
        "    while not ready() and time.monotonic() < deadline: time.sleep(0.02)\n"
        "    return ready()\n"
        "with ApiServerSimulator() as sim:\n"
        "    sim.ensure_namespace('akri')\n"
        f"    api = new_api_client(str(sim.write_kubeconfig({str(tmp_path / 'kubeconfig')!r})))\n"
        "    sync = CacheSync(api, 'akri', owner='agent:node-a')\n"
        "    reconciler = NodeReconciler(node='node-a', namespace='akri', sync=sync,\n"
        "        pod_resources=NoDevices(), api_client=api, workers=0)\n"
        "    sync.start(); sync.wait_synced(); reconciler.start()\n"
        "    try:\n"
        f"        AkriApi(api, 'akri').create_configuration({CONFIGURATION!r})\n"
        f"        CoreApi(api)._call('POST', '/api/v1/namespaces/akri/pods', body={POD!r})\n"
        "        seen = [until(lambda: Configuration.objects.filter(name='cams').exists()),\n"
        "            until(lambda: reconciler.pods.get('akri', 'p') is not None)]\n"
        "        watchers = [sync.configurations, sync.instances, reconciler._watcher]\n"
        "        print(json.dumps({'optimize': sys.flags.optimize, 'seen': seen,\n"
        "            'raw': [w.to_dict for w in watchers],\n"
        "            'types': [_Watch(raw=w.to_dict).get_return_type(w.list_func)\n"
        "                for w in watchers]}))\n"
        "    finally:\n"
        "        reconciler.stop(); sync.stop()",
        tmp_path,
        **OPTIMIZED,
    )
    assert found == {
        "optimize": 2,
        "seen": [True, True],
        "raw": [True, True, True],
        "types": [None, None, None],
    }


CONFIGURATION = {
    "apiVersion": "akri.sh/v0",
    "kind": "Configuration",
    "metadata": {"name": "cams"},
    "spec": {"discoveryHandler": {"name": "debugEcho", "discoveryDetails": ""}, "capacity": 2},
}
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox"}]},
}


def service_account(tmp_path: Path) -> dict[str, str]:
    account = tmp_path / "serviceaccount"
    account.mkdir(exist_ok=True)
    (account / "token").write_text("abc")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return {
        "KUBECONFIG": "",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "AKRI_SERVICE_ACCOUNT_DIR": str(account),
    }


def test_in_cluster_configuration_reads_the_service_account_directory(tmp_path, monkeypatch):
    env = service_account(tmp_path)
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.setenv(name, env[name])
    akri = {"KUBECONFIG": "", "SERVICE_ACCOUNT_DIR": env["AKRI_SERVICE_ACCOUNT_DIR"]}
    with override_settings(AKRI={**_akri(), **akri}):
        api = new_api_client()
    try:
        configuration = api.configuration
        assert configuration.host == "https://10.0.0.1:443"
        assert configuration.ssl_ca_cert == str(tmp_path / "serviceaccount" / "ca.crt")
        assert configuration.api_key["BearerToken"] == "bearer abc"
    finally:
        api.close()


def _akri() -> dict:
    from django.conf import settings

    return dict(settings.AKRI)
