"""Strict little parsers for settings read from the environment.

A typo in a boolean or a number is an error at start-up, never a silent default.
A secret may come from ``NAME_FILE`` (the file's content, stripped) instead of ``NAME``.
"""

from __future__ import annotations

import ipaddress
import os
import sys


class EnvError(ValueError):
    """A setting in the environment that cannot be used as it is."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def raw(name: str, default: str | None = None) -> str | None:
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError as exc:
            raise EnvError(f"{name}_FILE={path!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def string(name: str, default: str = "") -> str:
    value = raw(name)
    return default if value is None else value


def boolean(name: str, default: bool) -> bool:
    value = raw(name)
    if value is None or value == "":
        return default
    folded = value.strip().lower()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    raise EnvError(f"{name}={value!r} is not a boolean (use one of: true, false, 1, 0, yes, no)")


def integer(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    value = raw(name)
    if value is None or value == "":
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise EnvError(f"{name}={value!r} is not a whole number") from None
    _check_range(name, number, minimum, maximum)
    return number


def number(
    name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    value = raw(name)
    if value is None or value == "":
        return default
    try:
        parsed = float(value.strip())
    except ValueError:
        raise EnvError(f"{name}={value!r} is not a number") from None
    _check_range(name, parsed, minimum, maximum)
    return parsed


def words(name: str, default: list[str]) -> list[str]:
    value = raw(name)
    if value is None:
        return list(default)
    return [part.strip() for part in value.split(",") if part.strip()]


def ip_address(name: str, default: str) -> str:
    """An IP address to listen on (``0.0.0.0``, ``::``, ``127.0.0.1``); a host name is refused,
    since what it resolves to could change between the check and the bind."""
    value = raw(name)
    if value is None or value.strip() == "":
        return default
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise EnvError(f"{name}={value!r} is not an IP address (e.g. 0.0.0.0 or ::)") from None


def choice(name: str, default: str, options: tuple[str, ...]) -> str:
    value = raw(name)
    if value is None or value == "":
        return default
    if value not in options:
        raise EnvError(f"{name}={value!r} is not one of {', '.join(options)}")
    return value


# Django's own floor for a secret key (``check --deploy``, security.W009).
SECRET_MIN_LENGTH = 50
SECRET_MIN_DISTINCT = 5


def require_secret(name: str, value: str, *, refused: tuple[str, ...] = ()) -> None:
    """Refuse a missing, short, repetitive or publicly known secret."""
    if not value:
        raise EnvError(f"{name} must be set (or {name}_FILE) in production")
    if value in refused or value.startswith("django-insecure-"):
        raise EnvError(f"{name} is a publicly known development key; generate a new one")
    if len(value) < SECRET_MIN_LENGTH or len(set(value)) < SECRET_MIN_DISTINCT:
        raise EnvError(
            f"{name} is too weak: at least {SECRET_MIN_LENGTH} characters and "
            f"{SECRET_MIN_DISTINCT} different ones (e.g. python -c 'import secrets; "
            "print(secrets.token_urlsafe(50))')"
        )


def _check_range(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise EnvError(f"{name}={value} is above the maximum {maximum}")


def require_present(names: list[str]) -> None:
    """Refuse to start without the settings a deployment declares it needs
    (``AKRI_REQUIRED_SETTINGS`` in deploy/): the embedded defaults are for development only."""
    missing = [name for name in names if not raw(name)]
    if missing:
        raise EnvError(
            f"{', '.join(missing)} must be set: this deployment requires "
            f"{'it' if len(missing) == 1 else 'them'} (AKRI_REQUIRED_SETTINGS)"
        )


def one_line_for_bad_settings() -> None:
    """Make a bad setting that escapes to the top (daphne, celery: entry points that are not
    manage.py) print one line instead of a traceback; the exit status stays 1."""
    previous = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, EnvError):
            print(f"akri-site: configuration error: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    sys.excepthook = hook
