"""Sign-in pages: Django's auth views, with password reset only when mail is configured.

Password reset sends a mail; without ``EMAIL_HOST`` its form could only fail (with a traceback),
so its pages do not exist at all and admins set passwords with ``manage.py changepassword``.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import urls as auth_urls
from django.urls import URLPattern, path

from akri_site.dashboard import tokenpages

RESET_PAGES = {
    "password_reset",
    "password_reset_done",
    "password_reset_confirm",
    "password_reset_complete",
}


def patterns(mail: bool) -> list[URLPattern]:
    return [p for p in auth_urls.urlpatterns if mail or p.name not in RESET_PAGES]


urlpatterns = [
    *patterns(bool(settings.EMAIL_HOST)),
    # A user's own API tokens (akri_site.dashboard.tokenpages).
    path("tokens/", tokenpages.my_tokens, name="my-tokens"),
]
