"""Kubernetes API-server simulator: real HTTP on 127.0.0.1 for the official `kubernetes` client.

A development and test tool. It serves the subset of kube-apiserver behaviour the project relies on,
so code under test runs its real URL building, serialization, `ApiException` parsing and watch
streaming. Where a test can tell the difference it behaves like kube-apiserver v1.20 (checked
against one: `scripts/real-apiserver`, and tests/test_apiserver_parity.py runs on both):

- custom resources from every CRD in `deploy/crds/` (or `crd_dir`), plus CRDs created at run time
  through `POST /apis/apiextensions.k8s.io/v1/customresourcedefinitions` (served immediately);
- built-in types as plain storage: core/v1 Pods, Nodes, Services, ConfigMaps, Secrets, Namespaces,
  Events, ServiceAccounts; batch/v1 Jobs; apps/v1 Deployments, DaemonSets; coordination/v1
  Leases; resource.k8s.io/v1 ResourceClaims, ResourceClaimTemplates, ResourceSlices,
  DeviceClasses; policy/v1 PodDisruptionBudgets; `/status` where the real types have it;
  `pods/binding`; `pods/eviction` (budgets honoured as kube-apiserver does: `apiserver_pdb`);
- server-owned metadata (uid, opaque resourceVersion from one global counter, creationTimestamp,
  generation, generateName), 201/409/404/422/400/415 with Status bodies shaped like the real ones;
- custom resources pruned, defaulted and validated against their CRD version's structural schema
  (`apiserver_schema`), with the real 422 messages and causes; `null`s dropped where the real
  server drops them (non-nullable fields without a default; merge-patch nulls delete) and, in
  labels, annotations and ConfigMap/Secret data, stored as "" as Go decodes them;
- namespaces: objects can only be created in a namespace that exists (404 `namespaces "x" not
  found`); `default`, `kube-system`, `kube-public` and `kube-node-lease` exist from the start;
- graceful pod deletion: deleting a pod bound to a node (and not Failed/Succeeded) only stamps it
  Terminating (`deletionTimestamp`, `deletionGracePeriodSeconds` from the request, the pod's
  `terminationGracePeriodSeconds` or 30); it stays until deleted again with grace 0, which is
  what its kubelet does (`agent.simulator.kubelet_pods.PodFinisher` plays that part); a second
  delete may only shorten the grace; every pod deletion first sends the stamped pod as MODIFIED,
  then DELETED once it goes;
- list with label selectors (all syntaxes), field selectors (`metadata.name`, `metadata.namespace`,
  Pod `spec.nodeName`/`status.phase`, ...), `limit`/`continue`, namespace isolation;
- PUT with optimistic concurrency (409 on a stale rv, 422 for a CR PUT without rv), PATCH by
  content type (merge, JSON patch, strategic merge for built-ins), no-op writes that change
  nothing, status subresource rules, finalizers, delete preconditions, `?dryRun=All`;
- watch from an in-memory event log: ADDED replay when no rv is given, resume without gaps or
  duplicates, 410 Expired as an ERROR event for versions older than the log, `timeoutSeconds`,
  a server-side cap, optional BOOKMARKs, selector transitions sent as ADDED/DELETED;
- discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`);
- test hooks: `request_log`, `inject_fault`, `drop_watches`, `set_history_limit`, `set_watch_cap`,
  `reset`, `ensure_namespace`, `get_object`/`list_objects`.

Differences that remain:
- built-in types are not validated or defaulted beyond names, labels, kind/apiVersion and a few
  real rules (a real Pod gets `terminationGracePeriodSeconds: 30`, `restartPolicy`, `dnsPolicy`,
  ... filled in; here only what was sent is stored); the schema check of custom resources leaves
  out what deploy/crds does not use (see `apiserver_schema`), and lists several problems in
  schema order where the real server's order varies from call to call;
- validating admission webhooks registered by ValidatingWebhookConfigurations are called as the
  real server calls them (`apiserver_admission`, which says what differs), but there is no other
  admission, no authentication, authorization or RBAC: any request is allowed, made by
  `system:anonymous` unless it names a user in `Impersonate-User` (and `Impersonate-Group`);
- no controllers: Jobs create no Pods, pod phases never change on their own, no ownerReference
  garbage collection; Terminating pods wait for a kubelet like on a bare real server;
- no namespace lifecycle: deleting a Namespace removes it at once (a real server keeps it
  Terminating until the namespace controller has deleted its objects and finalized it) and
  leaves its objects; there is no `/finalize`;
- strategic merge patch is approximated (known merge keys such as containers by `name` and
  conditions by `type`, `finalizers` as a set; other lists are replaced);
- server-side apply (`application/apply-patch+yaml`) answers 415: no managedFields, no field
  ownership. Tests of Akri-style SSA slot ownership need a real cluster;
- JSON (and YAML) bodies only: no protobuf (so `kubectl create configmap`, which sends protobuf,
  gets 415), no aggregated discovery, no OpenAPI documents (`kubectl apply` needs
  `--validate=false`), no server-side Table printing, no `/log`, `/exec`, `/scale`;
- list `resourceVersion`/`resourceVersionMatch` are ignored (always the latest state); continue
  tokens never expire; pages after the first show the latest state with the first page's rv;
- resourceVersions are small integers in strings (clients must still treat them as opaque);
- `generation` is kept for every type (real Pods, ConfigMaps and Secrets have none);
- `managedFields` are never written, and real responses' key order is not kept;
- a watch from a resourceVersion newer than the server's is accepted instead of waiting;
- deleting a CRD removes its objects at once (no cleanup finalizer, no DELETED events).

`stop()` keeps the store: `start()` again serves the same objects on the same port, which lets a
test restart "the API server" under running watchers.

Run standalone: `python -m agent.simulator.apiserver --port 8001 [--kubeconfig PATH]`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import re
import select
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

import yaml

from agent.simulator.apiserver_admission import ANONYMOUS, AdmissionChain, Admit, Request
from agent.simulator.apiserver_patch import (
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from agent.simulator.apiserver_pdb import check_eviction
from agent.simulator.apiserver_select import (
    SelectorError,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from agent.simulator.apiserver_store import (
    CRD_KEY,
    NAMESPACES_KEY,
    ApiError,
    Event,
    ResourceType,
    Store,
    Watcher,
    bad_request,
    conflict,
    node_trigger,
    not_found,
    now_rfc3339,
)

log = logging.getLogger(__name__)

DEFAULT_CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "crds"
SERVER_VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-akri-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_DEFAULT_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_PATCH_TYPES = {
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
}
# Parsed CRD files, keyed by (path, mtime): many simulators in one test run parse each file once.
_CRD_CACHE: dict[tuple[str, float], list[dict]] = {}


class RequestRecord(NamedTuple):
    """One entry of `ApiServerSimulator.request_log`."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None


@dataclass
class _Fault:
    method: str
    pattern: re.Pattern
    status: int
    times: int
    delay: float
    reason: str | None


def parse_bool(value: str | None) -> bool:
    """Go's strconv.ParseBool, as the API server parses `watch=` and friends."""
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f'strconv.ParseBool: parsing "{value}": invalid syntax')


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _present(obj: dict, rt: ResourceType, version: str) -> dict:
    """The object as served at `version` (CRD versions differ only in apiVersion here)."""
    api_version = rt.api_version(version)
    if obj.get("apiVersion") == api_version:
        return obj
    return dict(obj, apiVersion=api_version)


def load_crd_documents(crd_dir: Path) -> list[dict]:
    """Every CustomResourceDefinition document in `crd_dir/*.yaml` (cached per file version)."""
    docs: list[dict] = []
    for path in sorted(crd_dir.glob("*.yaml")):
        key = (str(path), path.stat().st_mtime)
        if key not in _CRD_CACHE:
            with path.open() as fh:
                loaded = [d for d in yaml.load_all(fh, Loader=_yaml_loader()) if d]
            _CRD_CACHE[key] = [d for d in loaded if d.get("kind") == "CustomResourceDefinition"]
        docs.extend(copy.deepcopy(_CRD_CACHE[key]))
    return docs


def _yaml_loader() -> type:
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], sim: ApiServerSimulator) -> None:
        self.sim = sim
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def close_connections(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self.server.sim._handle(self, "GET")

    def do_POST(self) -> None:
        self.server.sim._handle(self, "POST")

    def do_PUT(self) -> None:
        self.server.sim._handle(self, "PUT")

    def do_PATCH(self) -> None:
        self.server.sim._handle(self, "PATCH")

    def do_DELETE(self) -> None:
        self.server.sim._handle(self, "DELETE")

    # -- wire helpers ------------------------------------------------------------------------

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_bytes(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        phrase = HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else ""
        warned = "".join(
            f'Warning: 299 - "{w}"\r\n' for w in getattr(self, "warnings", ()) if "\r" not in w
        )
        head = (
            f"HTTP/1.1 {code} {phrase}\r\n{warned}"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Cache-Control: no-cache, private\r\n\r\n"
        ).encode()
        self.wfile.write(head + body)

    def start_stream(self) -> None:
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Cache-Control: no-cache, private\r\nTransfer-Encoding: chunked\r\n\r\n"
        )

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def drop(self) -> None:
        """Cut the connection the way a network failure would: no terminating chunk."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


class ApiServerSimulator:
    """A threaded HTTP/1.1 kube-apiserver simulator; see the module docstring."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        crd_dir: str | Path | None = None,
        history_limit: int = 10000,
        watch_cap_seconds: float = 300,
        bookmark_interval: float = 1.0,
    ) -> None:
        self.host = host
        self.port = port
        self.store = Store(history_limit)
        self.watch_cap_seconds = float(watch_cap_seconds)
        # How long a watch with allowWatchBookmarks=true stays idle before a BOOKMARK is sent.
        self.bookmark_interval = bookmark_interval
        self.request_log: list[RequestRecord] = []
        self.request_log_limit = 100_000
        self._faults: list[_Fault] = []
        self._faults_lock = threading.Lock()
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # Validating webhooks (tests set `admission.services` for clientConfig.service).
        self.admission = AdmissionChain(self.store)
        self._current = threading.local()  # the request being served by this thread
        crd_path = Path(crd_dir) if crd_dir is not None else DEFAULT_CRD_DIR
        if crd_path.is_dir():
            for crd in load_crd_documents(crd_path):
                self.apply_crd(crd)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ApiServerSimulator:
        """Bind and serve in a daemon thread; returns self."""
        self._stopping.clear()
        self._server = _HTTPServer((self.host, self.port), self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"apiserver-sim-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener, every open watch and every idle keep-alive connection."""
        server = self._server
        if server is None:
            return
        self._stopping.set()
        self.store.end_watches("drop")
        server.shutdown()
        server.server_close()
        server.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self.admission.close()

    def __enter__(self) -> ApiServerSimulator:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- client helpers ----------------------------------------------------------------------

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """Write a kubeconfig (no auth) that `kubernetes.config.load_kube_config` accepts."""
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "akri-sim", "cluster": {"server": self.url}}],
            "users": [{"name": "akri-sim", "user": {}}],
            "contexts": [
                {
                    "name": "akri-sim",
                    "context": {"cluster": "akri-sim", "user": "akri-sim", "namespace": namespace},
                }
            ],
            "current-context": "akri-sim",
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def api_client(self, pool_maxsize: int = 64) -> Any:
        """A `kubernetes.client.ApiClient` for this server, with a pool big enough for watches."""
        from kubernetes import client

        configuration = client.Configuration(host=self.url)
        configuration.connection_pool_maxsize = pool_maxsize
        return client.ApiClient(configuration)

    # -- test hooks --------------------------------------------------------------------------

    def inject_fault(
        self,
        method: str,
        path_regex: str,
        status: int = 500,
        times: int = 1,
        delay: float = 0.0,
        reason: str | None = None,
    ) -> None:
        """Answer the next `times` requests matching method ("*" = any) and path (re.search on
        the path, without the query) with `status` after `delay` s; status 0 only delays."""
        fault = _Fault(method.upper(), re.compile(path_regex), status, times, delay, reason)
        with self._faults_lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        with self._faults_lock:
            self._faults.clear()

    def drop_watches(self, clean: bool = False) -> int:
        """End every open watch stream now: cut like a dropped connection, or with `clean=True`
        a normal end of stream (as on a server timeout). Returns how many were ended."""
        return self.store.end_watches("clean" if clean else "drop")

    def set_history_limit(self, limit: int) -> None:
        """Keep only the last `limit` events: a resume from an older rv gets 410 Expired."""
        self.store.set_history_limit(limit)

    def set_watch_cap(self, seconds: float) -> None:
        """Longest any watch stream may last (also applies to streams already open)."""
        self.watch_cap_seconds = float(seconds)

    def reset(self) -> None:
        """Forget every object (CRDs stay) and the event log; open watches end cleanly."""
        self.store.end_watches("clean")
        self.store.reset()

    def ensure_namespace(self, name: str) -> None:
        """Create namespace `name` unless it exists (objects need their namespace)."""
        rt = self.store.types[NAMESPACES_KEY]
        with contextlib.suppress(ApiError):
            self.store.create(rt, "v1", "", {"metadata": {"name": name}})

    def get_object(
        self, group_version_plural: str, namespace: str | None, name: str
    ) -> dict | None:
        """A deep copy of a stored object, or None. `group_version_plural` is e.g.
        `akri.sh/v0/instances`, `v1/pods` or `pods`; namespace is ignored for cluster types."""
        rt = self.store.find(group_version_plural)
        try:
            obj = self.store.get(rt, (namespace or "") if rt.namespaced else "", name)
        except ApiError:
            return None
        return copy.deepcopy(obj)

    def list_objects(self, group_version_plural: str, namespace: str | None = None) -> list[dict]:
        """Deep copies of every stored object of a type (in one namespace if given)."""
        rt = self.store.find(group_version_plural)
        items, _, _, _ = self.store.list(rt, namespace if rt.namespaced else None, [], [])
        return copy.deepcopy(items)

    def apply_crd(self, crd: dict) -> dict:
        """Create or replace a CustomResourceDefinition directly (served at once)."""
        rt = self.store.types[CRD_KEY]
        name = (crd.get("metadata") or {}).get("name", "")
        try:
            current = self.store.get(rt, "", name)
        except ApiError:
            return self.store.create(rt, "v1", "", copy.deepcopy(crd))
        body = copy.deepcopy(crd)
        body.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.store.update(rt, "v1", "", name, body)

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        with self.store.lock:
            return str(self.store.rv)

    # -- request handling --------------------------------------------------------------------

    def _record(self, method: str, path: str, query: dict[str, str], ctype: str | None) -> None:
        self.request_log.append(RequestRecord(method, path, query, ctype))
        if len(self.request_log) > self.request_log_limit:
            del self.request_log[: self.request_log_limit // 2]

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._faults_lock:
            for fault in self._faults:
                if fault.method in ("*", method) and fault.pattern.search(path):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def _handle(self, handler: _Handler, method: str) -> None:
        url = urlsplit(handler.path)
        path = url.path
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        ctype = handler.headers.get("Content-Type")
        self._record(method, path, query, ctype)
        handler.warnings = []
        self._current.handler = handler
        try:
            raw = handler.read_body()
            fault = self._take_fault(method, path)
            if fault is not None:
                if fault.delay:
                    time.sleep(fault.delay)
                if fault.status:
                    reason = fault.reason or _DEFAULT_REASONS.get(fault.status, "InternalError")
                    raise ApiError(fault.status, reason, f"injected fault: {fault.status} {reason}")
            result = self._route(handler, method, path, query, raw, ctype)
            if result is not None:
                code, body = result
                if isinstance(body, bytes):
                    handler.send_bytes(code, body, "text/plain; charset=utf-8")
                else:
                    handler.send_bytes(code, _dumps(body))
        except ApiError as exc:
            handler.send_bytes(exc.code, _dumps(exc.status()))
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
        except Exception as exc:  # a simulator bug must still answer like a server
            log.exception("apiserver simulator failed on %s %s", method, handler.path)
            error = ApiError(500, "InternalError", f"simulator error: {exc!r}")
            with contextlib.suppress(OSError):
                handler.send_bytes(500, _dumps(error.status()))

    def _route(
        self,
        handler: _Handler,
        method: str,
        path: str,
        query: dict[str, str],
        raw: bytes,
        ctype: str | None,
    ) -> tuple[int, Any] | None:
        parts = [unquote(p) for p in path.split("/") if p]
        if path in ("/healthz", "/livez", "/readyz"):
            return 200, b"ok"
        if method == "GET" and path.rstrip("/") == "/version":
            return 200, SERVER_VERSION
        if not parts or parts[0] not in ("api", "apis"):
            raise _no_route()
        if parts[0] == "api":
            if len(parts) == 1:
                return self._get_only(method, self._api_versions())
            group, version, rest = "", parts[1], parts[2:]
        else:
            if len(parts) == 1:
                return self._get_only(method, self._api_group_list())
            if len(parts) == 2:
                return self._get_only(method, self._api_group(parts[1]))
            group, version, rest = parts[1], parts[2], parts[3:]
        if not rest:
            return self._get_only(method, self._resource_list(group, version))
        watch_prefix = rest[0] == "watch"
        if watch_prefix:
            rest = rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise _no_route()
        if group == "" and rest == ["bindings"] and namespace and method == "POST":
            # The older form of pods/binding: the pod is named in the Binding's metadata.
            body = _object_body(raw, ctype)
            meta = body.get("metadata") if isinstance(body, dict) else None
            pod_name = meta.get("name", "") if isinstance(meta, dict) else ""
            pods = self.store.types[("", "pods")]
            return 201, self._bind(pods, namespace, pod_name, body)
        rt = self.store.resolve(group, version, rest[0])
        if rt is None:
            raise _no_route()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if rt.namespaced and namespace is None and name is not None:
            raise _no_route()
        if not rt.namespaced and namespace is not None:
            raise _no_route()
        return self._serve(handler, method, rt, version, namespace, name, sub, query, raw, ctype,
                           watch_prefix)  # fmt: skip

    def _serve(
        self,
        handler: _Handler,
        method: str,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
        raw: bytes,
        ctype: str | None,
        watch_prefix: bool,
    ) -> tuple[int, Any] | None:
        store = self.store
        dry_run = bool(query.get("dryRun"))
        ns = namespace or ""
        if name is None:
            if method == "GET":
                if watch_prefix or parse_bool(query.get("watch")):
                    self._watch(handler, rt, version, namespace, None, query)
                    return None
                return 200, self._list(rt, version, namespace, query)
            if method == "POST" and (namespace is not None or not rt.namespaced):
                body = _object_body(raw, ctype)
                meta = body.get("metadata") if isinstance(body, dict) else None
                named = str(meta.get("name") or "") if isinstance(meta, dict) else ""
                admit = self._admit("CREATE", rt, version, ns, named, dry_run=dry_run)
                obj = store.create(rt, version, ns, body, dry_run, admit)
                return 201, _present(obj, rt, version)
            if method == "DELETE":
                return 200, self._delete_collection(rt, version, namespace, query, dry_run)
            raise _not_allowed()
        if sub is None:
            if method == "GET":
                if watch_prefix or parse_bool(query.get("watch")):
                    self._watch(handler, rt, version, namespace, name, query)
                    return None
                return 200, _present(store.get(rt, ns, name), rt, version)
            if method == "PUT":
                admit = self._admit("UPDATE", rt, version, ns, name, dry_run=dry_run)
                obj = store.update(rt, version, ns, name, _object_body(raw, ctype), None, dry_run,
                                   admit=admit)  # fmt: skip
                return 200, _present(obj, rt, version)
            if method == "PATCH":
                return 200, _present(self._patch(rt, version, ns, name, None, raw, ctype, dry_run),
                                     rt, version)  # fmt: skip
            if method == "DELETE":
                return self._delete(rt, version, ns, name, raw, ctype, query, dry_run)
            raise _not_allowed()
        if sub == "status" and rt.status:
            if method == "GET":
                return 200, _present(store.get(rt, ns, name), rt, version)
            if method == "PUT":
                admit = self._admit("UPDATE", rt, version, ns, name, "status", dry_run)
                obj = store.update(
                    rt, version, ns, name, _object_body(raw, ctype), "status", dry_run, admit=admit
                )
                return 200, _present(obj, rt, version)
            if method == "PATCH":
                obj = self._patch(rt, version, ns, name, "status", raw, ctype, dry_run)
                return 200, _present(obj, rt, version)
            raise _not_allowed()
        if sub in ("binding", "eviction") and rt.key == ("", "pods") and method == "POST":
            body = _object_body(raw, ctype)
            kind = ("", "v1", "Binding") if sub == "binding" else ("policy", "v1", "Eviction")
            admit = self._admit("CREATE", rt, version, ns, name, sub, dry_run, kind)
            if admit is not None and isinstance(body, dict):
                admit(body, None)
            if sub == "binding":
                return 201, self._bind(rt, ns, name, body)
            return 201, self._evict(rt, ns, name, body, dry_run)
        raise _no_route()

    @staticmethod
    def _get_only(method: str, body: dict) -> tuple[int, dict]:
        if method != "GET":
            raise _not_allowed()
        return 200, body

    # -- admission ---------------------------------------------------------------------------

    def _admit(
        self,
        operation: str,
        rt: ResourceType,
        version: str,
        namespace: str,
        name: str,
        sub: str = "",
        dry_run: bool = False,
        kind: tuple[str, str, str] | None = None,
    ) -> Admit | None:
        """The admission chain's check for this thread's request (None: no webhook could
        match, which is the rule: the chain costs nothing until a configuration exists)."""
        handler = getattr(self._current, "handler", None)
        headers = handler.headers if handler is not None else None
        username, groups = ANONYMOUS[0], ANONYMOUS[1]
        if headers is not None and headers.get("Impersonate-User"):
            username = headers["Impersonate-User"]
            groups = (*(headers.get_all("Impersonate-Group") or ()), "system:authenticated")
        options = {"kind": f"{operation.title()}Options", "apiVersion": "meta.k8s.io/v1"}
        if dry_run:
            options["dryRun"] = ["All"]
        request = Request(operation, rt, version, sub, namespace if rt.namespaced else "", name,
                          username, groups, dry_run, options, kind)  # fmt: skip
        return self.admission.admitter(request, handler.warnings if handler is not None else [])

    # -- verbs -------------------------------------------------------------------------------

    def _selectors(self, rt: ResourceType, query: dict[str, str]) -> tuple[list, list]:
        try:
            labels = parse_label_selector(query.get("labelSelector"))
            fields = parse_field_selector(query.get("fieldSelector"), rt.field_allowed)
        except SelectorError as exc:
            raise bad_request(str(exc)) from exc
        return labels, fields

    def _list(
        self, rt: ResourceType, version: str, namespace: str | None, query: dict[str, str]
    ) -> dict:
        labels, fields = self._selectors(rt, query)
        try:
            limit = int(query.get("limit") or 0)
        except ValueError as exc:
            raise bad_request(f"invalid limit: {query.get('limit')}") from exc
        items, rv, token, remaining = self.store.list(
            rt, namespace, labels, fields, max(limit, 0), query.get("continue") or None
        )
        if rt.builtin:
            # Real built-in lists omit kind/apiVersion on items.
            items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
        else:
            items = [_present(o, rt, version) for o in items]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token:
            meta["continue"] = token
            if remaining is not None:
                meta["remainingItemCount"] = remaining
        return {"kind": rt.list_kind, "apiVersion": rt.api_version(version), "metadata": meta,
                "items": items}  # fmt: skip

    def _patch(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        sub: str | None,
        raw: bytes,
        ctype: str | None,
        dry_run: bool,
    ) -> dict:
        media = (ctype or "").split(";")[0].strip().lower()
        if media not in _PATCH_TYPES or (
            media.startswith("application/strategic") and not rt.builtin
        ):
            accepted = sorted(_PATCH_TYPES if rt.builtin else _PATCH_TYPES - {
                "application/strategic-merge-patch+json"})  # fmt: skip
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(accepted)}",
            )
        patch = _json_body(raw, what="patch")
        if media == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise ApiError(422, "Invalid", "merge patch must be a JSON object")

            def patcher(stored: dict) -> Any:
                return merge_patch(stored, patch)
        elif media == "application/json-patch+json":
            if not isinstance(patch, list):
                raise bad_request(
                    "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
                )

            def patcher(stored: dict) -> Any:
                return json_patch(stored, patch)
        else:
            if not isinstance(patch, dict):
                raise bad_request("strategic merge patch must be a JSON object")

            def patcher(stored: dict) -> Any:
                return strategic_merge_patch(stored, patch)

        admit = self._admit("UPDATE", rt, version, ns, name, sub or "", dry_run)
        try:
            return self.store.update(
                rt, version, ns, name, None, sub, dry_run, False, patcher, admit
            )
        except PatchError as exc:
            reason = "Invalid" if exc.code == 422 else "BadRequest"
            raise ApiError(exc.code, reason, exc.message, rt.details(name)) from exc

    def _delete(
        self,
        rt: ResourceType,
        version: str,
        ns: str,
        name: str,
        raw: bytes,
        ctype: str | None,
        query: dict[str, str],
        dry_run: bool,
        admitted: bool = True,
    ) -> tuple[int, dict]:
        options = _object_body(raw, ctype) if raw.strip() else {}
        if not isinstance(options, dict):
            raise bad_request("DeleteOptions must be a JSON object")
        dry_run = dry_run or bool(options.get("dryRun"))
        grace = _grace_seconds(query.get("gracePeriodSeconds"), options.get("gracePeriodSeconds"))
        admit = self._admit("DELETE", rt, version, ns, name, dry_run=dry_run) if admitted else None
        obj, deleted = self.store.delete(
            rt, ns, name, options.get("preconditions"), dry_run, grace, admit
        )
        if deleted and not rt.delete_returns_object:
            return 200, _success(rt, obj)
        return 200, _present(obj, rt, version)

    def _delete_collection(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        query: dict[str, str],
        dry_run: bool,
    ) -> dict:
        """Answered as kube-apiserver's registry answers (checked on v1.37): the list it
        deleted from, as listed before the deletions (items with their resourceVersions then,
        the list's resourceVersion), not a Status."""
        labels, fields = self._selectors(rt, query)
        items, rv, _, _ = self.store.list(rt, namespace, labels, fields)
        grace = _grace_seconds(query.get("gracePeriodSeconds"), None)
        # Item by item in list order, as the real registry; the items no webhook needs to see
        # go to the store in runs, each under one hold of its lock (``Store.delete_many``).
        run: list[tuple[str, str]] = []
        for obj in items:
            meta = obj["metadata"]
            item_ns = meta.get("namespace", "")
            admit = self._admit(
                "DELETE", rt, rt.versions[0], item_ns, meta["name"], dry_run=dry_run
            )
            if admit is None:
                run.append((item_ns, meta["name"]))
                continue
            self.store.delete_many(rt, run, dry_run, grace)
            run = []
            with contextlib.suppress(ApiError):
                self.store.delete(rt, item_ns, meta["name"], None, dry_run, grace, admit)
        self.store.delete_many(rt, run, dry_run, grace)
        if rt.builtin:
            listed = [
                {k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items
            ]
        else:
            listed = [_present(o, rt, version) for o in items]
        return {"kind": rt.list_kind, "apiVersion": rt.api_version(version),
                "metadata": {"resourceVersion": str(rv)}, "items": listed}  # fmt: skip

    def _evict(self, rt: ResourceType, ns: str, name: str, body: Any, dry_run: bool) -> dict:
        """``pods/eviction`` (policy/v1 Eviction): the pod's deletion with the Eviction's
        deleteOptions, answered 201 Success, unless its PodDisruptionBudget forbids it now
        (429, ``apiserver_pdb``)."""
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise bad_request("the body must be a policy/v1 Eviction")
        pdb_rt = self.store.types.get(("policy", "poddisruptionbudgets"))
        if pdb_rt is not None:  # a dry run is checked too, as kube-apiserver does
            pod = self.store.get(rt, ns, name)
            budgets, _, _, _ = self.store.list(pdb_rt, ns, [], [])
            pods, _, _, _ = self.store.list(rt, ns, [], [])
            check_eviction(pod, budgets, pods)
        options = body.get("deleteOptions") or {}
        raw = json.dumps(options).encode() if options else b""
        # The eviction was admitted as a CREATE of pods/eviction; the deletion it makes is not
        # admitted again (the eviction registry deletes with rest.ValidateAllObjectFunc).
        self._delete(rt, "v1", ns, name, raw, "application/json", {}, dry_run, admitted=False)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}  # fmt: skip

    def _bind(self, rt: ResourceType, ns: str, name: str, body: Any) -> dict:
        target = (body.get("target") or {}).get("name") if isinstance(body, dict) else None
        if not target:
            raise ApiError(
                422, "Invalid", f'Binding "{name}" is invalid: target.name: Required value'
            )

        def patcher(stored: dict) -> Any:
            uid = ((body.get("metadata") or {}) if isinstance(body, dict) else {}).get("uid")
            if uid and uid != stored["metadata"].get("uid"):
                raise conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: {uid}, "
                    f"UID in object meta: {stored['metadata'].get('uid')}",
                )
            node = (stored.get("spec") or {}).get("nodeName")
            if node:
                raise conflict(rt, name, f'pod {name} is already assigned to node "{node}"')
            return stored

        # Binding is the one way to set spec.nodeName after create; bypass the pod update rule.
        # As the real registry does: the pod's PodScheduled condition becomes True (no reason),
        # whatever the scheduler wrote after failed attempts.
        with self.store.lock:
            stored = self.store.objects[rt.key].get((ns, name))
            if stored is None:
                raise not_found(rt, name)
            patcher(stored)
            new = dict(stored, spec=dict(stored.get("spec") or {}, nodeName=target))
            new["metadata"] = dict(stored["metadata"])
            status = dict(stored.get("status") or {})
            conditions = list(status.get("conditions") or [])
            at = next(
                (i for i, c in enumerate(conditions) if c.get("type") == "PodScheduled"), None
            )
            old = conditions[at] if at is not None else {}
            since = old.get("lastTransitionTime") if old.get("status") == "True" else None
            scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None}
            scheduled["lastTransitionTime"] = since or now_rfc3339()
            if at is None:
                conditions.append(scheduled)
            else:
                conditions[at] = scheduled
            new["status"] = {**status, "conditions": conditions}
            self.store._commit(rt, new, stored, "MODIFIED")
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "code": 201}  # fmt: skip

    # -- watch -------------------------------------------------------------------------------

    def _watch(
        self,
        handler: _Handler,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        name: str | None,
        query: dict[str, str],
    ) -> None:
        labels, fields = self._selectors(rt, query)
        if name is not None:
            fields = [*fields, ("metadata.name", "=", name)]
        rv_param = query.get("resourceVersion")
        since = None
        if rv_param not in (None, "", "0"):
            try:
                since = int(rv_param)
            except ValueError as exc:
                raise bad_request(f'invalid resource version "{rv_param}"') from exc
        timeout = None
        if query.get("timeoutSeconds"):
            try:
                timeout = float(query["timeoutSeconds"])
            except ValueError as exc:
                raise bad_request(f"invalid timeoutSeconds {query['timeoutSeconds']}") from exc
            # Like the real server, 0 means "no timeout given": the server's own limit applies.
            timeout = timeout if timeout > 0 else None
        bookmarks = parse_bool(query.get("allowWatchBookmarks"))
        if self._stopping.is_set():
            raise ApiError(503, "ServiceUnavailable", "the server is shutting down")

        def accepts(obj: dict) -> bool:
            return labels_match(labels, obj["metadata"].get("labels")) and fields_match(fields, obj)

        try:
            watcher, initial, _ = self.store.start_watch(
                rt,
                namespace,
                since,
                accepts if labels or fields else None,
                node_trigger(rt, fields),
            )
        except ApiError as exc:
            # The real server answers 200 and sends the 410 as an ERROR event.
            handler.start_stream()
            handler.send_chunk(_dumps({"type": "ERROR", "object": exc.status()}) + b"\n")
            handler.end_stream()
            return
        stream = _WatchStream(self, handler, rt, version, labels, fields, bookmarks, watcher)
        try:
            stream.run(initial, timeout)
        except (BrokenPipeError, ConnectionResetError, OSError):
            handler.close_connection = True
        finally:
            self.store.stop_watch(watcher)

    # -- discovery ---------------------------------------------------------------------------

    def _api_versions(self) -> dict:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
            ],
        }

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for rt in self.store.all_types():
            if rt.group:
                versions = groups.setdefault(rt.group, [])
                versions.extend(v for v in rt.versions if v not in versions)
        return groups

    @staticmethod
    def _group_entry(name: str, versions: list[str]) -> dict:
        listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": listed, "preferredVersion": listed[0]}

    def _api_group_list(self) -> dict:
        groups = [self._group_entry(g, v) for g, v in sorted(self._groups().items())]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _api_group(self, group: str) -> dict:
        versions = self._groups().get(group)
        if not versions:
            raise _no_route()
        return dict(self._group_entry(group, versions), kind="APIGroup", apiVersion="v1")

    def _resource_list(self, group: str, version: str) -> dict:
        types = [
            rt for rt in self.store.all_types() if rt.group == group and version in rt.versions
        ]
        if not types:
            raise _no_route()
        resources = []
        for rt in sorted(types, key=lambda t: t.plural):
            entry: dict[str, Any] = {"name": rt.plural, "singularName": rt.singular,
                                     "namespaced": rt.namespaced, "kind": rt.kind, "verbs": _VERBS}  # fmt: skip
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            if rt.status:
                resources.append({"name": f"{rt.plural}/status", "singularName": "",
                                  "namespaced": rt.namespaced, "kind": rt.kind,
                                  "verbs": ["get", "patch", "update"]})  # fmt: skip
            if rt.key == ("", "pods"):
                resources.append({"name": "pods/binding", "singularName": "", "namespaced": True,
                                  "kind": "Binding", "verbs": ["create"]})  # fmt: skip
                resources.append({"name": "pods/eviction", "singularName": "", "namespaced": True,
                                  "group": "policy", "version": "v1", "kind": "Eviction",
                                  "verbs": ["create"]})  # fmt: skip
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}  # fmt: skip


class _WatchStream:
    """Writes one watch response: initial ADDED events, then queued events until the end."""

    def __init__(
        self,
        sim: ApiServerSimulator,
        handler: _Handler,
        rt: ResourceType,
        version: str,
        labels: list,
        fields: list,
        bookmarks: bool,
        watcher: Watcher,
    ) -> None:
        self.sim = sim
        self.handler = handler
        self.rt = rt
        self.version = version
        self.labels = labels
        self.fields = fields
        self.filtered = bool(labels or fields)
        self.bookmarks = bookmarks
        self.watcher = watcher

    def matches(self, obj: dict) -> bool:
        return labels_match(self.labels, obj["metadata"].get("labels")) and fields_match(
            self.fields, obj
        )

    def render(self, event: Event) -> bytes | None:
        etype, obj = event.type, event.obj
        if self.filtered:
            now_ok = etype != "DELETED" and self.matches(obj)
            was_ok = event.old is not None and self.matches(event.old)
            if not now_ok and not was_ok:
                return None
            if now_ok:
                etype = "MODIFIED" if was_ok else "ADDED"
            elif etype != "DELETED":
                # The object stopped matching: to this watcher it is gone. Like the real server,
                # send the previous state under the event's resourceVersion.
                etype = "DELETED"
                obj = dict(event.old)
                obj["metadata"] = dict(obj["metadata"], resourceVersion=str(event.rv))
        if (
            etype == event.type
            and obj is event.obj
            and obj.get("apiVersion") == self.rt.api_version(self.version)
        ):
            return event.wire()
        return _dumps({"type": etype, "object": _present(obj, self.rt, self.version)}) + b"\n"

    def run(self, initial: Iterable[dict], timeout: float | None) -> None:
        handler, store, watcher = self.handler, self.sim.store, self.watcher
        started = time.monotonic()
        handler.start_stream()
        batch = [
            _dumps({"type": "ADDED", "object": _present(obj, self.rt, self.version)}) + b"\n"
            for obj in initial
            if not self.filtered or self.matches(obj)
        ]
        if batch:
            handler.send_chunk(b"".join(batch))
        last_sent = time.monotonic()
        while True:
            events, current_rv = store.take(watcher)
            lines = [line for line in map(self.render, events) if line is not None]
            if lines:
                handler.send_chunk(b"".join(lines))
                last_sent = time.monotonic()
            if watcher.ended == "drop" or self.sim._stopping.is_set():
                handler.drop()
                return
            if watcher.ended == "clean":
                break
            now = time.monotonic()
            limit = (
                self.sim.watch_cap_seconds
                if timeout is None
                else min(timeout, self.sim.watch_cap_seconds)
            )
            remaining = started + limit - now
            if remaining <= 0:
                break
            if self.bookmarks and not events and now - last_sent >= self.sim.bookmark_interval:
                bookmark = {"kind": self.rt.kind, "apiVersion": self.rt.api_version(self.version),
                            "metadata": {"resourceVersion": str(current_rv)}}  # fmt: skip
                handler.send_chunk(_dumps({"type": "BOOKMARK", "object": bookmark}) + b"\n")
                last_sent = now
            wait = min(remaining, 1.0)
            if self.bookmarks:
                wait = min(wait, max(self.sim.bookmark_interval - (now - last_sent), 0.01))
            if not watcher.wake.wait(wait) and handler.client_gone():
                handler.close_connection = True
                return
        handler.end_stream()


def _object_body(raw: bytes, ctype: str | None) -> Any:
    """A create/update/delete body: JSON (what the Python client sends) or YAML; no protobuf."""
    media = (ctype or "").split(";")[0].strip().lower()
    if media in ("", "application/json", "*/*"):
        return _json_body(raw)
    if media == "application/yaml":
        try:
            return yaml.load(raw, Loader=_yaml_loader())
        except yaml.YAMLError as exc:
            raise bad_request(
                f"the body of the request could not be decoded as YAML: {exc}"
            ) from exc
    raise ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({media}) - accepted media types "
        "include: application/json, application/yaml",
    )


def _json_body(raw: bytes, what: str = "body") -> Any:
    try:
        return json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"the {what} of the request could not be decoded as JSON: {exc}") from exc


def _grace_seconds(in_query: str | None, in_body: Any) -> int | None:
    """DeleteOptions.gracePeriodSeconds from the query or the body (the query wins)."""
    value = in_query if in_query not in (None, "") else in_body
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise bad_request(f"invalid gracePeriodSeconds {value!r}") from exc


def _success(rt: ResourceType, obj: dict) -> dict:
    details = rt.details(obj["metadata"]["name"])
    details["uid"] = obj["metadata"].get("uid")
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": details}  # fmt: skip


def _no_route() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def _not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def main(argv: list[str] | None = None) -> None:
    """Run the simulator standalone until Ctrl-C."""
    parser = argparse.ArgumentParser(description="Kubernetes API-server simulator")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--crd-dir", default=None, help="CRD directory (default: deploy/crds)")
    parser.add_argument("--kubeconfig", default=None, help="write a kubeconfig for it here")
    parser.add_argument("--namespace", default="default", help="namespace in the kubeconfig")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    sim = ApiServerSimulator(host=args.host, port=args.port, crd_dir=args.crd_dir).start()
    if args.kubeconfig:
        sim.write_kubeconfig(args.kubeconfig, namespace=args.namespace)
        print(f"kubeconfig written to {args.kubeconfig}", flush=True)
    print(f"API-server simulator serving on {sim.url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()


if __name__ == "__main__":
    main()
