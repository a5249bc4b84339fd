"""Settings for akri-site, read from the environment.

The embedded default needs nothing but Python packages: SQLite, an in-process channel layer
and tasks run in-process. Production sets ``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL``
(channels_redis layer and Celery broker).
"""

import contextlib
import logging.config
from datetime import timedelta
from pathlib import Path

import dj_database_url

from akri_site import env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.string("AKRI_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env.boolean("DEBUG", False)
# Production is any setup beyond the embedded default (a real database or Redis), unless
# AKRI_ENV says otherwise; production refuses the public development key and DEBUG.
PRODUCTION = (
    env.choice(
        "AKRI_ENV",
        "production" if env.string("DATABASE_URL") or env.string("REDIS_URL") else "development",
        ("production", "development"),
    )
    == "production"
)
DEVELOPMENT_SECRET_KEY = "akri-site-insecure-development-key-change-me"
SECRET_KEY = env.string("SECRET_KEY", "")
if PRODUCTION:
    env.require_secret("SECRET_KEY", SECRET_KEY, refused=(DEVELOPMENT_SECRET_KEY,))
    if DEBUG:
        raise env.EnvError("DEBUG=true is refused in production (AKRI_ENV=production)")
elif not SECRET_KEY:
    # Development and the embedded demo only: sessions do not survive a restart.
    SECRET_KEY = DEVELOPMENT_SECRET_KEY
ALLOWED_HOSTS = env.words("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.words("CSRF_TRUSTED_ORIGINS", [])

# The node agent (``runagent``, a DaemonSet on every node) serves no pages (its /metrics is
# prometheus_client's own server, agent.exporter): without daphne it does not load Twisted and
# friends, some 40 MB of every agent's memory; without the admin, sessions, REST framework,
# Channels and the dashboard, and with no URLs to check, some 3 MB more. Its database holds the
# cluster model only (its own migrations need these apps' none).
_WEB = not env.boolean("AKRI_AGENT_ONLY", False)
_WEB_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "csp",
    "rest_framework",
    "rest_framework.authtoken",  # per-user tokens for the JSON API (issue 17)
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "akri_site.dashboard",
]
INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "csp",
    "rest_framework",
    # Only for its table: dashboard migration 0002 hashes the clear tokens it held into
    # ApiTokens and empties it; its admin is unregistered (akri_site.dashboard.admin).
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files for /api/docs/, served as our static files
    # Sign-in throttling (AXES_* below). Before "agent": the admin role takes every permission
    # when the agent app has migrated, and axes' permissions must exist by then.
    "axes",
    "agent",
    "agent.brokers",
    "agent.scheduling",
    "agent.queues",
    "akri_site.dashboard",
]
if not _WEB:
    INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in _WEB_APPS]

# Small deployments and the demo serve /static themselves (whitenoise); behind an ingress that
# serves the collectstatic output, turn this off.
SERVE_STATIC = env.boolean("AKRI_SERVE_STATIC", True)

MIDDLEWARE = [
    # The full slot map of a large cluster is megabytes of HTML.
    "django.middleware.gzip.GZipMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files before anything that reads a session: a bad /static path is a plain 404.
    # Its file responses iterate synchronously: under ASGI they are handed to Django as an
    # asynchronous iterator (akri_site.dashboard.middleware), which Django otherwise warns about.
    *(
        [
            "akri_site.dashboard.middleware.AsyncFileStreamMiddleware",
            "whitenoise.middleware.WhiteNoiseMiddleware",
        ]
        if SERVE_STATIC
        else []
    ),
    "csp.middleware.CSPMiddleware",
    "akri_site.dashboard.middleware.RejectNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, so its process_exception sees a view's database error first: 503, one log line.
    "akri_site.dashboard.middleware.DatabaseUnavailableMiddleware",
    # django-axes wants to be last: it turns a locked-out sign-in into its lockout answer.
    *(["axes.middleware.AxesMiddleware"] if _WEB else []),
]

ROOT_URLCONF = "akri_site.urls" if _WEB else "akri_site.agent_urls"
# What a web process serves (issue 29 item 6): "pages" (the dashboard, its API, /metrics; never
# the admission webhook, whose requests would pass the ingress), "webhook" (only
# POST /webhooks/pods/validate: ``runweb --webhook``, over TLS, on its own port and Service), or
# "all" (development and the demo: one process serves both).
AKRI_WEB_ROLE = env.choice(
    "AKRI_WEB_ROLE", "pages" if PRODUCTION else "all", ("all", "pages", "webhook")
)
ASGI_APPLICATION = "akri_site.asgi.application"
WSGI_APPLICATION = "akri_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Many threads (watchers, plugins, reconciler) write: wait for the lock rather than failing,
# and let readers proceed beside a writer. Every SQLite database gets these, the default one
# and one named by DATABASE_URL alike (without them, "database is locked" at once).
SQLITE_OPTIONS = {
    "timeout": 30,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}
DATABASE_URL = env.string("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    # Named outright: the live-server process of the browser tests derives the name from
    # NAME otherwise, which by then is already the test database's.
    DATABASES["default"]["TEST"] = {"NAME": "test_" + DATABASES["default"]["NAME"]}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env.boolean(
        "AKRI_WEB_PROCESS", False
    ):
        # The web (`manage.py runweb` sets AKRI_WEB_PROCESS): under ASGI each request runs on a
        # thread of its own, and persistent connections stay with those threads, idle, until
        # PostgreSQL runs out of them. A pool per process instead, bounded, its connections
        # handed back at the end of each request; a request waits for one at most 10 s.
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"]["OPTIONS"] = {
            **DATABASES["default"].get("OPTIONS", {}),
            "pool": {
                "min_size": 1,
                "max_size": env.integer("AKRI_WEB_DB_CONNECTIONS", 4, minimum=1),
                "timeout": 10,
            },
            # Named, so that pg_stat_activity tells the web's connections apart.
            "application_name": "akri-site-web",
        }
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        _sqlite = Path(DATABASES["default"]["NAME"])
        DATABASES["default"]["OPTIONS"] = {
            **SQLITE_OPTIONS,
            **DATABASES["default"].get("OPTIONS", {}),
        }
        DATABASES["default"]["TEST"] = {"NAME": str(_sqlite.with_name("test_" + _sqlite.name))}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env.string("AKRI_SQLITE_PATH", str(VAR_DIR / "akri-site.sqlite3")),
            "OPTIONS": dict(SQLITE_OPTIONS),
            # A file, not memory: Daphne's live-server process must see the test database.
            "TEST": {"NAME": env.string("AKRI_SQLITE_TEST_PATH", str(VAR_DIR / "test.sqlite3"))},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.string("REDIS_URL", "")
# The channel layer alone on Redis (the demo's web workers: see akri_site/webserve.py).
_CHANNEL_REDIS_URL = REDIS_URL or env.string("AKRI_CHANNEL_REDIS_URL", "")
if _CHANNEL_REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [_CHANNEL_REDIS_URL],
                "prefix": env.string("AKRI_CHANNEL_PREFIX", "akri"),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: Redis broker in production; in the embedded default tasks run in-process.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# API tokens (akri_site.dashboard.tokens) expire this many days after they are made; 0: never.
AKRI_API_TOKEN_DAYS = env.number("AKRI_API_TOKEN_DAYS", 90.0, minimum=0, maximum=3660)
# Sign-in throttling (django-axes; issue 29 item 7): AXES_FAILURE_LIMIT wrong passwords lock
# out that user name from every address, and that address for every user name, for
# AXES_COOLOFF_MINUTES. Every failure and lockout is a row (the admin's "Axes" section), and a
# lockout also an AuditEntry; an admin unlocks by deleting the attempt in the admin or with
# ``manage.py axes_reset_username NAME`` / ``axes_reset_ip ADDRESS``. The client address is
# REMOTE_ADDR, which runweb sets from X-Forwarded-For only for AKRI_FORWARDED_ALLOW_IPS.
AUTHENTICATION_BACKENDS = [
    *(["axes.backends.AxesStandaloneBackend"] if _WEB else []),
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.integer("AXES_FAILURE_LIMIT", 5, minimum=1, maximum=1000)
AXES_COOLOFF_TIME = timedelta(
    minutes=env.number("AXES_COOLOFF_MINUTES", 15.0, minimum=0.1, maximum=7 * 24 * 60)
)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_CLIENT_IP_CALLABLE = "akri_site.dashboard.lockout.client_address"
AXES_USERNAME_CALLABLE = "akri_site.dashboard.lockout.client_username"
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Signing out (dashboard and admin) returns to the dashboard's sign-in page, not Django's stock
# "logged out" page.
LOGOUT_REDIRECT_URL = "/accounts/login/?signed_out=1"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.string("TIME_ZONE", "UTC")
USE_I18N = True
# The admin shows dates in the dashboard's one format (akri_site/formats/en/formats.py).
FORMAT_MODULE_PATH = ["akri_site.formats"]
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env.string("AKRI_STATIC_ROOT", str(VAR_DIR / "static")))
# Made when it can be (whitenoise warns about a missing one); a read-only image may lack it.
with contextlib.suppress(OSError):
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Whitenoise serves the app and project directories directly, so neither the demo nor a fresh
# deployment needs collectstatic; files found in STATIC_ROOT (collectstatic) are served too.
# No manifest storage: it would make every page fail until collectstatic has run.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- hardening (issue #12) -----------------------------------------------------------------
# Production defaults follow ``manage.py check --deploy``; each can be changed from the
# environment (e.g. plain HTTP inside a trusted network: AKRI_SECURE_COOKIES=false).
_HEADER = env.string("SECURE_PROXY_SSL_HEADER", "")
# The header a TLS-terminating proxy sets, e.g. X-Forwarded-Proto: "https" means secure.
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _HEADER.upper().replace("-", "_").removeprefix("HTTP_"), "https")
    if _HEADER
    else None
)
SECURE_SSL_REDIRECT = env.boolean("SECURE_SSL_REDIRECT", PRODUCTION)
# Probes and Prometheus scrape over plain HTTP inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.integer("SECURE_HSTS_SECONDS", 31536000 if PRODUCTION else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.boolean("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.boolean("AKRI_SECURE_COOKIES", PRODUCTION)
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
# HSTS preloading commits the whole domain for months: the domain owner's call, not ours.
SILENCED_SYSTEM_CHECKS = ["security.W021"]
# Every page: our own scripts and styles only (the dashboard has no inline code), websockets
# and fetches to this origin only, never framed.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# /api/docs/: Swagger UI from drf-spectacular-sidecar's static files, never from a CDN.
SPECTACULAR_SETTINGS = {
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
# Only the schema class: ``extend_schema`` on a view's method builds on this default, and DRF's
# own (the legacy generator) broke /api/schema/ for any such view (issue 29, item 10).
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
# Password reset needs mail: its pages exist only when EMAIL_HOST is set.
EMAIL_HOST = env.string("EMAIL_HOST", "")
EMAIL_PORT = env.integer("EMAIL_PORT", 587, minimum=1, maximum=65535)
EMAIL_HOST_USER = env.string("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env.string("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env.boolean("EMAIL_USE_TLS", True)
DEFAULT_FROM_EMAIL = env.string("DEFAULT_FROM_EMAIL", "akri-site@localhost")
# runweb: addresses whose X-Forwarded-For/-Proto headers are believed (the ingress).
FORWARDED_ALLOW_IPS = env.string("AKRI_FORWARDED_ALLOW_IPS", "127.0.0.1")
# /metrics: open when empty; otherwise Prometheus sends "Authorization: Bearer <token>".
METRICS_TOKEN = env.string("METRICS_TOKEN", "")
# /metrics of the processes without a web server of their own (runagent, runcontroller, the
# Celery worker: agent.exporter), on this port, 0 for none. 8080 and the name are Akri's
# (its agent and controller read METRICS_PORT); the web serves /metrics on its own port.
METRICS_PORT = env.integer("METRICS_PORT", 8080, minimum=0, maximum=65535)
METRICS_ADDRESS = env.ip_address("AKRI_METRICS_ADDRESS", "0.0.0.0")

# --- akri-site behaviour -------------------------------------------------------------------
AKRI = {
    # Namespace the agent and controller watch for Configurations and Instances.
    "NAMESPACE": env.string("AKRI_NAMESPACE", "default"),
    # kubeconfig for the API server; empty means in-cluster configuration.
    "KUBECONFIG": env.string("KUBECONFIG", ""),
    # In-cluster configuration reads the pod's service account (token, ca.crt) from here; a
    # benchmark that runs the agent as its DaemonSet does, outside a pod, points it elsewhere.
    "SERVICE_ACCOUNT_DIR": env.string(
        "AKRI_SERVICE_ACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount"
    ),
    "DEVICE_PLUGIN_DIR": env.string("AKRI_DEVICE_PLUGIN_DIR", "/var/lib/kubelet/device-plugins"),
    "POD_RESOURCES_SOCKET": env.string(
        "AKRI_POD_RESOURCES_SOCKET", "/var/lib/kubelet/pod-resources/kubelet.sock"
    ),
    "DISCOVERY_HANDLERS_DIRECTORY": env.string("DISCOVERY_HANDLERS_DIRECTORY", "/var/lib/akri"),
    # Seconds a shared device may go unseen before this node leaves the Instance's nodes.
    "OFFLINE_GRACE_SECONDS": env.number("AKRI_OFFLINE_GRACE_SECONDS", 300.0, minimum=0),
    # Seconds an external discovery handler endpoint whose stream failed is re-dialled before
    # it is dropped until it registers again; 0 drops it at once, as Akri does.
    "DISCOVERY_RECONNECT_SECONDS": env.number("AKRI_DISCOVERY_RECONNECT_SECONDS", 0.0, minimum=0),
    # Seconds a slot claimed by Allocate may wait for its pod to show in PodResources.
    "SLOT_GRACE_SECONDS": env.number("SLOT_GRACE_PERIOD", 20.0, minimum=0),
    # Interval of the node-local safety-net sweep.
    "SWEEP_INTERVAL_SECONDS": env.number("SLOT_RECLAIM_INTERVAL", 10.0, minimum=0.05),
    # Seconds a node may be NotReady before cluster reconciliation frees its slots.
    "NODE_GONE_GRACE_SECONDS": env.number("AKRI_NODE_GONE_GRACE_SECONDS", 60.0, minimum=0),
    # Cache data older than this (no watch progress) is shown as stale.
    "STALE_SECONDS": env.number("AKRI_STALE_SECONDS", 90.0, minimum=1),
    # The dashboard calls a slot held longer than this "held long" (stuck, issue 17).
    "STUCK_AFTER_HOURS": env.number("AKRI_STUCK_AFTER_HOURS", 24.0, minimum=0.01),
    # Watch streams end and restart this often, so a quiet cluster still shows progress.
    "WATCH_TIMEOUT_SECONDS": env.integer("AKRI_WATCH_TIMEOUT_SECONDS", 55, minimum=1, maximum=3600),
    # Hours a reconciliation run that changed nothing stays in the history. Runs that released,
    # restored or hit a conflict or error are kept (they are the history operators read).
    "RUN_RETENTION_HOURS": env.number("AKRI_RUN_RETENTION_HOURS", 48.0, minimum=0.01),
    # Slot usage and release latency charts (agent.usage): the controller samples this often
    # into one row per Configuration x node per minute, kept this long (the 7 d range needs 168).
    "USAGE_SAMPLE_SECONDS": env.number("AKRI_USAGE_SAMPLE_SECONDS", 60.0, minimum=1),
    "USAGE_HISTORY_HOURS": env.number("AKRI_USAGE_HISTORY_HOURS", 192.0, minimum=1),
    # runcontroller: collection off during the first sync, then its objects frozen out of
    # full collections (agent.heap); false for CPython's default collection throughout.
    "CONTROLLER_GC_FREEZE": env.boolean("AKRI_CONTROLLER_GC_FREEZE", True),
    # Coalescing window of the live fan-out to browsers.
    "LIVE_COALESCE_MS": env.integer("AKRI_LIVE_COALESCE_MS", 100, minimum=0, maximum=5000),
    # An open websocket checks its session and role again this often (and on every frame).
    "WS_RECHECK_SECONDS": env.number("AKRI_WS_RECHECK_SECONDS", 15.0, minimum=0.05),
    # --- scheduler extender (issue 14) ---
    # Sharing policies the extender enables, by entry-point name (agent.sharing.registry).
    "SHARING_POLICIES": env.words("AKRI_SHARING_POLICIES", ["akri-instance", "akri-configuration"]),
    # prioritize: "spread" favours nodes with more free devices, "pack" the fullest.
    "EXTENDER_PRIORITY": env.choice("AKRI_EXTENDER_PRIORITY", "spread", ("spread", "pack")),
    # Seconds a bind-time assignment counts as taken before the agent's claim shows.
    "ASSIGNMENT_TIMEOUT_SECONDS": env.number("AKRI_ASSIGNMENT_TIMEOUT", 30.0, minimum=1),
    # The agent looks up the extender's assignment of the pod it allocates for (one pod
    # list per Allocate); off when no extender assigns.
    "AGENT_ASSIGNMENTS": env.boolean("AKRI_AGENT_ASSIGNMENTS", False),
}

# --- deployment (deploy/) ----------------------------------------------------------------------
# A pod names what it cannot run without (web: DATABASE_URL; the agent: NODE_NAME); a missing one
# stops it at start with one line, rather than running on a development default.
env.require_present(env.words("AKRI_REQUIRED_SETTINGS", []))

# --- leader election (controller replicas, Celery beat): agent.leader ----------------------
# One controller replica and one beat act at a time, elected through a Lease in AKRI_NAMESPACE.
# A SIGKILLed leader is replaced within lease + 2.4 x retry seconds (11.6 s with these defaults).
LEADER_ELECTION = {
    "ENABLED": env.boolean("AKRI_LEADER_ELECTION", True),
    "LEASE_DURATION": env.number("AKRI_LEASE_DURATION", 8.0, minimum=1),
    "RENEW_DEADLINE": env.number("AKRI_LEASE_RENEW_DEADLINE", 5.0, minimum=0.1),
    "RETRY_PERIOD": env.number("AKRI_LEASE_RETRY_PERIOD", 1.5, minimum=0.05),
}

# --- queue charges (agent/queues, seed 003) ---------------------------------------------------
AKRI_QUEUES = {
    # The label on an Instance or ResourceClaim that names its owner queue.
    "LABEL_KEY": env.string("AKRI_QUEUE_LABEL", "akri-site.io/queue"),
    # Queue resolvers, tried in this order (agent.charges.resolve.RESOLVERS names them).
    "RESOLVERS": tuple(env.words("AKRI_QUEUE_RESOLVERS", ["kai", "kueue", "volcano", "default"])),
    # The queue of a pod no resolver places; empty: such a pod has no queue.
    "DEFAULT_QUEUE": env.string("AKRI_QUEUE_DEFAULT", "default"),
    # Trust a pod's queue label when that queue system is not installed. Off in production: a
    # label is whatever a tenant writes (another team's queue too), so only a queue system's
    # objects make a queue chargeable. On in development: the demo runs no queue system.
    "LABELS_ALONE": env.boolean("AKRI_QUEUE_LABELS_ALONE", not PRODUCTION),
    # Claims used by several queues with no owner label: "deduct" or "attribute".
    "ORPHANS": env.choice("AKRI_QUEUE_ORPHANS", "deduct", ("deduct", "attribute")),
    # Queues that do not share what they own (a queue object's akri-site.io/opt-out wins).
    "OPT_OUT": env.words("AKRI_QUEUE_OPT_OUT", []),
    # Charged DRA device classes and Akri Configurations; "*" charges every one.
    "ACCOUNTED_CLASSES": env.words("AKRI_QUEUE_ACCOUNTED_CLASSES", ["*"]),
    "ACCOUNTED_CONFIGURATIONS": env.words("AKRI_QUEUE_ACCOUNTED_CONFIGURATIONS", ["*"]),
    # Users the webhook lets add an owner label after creation: the service accounts deploy/
    # gives the Celery worker (which writes the labels) and the controller (in-process tasks).
    "LABEL_WRITERS": env.words(
        "AKRI_QUEUE_LABEL_WRITERS",
        [
            "system:serviceaccount:akri-site:akri-site-worker",
            "system:serviceaccount:akri-site:akri-site-controller",
        ],
    ),
    "DEBOUNCE_SECONDS": env.number("AKRI_QUEUE_DEBOUNCE_SECONDS", 0.5, minimum=0.01),
    # Least seconds between two full recomputes asked for by watch events (relists, queues).
    "FULL_MIN_SECONDS": env.number("AKRI_QUEUE_FULL_MIN_SECONDS", 10.0, minimum=0),
    "RECOMPUTE_SECONDS": env.number("AKRI_QUEUE_RECOMPUTE_SECONDS", 30.0, minimum=1),
    "SAMPLE_SECONDS": env.number("AKRI_QUEUE_SAMPLE_SECONDS", 60.0, minimum=1),
    "HISTORY_HOURS": env.number("AKRI_QUEUE_HISTORY_HOURS", 168.0, minimum=0.01),
    # At most this many refusal rows are kept (the newest), whatever their age: a flood of
    # forged reviews must not fill the database before the hourly prune by age.
    "REFUSALS_MAX": env.integer("AKRI_QUEUE_REFUSALS_MAX", 20_000, minimum=100),
    "CRD_RECHECK_SECONDS": env.number("AKRI_QUEUE_CRD_RECHECK_SECONDS", 60.0, minimum=0.1),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # Client errors (4xx) are logged in one line, without the traceback Django attaches.
    "filters": {"client_errors": {"()": "akri_site.logs.ClientErrorsWithoutTraceback"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["client_errors"],
        }
    },
    "root": {
        "handlers": ["console"],
        "level": env.choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR")),
    },
    "loggers": {"kubernetes": {"level": "WARNING"}, "urllib3": {"level": "WARNING"}},
}
if not _WEB:
    # The agent serves no requests: Django's own logging (its admin e-mail handler loads the
    # debug views and templates, about 1.5 MB of every agent) has nothing to do there. Ours
    # alone, configured here as Django's documentation shows for LOGGING_CONFIG = None.
    LOGGING_CONFIG = None
    logging.config.dictConfig(LOGGING)
