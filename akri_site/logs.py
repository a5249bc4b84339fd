"""Logging pieces the settings refer to."""

from __future__ import annotations

import logging


class ClientErrorsWithoutTraceback(logging.Filter):
    """Drop the traceback from log records of client errors (HTTP 4xx).

    Django logs a refused request (403 PermissionDenied, 400 SuspiciousOperation, ...) with the
    exception attached, which a console prints as a full traceback: pages of noise for what is
    the client's mistake, not ours. The one line (``Forbidden (Permission denied): /path``)
    stays; server errors (5xx) keep their traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500 and record.exc_info:
            record.exc_info = None
            record.exc_text = None
        return True
