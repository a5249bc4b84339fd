"""Packages without what their ``__init__`` loads up front, for the node agent's process.

``import kubernetes`` runs the package's ``__init__``, which imports every sub-package: the
dynamic client (kubernetes_validate, jsonschema, referencing, attrs), stream (websocket),
utils, leaderelection, informer. ``kubernetes.config``'s ``__init__`` imports the kubeconfig
loader with requests, requests_oauthlib and oauthlib, which a pod reading its service account
never calls. Django's ``django.contrib.auth`` imports ``django.views`` for one decorator, whose
``__init__`` loads the generic views, and they and the model fields load ``django.forms`` and
with it the template engine: an agent renders no form and serves no view. Django's database
operations import sqlparse for splitting SQL scripts (migrations), which the agent's process
never does: about 0.5 MB more. All that was some 10 MB of every agent's memory, on every node
(issue 32 §6, ``bench agent-memory``).

``defer()`` puts these packages in ``sys.modules`` without running their ``__init__``. Nothing
is missing: a sub-package is imported when it is first asked for (``kubernetes.dynamic``), and
asking a deferred package for any other name (``kubernetes.__version__``, ``forms.Form``) runs
its real ``__init__`` then, once. The worst case is the whole package, as without ``defer()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType

PACKAGES = ("kubernetes", "kubernetes.config", "django.views", "django.forms", "sqlparse")

_lock = threading.RLock()


def defer(names: tuple[str, ...] = PACKAGES) -> None:
    """Register ``names`` (parents first) deferred; one already imported stays as it is."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__dict__["__getattr__"] = _Loader(module)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


class _Loader:
    """A deferred package's ``__getattr__`` (PEP 562): called only for names it lacks."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.state = "deferred"  # then "running" (its __init__), then "done"

    def __call__(self, name: str) -> object:
        module = self.module
        if not name.startswith("__") and importlib.util.find_spec(f"{module.__name__}.{name}"):
            return importlib.import_module(f"{module.__name__}.{name}")
        with _lock:
            # Once. Another thread waits here until it has run; in the thread running it, a
            # name its __init__ asks for before binding it finds it "running": AttributeError,
            # as from any module half imported.
            if self.state == "deferred":
                self.state = "running"
                try:
                    module.__spec__.loader.exec_module(module)
                finally:
                    self.state = "done"
        try:
            return module.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None
