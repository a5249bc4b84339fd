"""The simulator's admission chain: validating webhooks, called as kube-apiserver calls them.

kube-apiserver reads every ``admissionregistration.k8s.io/v1`` ValidatingWebhookConfiguration
and, for each write it is about to store, calls the webhooks whose rules match, over HTTPS, with
an AdmissionReview, and refuses the write when one of them says no. Without that the tests of
our own webhook (``agent.queues.webhook``) could only post reviews they built themselves, and
the manifest's selectors, TLS, failure policy and timeout were only ever read, never obeyed.

What is done as the real server does it (k8s.io/apiserver v0.37, ``pkg/admission/plugin/
webhook``: ``generic/webhook.go`` ShouldCallHook, ``predicates/``, ``validating/dispatcher.go``,
``errors/statuserror.go``):

* configurations read from the store at each request (the real server's informer lags a little;
  reading the store is never staler), ordered by name, hooks in their order; the
  configurations themselves are never sent to webhooks;
* a hook is called when its ``namespaceSelector`` matches the request's namespace labels (always
  for cluster-scoped objects; a Namespace's own labels for a Namespace; 404 when the namespace is
  gone), its ``objectSelector`` matches the new *or* the old object's labels, and one of its
  rules matches operation, group, version, resource/subresource (``*``, ``pods/*``,
  ``*/status``) and scope; with ``matchPolicy: Equivalent`` a rule naming another version the
  type is served at matches too, and the review then names that version (``requestKind`` and
  ``requestResource`` keep the request's own);
* v1 defaults: failurePolicy Fail, matchPolicy Equivalent, timeoutSeconds 10, empty selectors;
* the call: POST ``https://<url>`` or ``https://<service>.<namespace>.svc:<port><path>`` with
  ``?timeout=<n>s``, the certificate checked against ``caBundle`` (the system roots without
  one) and against the URL's host or the service's DNS name; the first AdmissionReview version
  of ``admissionReviewVersions`` that is v1 or v1beta1; a new uid per call;
* the answer checked (uid, apiVersion/kind, present, no patch); a denial becomes the webhook's
  status with code >= 400 and the message ``admission webhook "<name>" denied the request:
  <message>``; a call that fails (refused, timed out, TLS, a non-2xx answer, a bad answer) is
  ``failed calling webhook "<name>": failed to call webhook: ...``, a 500 InternalError under
  ``Fail`` and ignored under ``Ignore``; warnings become ``Warning`` headers;
* a dry run is refused before the call when the hook's sideEffects are not None/NoneOnDryRun;
* several matching hooks are called in parallel; the first refusal in hook order is returned.

What differs: services are resolved through ``services`` (``(namespace, name, port) -> (host,
port)``, set by the test), not through Service and Endpoints objects; the timeout bounds each
socket operation rather than the whole exchange; errors read like the real ones but the text of
a failed connection is Python's; no mutating webhooks, matchConditions or admission policies.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
import json
import queue
import socket
import ssl
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from agent.simulator.apiserver_select import SelectorError, labels_match, parse_label_selector
from agent.simulator.apiserver_store import NAMESPACES_KEY, ApiError, ResourceType, Store

GROUP = "admissionregistration.k8s.io"
CONFIGS_KEY = (GROUP, "validatingwebhookconfigurations")
REVIEW_VERSIONS = ("v1", "v1beta1")
DEFAULT_TIMEOUT = 10
# Every type in this group is left out, as the real server leaves out its own configuration.
EXEMPT_GROUP = GROUP
ANONYMOUS = ("system:anonymous", ("system:unauthenticated",))

Admit = Callable[[dict | None, dict | None], None]


@dataclass(frozen=True)
class Request:
    """What one API request is, for admission: kube-apiserver's ``admission.Attributes``."""

    operation: str  # CREATE, UPDATE, DELETE
    rt: ResourceType
    version: str
    subresource: str
    namespace: str
    name: str
    username: str = ANONYMOUS[0]
    groups: tuple[str, ...] = ANONYMOUS[1]
    dry_run: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    # The kind of the object sent, when it is not the resource's own (pods/binding: Binding).
    kind: tuple[str, str, str] | None = None


class CallFailed(Exception):
    """The webhook could not be asked (``webhookutil.ErrCallingWebhook``)."""


class AdmissionChain:
    def __init__(self, store: Store) -> None:
        self.store = store
        # (namespace, name, port) -> (host, port): where clientConfig.service reaches.
        self.services: dict[tuple[str, str, int], tuple[str, int]] = {}
        # The last calls made, for tests: (webhook, operation, resource, name, outcome), the
        # outcome "allowed", "denied", "failed" or "dry" (refused before the call).
        self.calls: deque[tuple[str, str, str, str, str]] = deque(maxlen=10_000)
        self._pools: dict[tuple, _Pool] = {}
        self._pools_lock = threading.Lock()
        store.validators[CONFIGS_KEY] = configuration_problems

    def close(self) -> None:
        with self._pools_lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    # -- the request side ----------------------------------------------------------------------

    def admitter(self, request: Request, warnings: list[str]) -> Admit | None:
        """``admit(obj, old)`` for the store to call once the object is final, outside its lock
        (it raises the ApiError the real server answers); None when nothing could match."""
        if request.rt.group == EXEMPT_GROUP or not self._configurations():
            return None

        def admit(obj: dict | None, old: dict | None) -> None:
            self.validate(request, obj, old, warnings)

        return admit

    def validate(
        self, request: Request, obj: dict | None, old: dict | None, warnings: list[str]
    ) -> None:
        calls = []
        for hook in self._hooks():
            matched = self._should_call(hook, request, obj, old)
            if matched is not None:
                calls.append((hook, matched))
        if not calls:
            return
        outcomes: list[ApiError | None] = [None] * len(calls)

        def dispatch(i: int) -> None:
            outcomes[i] = self._dispatch(*calls[i], request, obj, old, warnings)

        if len(calls) == 1:
            dispatch(0)
        else:  # in parallel, as the real dispatcher's goroutines; joined before answering
            threads = [threading.Thread(target=dispatch, args=(i,)) for i in range(len(calls))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        for error in outcomes:
            if error is not None:
                raise error

    def _configurations(self) -> list[dict]:
        if not self.store.objects.get(CONFIGS_KEY):
            # The usual answer, read without the store lock (a dict's size is read atomically):
            # every write asks, and under load they queued on that lock behind the writers.
            return []
        with self.store.lock:
            bucket = self.store.objects.get(CONFIGS_KEY)
            return list(bucket.values()) if bucket else []

    def _hooks(self) -> list[dict]:
        hooks = []
        for config in sorted(self._configurations(), key=lambda c: c["metadata"]["name"]):
            hooks.extend(h for h in config.get("webhooks") or [] if isinstance(h, dict))
        return hooks

    # -- matching (generic/webhook.go ShouldCallHook) --------------------------------------------

    def _should_call(
        self, hook: dict, request: Request, obj: dict | None, old: dict | None
    ) -> tuple[str, str] | None:
        """The (version, kind) the hook is called with, or None when it is not."""
        namespace_error: ApiError | None = None
        try:
            if not self._namespace_matches(hook, request, obj):
                return None
        except ApiError as exc:
            namespace_error = exc
        selector = _selector(hook.get("objectSelector"))
        if selector and not (_labelled(obj, selector) or _labelled(old, selector)):
            return None
        matched = None
        rt = request.rt
        for rule in hook.get("rules") or []:
            if _rule_matches(rule, request, request.version):
                matched = request.version
                break
        if matched is None and hook.get("matchPolicy", "Equivalent") == "Equivalent":
            matched = next(
                (
                    v
                    for rule in hook.get("rules") or []
                    for v in rt.versions
                    if v != request.version and _rule_matches(rule, request, v)
                ),
                None,
            )
        if matched is None:
            return None
        if namespace_error is not None:
            raise namespace_error
        return matched, (request.kind[2] if request.kind else rt.kind)

    def _namespace_matches(self, hook: dict, request: Request, obj: dict | None) -> bool:
        is_namespace = request.rt.key == NAMESPACES_KEY
        if not request.namespace and not is_namespace:
            return True  # cluster-scoped: never exempted
        selector = _selector(hook.get("namespaceSelector"))
        if not selector:
            return True
        if is_namespace and not request.subresource and request.operation in ("CREATE", "UPDATE"):
            labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        else:
            name = request.namespace or request.name
            namespaces = self.store.types[NAMESPACES_KEY]
            labels = (self.store.get(namespaces, "", name)["metadata"].get("labels")) or {}
        return labels_match(selector, labels)

    # -- the call (validating/dispatcher.go) -------------------------------------------------------

    def _dispatch(
        self,
        hook: dict,
        matched: tuple[str, str],
        request: Request,
        obj: dict | None,
        old: dict | None,
        warnings: list[str],
    ) -> ApiError | None:
        name = str(hook.get("name", ""))
        ignore = hook.get("failurePolicy", "Fail") == "Ignore"
        if request.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            self.calls.append((name, request.operation, request.rt.plural, request.name, "dry"))
            return ApiError(
                400, "BadRequest", f'admission webhook "{name}" does not support dry run'
            )
        try:
            answer = self._call(hook, matched, request, obj, old)
        except CallFailed as exc:
            self.calls.append((name, request.operation, request.rt.plural, request.name, "failed"))
            if ignore:
                return None
            message = f'failed calling webhook "{name}": {exc}'
            return ApiError(
                500,
                "InternalError",
                f"Internal error occurred: {message}",
                {"causes": [{"message": message}]},
            )
        warnings.extend(str(w) for w in answer.get("warnings") or [])
        allowed = answer.get("allowed") is True
        self.calls.append((name, request.operation, request.rt.plural, request.name,
                           "allowed" if allowed else "denied"))  # fmt: skip
        return None if allowed else _denied(name, answer.get("status"))

    def _call(
        self,
        hook: dict,
        matched: tuple[str, str],
        request: Request,
        obj: dict | None,
        old: dict | None,
    ) -> dict:
        versions = hook.get("admissionReviewVersions") or []
        review_version = next((v for v in versions if v in REVIEW_VERSIONS), None)
        if review_version is None:
            raise CallFailed(
                f"failed to call webhook: webhook does not accept known AdmissionReview "
                f"versions: {versions}"
            )
        timeout = int(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT)
        target = self._target(hook.get("clientConfig") or {}, timeout)
        uid = str(uuid.uuid4())
        review = _review(review_version, uid, matched, request, obj, old)
        pool = self._pool(target)
        try:
            status, body = pool.post(target.path, json.dumps(review).encode(), timeout)
        except TimeoutError as exc:
            raise CallFailed(
                f'failed to call webhook: Post "{target.url}": context deadline exceeded'
            ) from exc
        except ssl.SSLError as exc:
            reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            raise CallFailed(
                f'failed to call webhook: Post "{target.url}": tls: failed to verify '
                f"certificate: {reason}"
            ) from exc
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise CallFailed(
                f'failed to call webhook: Post "{target.url}": dial tcp {target.host}:'
                f"{target.port}: connect: {why.lower()}"
            ) from exc
        if not 200 <= status <= 206:
            raise CallFailed(f"failed to call webhook: {_unstructured(status)}")
        try:
            answer = json.loads(body)
            return _verified(answer, uid, review_version)
        except (ValueError, TypeError) as exc:
            raise CallFailed(f"received invalid webhook response: {exc}") from exc

    def _target(self, config: dict, timeout: int) -> _Target:
        ca = config.get("caBundle") or ""
        if config.get("url"):
            url = urlsplit(config["url"])
            host, port = url.hostname or "", url.port or 443
            path = url.path or "/"
            shown = f"https://{url.netloc}{path}?timeout={timeout}s"
            return _Target(host, port, host, ca, f"{path}?timeout={timeout}s", shown)
        service = config.get("service") or {}
        namespace, name = service.get("namespace", ""), service.get("name", "")
        port = int(service.get("port") or 443)
        path = service.get("path") or "/"
        dns = f"{name}.{namespace}.svc"
        shown = f"https://{dns}:{port}{path}?timeout={timeout}s"
        address = self.services.get((namespace, name, port))
        if address is None:
            raise CallFailed(f'failed to call webhook: Post "{shown}": service "{name}" not found')
        return _Target(address[0], address[1], dns, ca, f"{path}?timeout={timeout}s", shown)

    def _pool(self, target: _Target) -> _Pool:
        key = (target.host, target.port, target.server_name, target.ca)
        with self._pools_lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = _Pool(target)
            return pool


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    server_name: str  # what the certificate must name
    ca: str  # caBundle, base64 PEM
    path: str
    url: str  # as the real server's errors show it

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.ca:
            try:
                context = ssl.create_default_context(cadata=base64.b64decode(self.ca).decode())
            except (ValueError, ssl.SSLError) as exc:
                raise CallFailed(
                    f"could not get REST client: unable to load root certificates: {exc}"
                ) from exc
        return context


class _Pool:
    """Kept-alive HTTPS connections to one webhook, as the real server's REST client keeps
    them: a TLS handshake per review would be most of what the benchmark measures."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self._context: ssl.SSLContext | None = None
        self._idle: queue.SimpleQueue[http.client.HTTPSConnection] = queue.SimpleQueue()

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        for attempt in range(2):
            reused, connection = self._take(timeout)
            try:
                connection.request("POST", path, body, headers)
                answer = connection.getresponse()
                data = answer.read()
            except TimeoutError:
                connection.close()
                raise
            except (http.client.HTTPException, OSError):
                connection.close()
                if reused and attempt == 0:
                    # The server closed an idle connection (or a new server took its port):
                    # as Go's client, try once on a new one.
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            if answer.will_close:
                connection.close()
            else:
                self._idle.put(connection)
            return answer.status, data
        raise ConnectionResetError("connection reset")

    def _take(self, timeout: float) -> tuple[bool, http.client.HTTPSConnection]:
        with contextlib.suppress(queue.Empty):
            connection = self._idle.get_nowait()
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            return True, connection
        if self._context is None:
            self._context = self.target.context()
        connection = _Connection(
            self.target.host,
            self.target.port,
            timeout=timeout,
            context=self._context,
            server_name=self.target.server_name,
        )
        return False, connection

    def close(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self._idle.get_nowait().close()


class _Connection(http.client.HTTPSConnection):
    """An HTTPS connection to an address whose certificate names something else (a service's
    DNS name resolved to 127.0.0.1 by the test)."""

    def __init__(self, host: str, port: int, *, server_name: str, **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        self.server_name = server_name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.server_name)


# -- the review and the answer ------------------------------------------------------------------


def _review(
    review_version: str,
    uid: str,
    matched: tuple[str, str],
    request: Request,
    obj: dict | None,
    old: dict | None,
) -> dict:
    rt = request.rt
    version, kind = matched
    # pods/binding sends a Binding: its kind is its own at every version of pods.
    group, kind_version = (request.kind[0], request.kind[1]) if request.kind else (rt.group, "")
    body: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": group, "version": kind_version or version, "kind": kind},
        "resource": {"group": rt.group, "version": version, "resource": rt.plural},
        "requestKind": {"group": group, "version": kind_version or request.version, "kind": kind},
        "requestResource": {"group": rt.group, "version": request.version, "resource": rt.plural},
    }
    if request.subresource:
        body["subResource"] = body["requestSubResource"] = request.subresource
    if request.name:
        body["name"] = request.name
    if request.namespace:
        body["namespace"] = request.namespace
    user: dict[str, Any] = {"username": request.username}
    if request.groups:
        user["groups"] = list(request.groups)
    body.update(
        operation=request.operation,
        userInfo=user,
        object=_at_version(obj, rt, version),
        oldObject=_at_version(old, rt, version),
        dryRun=request.dry_run,
        options=request.options or None,
    )
    return {
        "kind": "AdmissionReview",
        "apiVersion": f"admission.k8s.io/{review_version}",
        "request": body,
    }


def _at_version(obj: dict | None, rt: ResourceType, version: str) -> dict | None:
    """The object as the hook's version shows it: a custom resource without a conversion
    webhook differs between versions only in apiVersion."""
    if (
        obj is None
        or obj.get("apiVersion") == rt.api_version(version)
        or obj.get("kind") != rt.kind
    ):
        return obj
    converted = copy.copy(obj)
    converted["apiVersion"] = rt.api_version(version)
    return converted


def _verified(answer: Any, uid: str, review_version: str) -> dict:
    """``request.VerifyAdmissionResponse`` for a validating hook."""
    if not isinstance(answer, dict):
        raise ValueError("the answer is not an AdmissionReview object")
    response = answer.get("response")
    if not isinstance(response, dict):
        raise ValueError("webhook response was absent")
    if review_version == "v1":
        if response.get("uid") != uid:
            raise ValueError(f'expected response.uid="{uid}", got "{response.get("uid", "")}"')
        got = f"{answer.get('apiVersion', '')}, Kind={answer.get('kind', '')}"
        if got != "admission.k8s.io/v1, Kind=AdmissionReview":
            raise ValueError(
                f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {got}"
            )
        if response.get("patch"):
            raise ValueError("validating webhook may not return response.patch")
        if response.get("patchType") is not None:
            raise ValueError("validating webhook may not return response.patchType")
    return response


def _denied(name: str, status: Any) -> ApiError:
    """``errors.ToStatusErr``: the webhook's own status, code >= 400, its message prefixed."""
    status = status if isinstance(status, dict) else {}
    code = status.get("code") if isinstance(status.get("code"), int) else 0
    code = max(code, 400)
    denied = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied}: {status['reason']}"
    else:
        message = f"{denied} without explanation"
    error = ApiError(code, str(status.get("reason") or ""), message, status.get("details"))
    return error


def _unstructured(code: int) -> str:
    """What client-go says of a non-2xx answer that is not a Status
    (``errors.NewGenericServerResponse``)."""
    known = {
        400: "the server rejected our request for an unknown reason",
        404: "the server could not find the requested resource",
        405: "the server does not allow this method on the requested resource",
        409: "the server reported a conflict",
        413: f"the server responded with the status code {code} but did not return more "
        "information",
        422: "the server rejected our request due to an error in our request",
        429: "the server has received too many requests and has asked us to try again later",
        503: "the server is currently unable to handle the request",
        504: "the server was unable to return a response in the time allotted, but may still "
        "be processing the request",
    }
    if code in known:
        return known[code]
    if code >= 500:
        return 'an error on the server ("unknown") has prevented the request from succeeding'
    return f"the server responded with the status code {code} but did not return more information"


# -- selectors and rules ------------------------------------------------------------------------


def _selector(value: Any) -> list:
    """A LabelSelector object as parsed requirements ([] matches everything)."""
    if not isinstance(value, dict):
        return []
    parts = [f"{k}={v}" for k, v in sorted((value.get("matchLabels") or {}).items())]
    for expression in value.get("matchExpressions") or []:
        key, operator = expression.get("key", ""), expression.get("operator", "")
        values = ",".join(expression.get("values") or [])
        if operator == "In":
            parts.append(f"{key} in ({values})")
        elif operator == "NotIn":
            parts.append(f"{key} notin ({values})")
        elif operator == "Exists":
            parts.append(key)
        elif operator == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise ApiError(
                500, "InternalError", f'"{operator}" is not a valid label selector operator'
            )
    try:
        return parse_label_selector(",".join(parts)) if parts else []
    except SelectorError as exc:
        raise ApiError(500, "InternalError", f"Internal error occurred: {exc}") from exc


def _labelled(obj: dict | None, selector: list) -> bool:
    if obj is None:
        return False
    return labels_match(selector, (obj.get("metadata") or {}).get("labels") or {})


def _rule_matches(rule: dict, request: Request, version: str) -> bool:
    """``rules.Matcher``: scope, operation, group, version and resource/subresource."""
    rt = request.rt
    scope = rule.get("scope") or "*"
    cluster = rt.key == NAMESPACES_KEY or not request.namespace
    if scope == "Namespaced" and cluster or scope == "Cluster" and not cluster:
        return False
    if scope not in ("*", "Namespaced", "Cluster"):
        return False
    operations = rule.get("operations") or []
    if "*" not in operations and request.operation not in operations:
        return False
    if not _any(rule.get("apiGroups"), rt.group) or not _any(rule.get("apiVersions"), version):
        return False
    for resource in rule.get("resources") or []:
        name, _, sub = resource.partition("/")
        if name in ("*", rt.plural) and sub in ("*", request.subresource):
            return True
    return False


def _any(items: Any, requested: str) -> bool:
    return any(item in ("*", requested) for item in items or [])


# -- the configurations themselves (admissionregistration/validation) -----------------------------


def configuration_problems(config: dict) -> list[tuple[str, str]]:
    """What kube-apiserver refuses in a v1 ValidatingWebhookConfiguration, of the fields the
    chain reads (a configuration it stores, the chain can call)."""
    problems: list[tuple[str, str]] = []
    for i, hook in enumerate(config.get("webhooks") or []):
        at = f"webhooks[{i}]"
        if not isinstance(hook, dict):
            problems.append((at, "Invalid value: must be an object"))
            continue
        problems.extend(_hook_problems(at, hook))
    return problems


def _supported(at: str, value: Any, allowed: tuple[str, ...], required: bool) -> list:
    shown = ", ".join(f'"{a}"' for a in allowed)
    if value is None:
        return (
            [(at, f"Required value: must specify one of {', '.join(allowed)}")] if required else []
        )
    if value not in allowed:
        return [(at, f'Unsupported value: "{value}": supported values: {shown}')]
    return []


def _hook_problems(at: str, hook: dict) -> list[tuple[str, str]]:
    problems = _supported(
        f"{at}.sideEffects", hook.get("sideEffects"), ("None", "NoneOnDryRun"), True
    )
    problems += _supported(
        f"{at}.failurePolicy", hook.get("failurePolicy"), ("Fail", "Ignore"), False
    )
    problems += _supported(
        f"{at}.matchPolicy", hook.get("matchPolicy"), ("Exact", "Equivalent"), False
    )
    versions = hook.get("admissionReviewVersions")
    if not versions:
        problems.append((f"{at}.admissionReviewVersions",
                         "Required value: must specify one of v1, v1beta1"))  # fmt: skip
    timeout = hook.get("timeoutSeconds")
    if timeout is not None and not (isinstance(timeout, int) and 1 <= timeout <= 30):
        problems.append((f"{at}.timeoutSeconds",
                         f"Invalid value: {timeout}: the timeout value must be between 1 and 30 "
                         "seconds"))  # fmt: skip
    config = hook.get("clientConfig") or {}
    if bool(config.get("url")) == bool(config.get("service")):
        problems.append((f"{at}.clientConfig",
                         "Required value: exactly one of url or service is required"))  # fmt: skip
    elif config.get("url") and urlsplit(str(config["url"])).scheme != "https":
        problems.append((f"{at}.clientConfig.url",
                         f"Invalid value: \"{config['url']}\": 'https' is the only allowed URL "
                         "scheme"))  # fmt: skip
    return problems
