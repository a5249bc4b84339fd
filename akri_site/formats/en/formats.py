"""Display formats for the admin and any ``{{ datetime }}`` rendered without a filter: the
dashboard's one format (``2026-11-24 09:31:05 UTC``, see the ``when`` template filter) instead
of English prose dates. Input formats stay Django's."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
