"""Settings for akri-site, read from the environment.

The embedded default needs nothing but Python packages: SQLite, an in-process channel layer
and tasks run in-process. Production sets ``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL``
(channels_redis layer and Celery broker).
"""

from pathlib import Path

import dj_database_url

from akri_site import env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.string("AKRI_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env.boolean("DEBUG", False)
SECRET_KEY = env.string("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and env.boolean("AKRI_REQUIRE_SECRET_KEY", False):
        raise env.EnvError("SECRET_KEY must be set (or SECRET_KEY_FILE)")
    # Development and the embedded demo only: sessions do not survive a restart.
    SECRET_KEY = "akri-site-insecure-development-key-change-me"
ALLOWED_HOSTS = env.words("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.words("CSRF_TRUSTED_ORIGINS", [])

# The node agent (``runagent``, a DaemonSet on every node) serves no HTTP: without daphne it
# does not load Twisted and friends, some 40 MB of every agent's memory.
_WEB = not env.boolean("AKRI_AGENT_ONLY", False)
INSTALLED_APPS = [
    *(["daphne"] if _WEB else []),
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "agent",
    "agent.brokers",
    "akri_site.dashboard",
]

MIDDLEWARE = [
    # The full slot map of a large cluster is megabytes of HTML.
    "django.middleware.gzip.GZipMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "akri_site.urls"
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

DATABASE_URL = env.string("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    # Named outright: the live-server process of the browser tests derives the name from
    # NAME otherwise, which by then is already the test database's.
    DATABASES["default"]["TEST"] = {"NAME": "test_" + DATABASES["default"]["NAME"]}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env.string("AKRI_SQLITE_PATH", str(VAR_DIR / "akri-site.sqlite3")),
            # Many threads (watchers, plugins, reconciler) write: wait for the lock rather
            # than failing, and let readers proceed beside a writer.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file, not memory: Daphne's live-server process must see the test database.
            "TEST": {"NAME": env.string("AKRI_SQLITE_TEST_PATH", str(VAR_DIR / "test.sqlite3"))},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.string("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": env.string("AKRI_CHANNEL_PREFIX", "akri")},
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

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.string("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
SERVE_STATIC = env.boolean("AKRI_SERVE_STATIC", True)

# --- akri-site behaviour -------------------------------------------------------------------
AKRI = {
    # Namespace the agent and controller watch for Configurations and Instances.
    "NAMESPACE": env.string("AKRI_NAMESPACE", "default"),
    # kubeconfig for the API server; empty means in-cluster configuration.
    "KUBECONFIG": env.string("KUBECONFIG", ""),
    "DEVICE_PLUGIN_DIR": env.string("AKRI_DEVICE_PLUGIN_DIR", "/var/lib/kubelet/device-plugins"),
    "POD_RESOURCES_SOCKET": env.string(
        "AKRI_POD_RESOURCES_SOCKET", "/var/lib/kubelet/pod-resources/kubelet.sock"
    ),
    "DISCOVERY_HANDLERS_DIRECTORY": env.string("DISCOVERY_HANDLERS_DIRECTORY", "/var/lib/akri"),
    # Seconds a shared device may go unseen before this node leaves the Instance's nodes.
    "OFFLINE_GRACE_SECONDS": env.number("AKRI_OFFLINE_GRACE_SECONDS", 300.0, minimum=0),
    # Seconds a slot claimed by Allocate may wait for its pod to show in PodResources.
    "SLOT_GRACE_SECONDS": env.number("SLOT_GRACE_PERIOD", 20.0, minimum=0),
    # Interval of the node-local safety-net sweep.
    "SWEEP_INTERVAL_SECONDS": env.number("SLOT_RECLAIM_INTERVAL", 10.0, minimum=0.05),
    # Seconds a node may be NotReady before cluster reconciliation frees its slots.
    "NODE_GONE_GRACE_SECONDS": env.number("AKRI_NODE_GONE_GRACE_SECONDS", 60.0, minimum=0),
    # Cache data older than this (no watch progress) is shown as stale.
    "STALE_SECONDS": env.number("AKRI_STALE_SECONDS", 90.0, minimum=1),
    # Watch streams end and restart this often, so a quiet cluster still shows progress.
    "WATCH_TIMEOUT_SECONDS": env.integer("AKRI_WATCH_TIMEOUT_SECONDS", 55, minimum=1, maximum=3600),
    # Hours a reconciliation run that changed nothing stays in the history. Runs that released,
    # restored or hit a conflict or error are kept (they are the history operators read).
    "RUN_RETENTION_HOURS": env.number("AKRI_RUN_RETENTION_HOURS", 48.0, minimum=0.01),
    # Coalescing window of the live fan-out to browsers.
    "LIVE_COALESCE_MS": env.integer("AKRI_LIVE_COALESCE_MS", 100, minimum=0, maximum=5000),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {
        "handlers": ["console"],
        "level": env.choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR")),
    },
    "loggers": {"kubernetes": {"level": "WARNING"}, "urllib3": {"level": "WARNING"}},
}
