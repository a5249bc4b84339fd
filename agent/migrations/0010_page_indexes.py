"""Indexes for the dashboard's pages at 40,000 Instances (issue 32 §4).

A pod's slots by name (``slot_pod``, every database); and, on PostgreSQL, trigram indexes for
the "name contains" searches. Search, the slot map's pod filter and the list pages look names up with ``icontains``, which
Django writes as ``UPPER(col::text) LIKE UPPER('%term%')``: a scan of every row (40,000
Instances, 160,000 slots) whatever the term. A GIN trigram index on that same expression
answers a term of three characters or more from the index. Other databases have no such
index and keep scanning; so does PostgreSQL where ``pg_trgm`` cannot be created (it is a
trusted extension from PostgreSQL 13, which the database's owner may create).
"""

import logging

from django.db import migrations, models, transaction

log = logging.getLogger(__name__)

INDEXES = (
    ("instance_name_trgm", "agent_instance", "name", ""),
    ("pod_name_trgm", "agent_pod", "name", ""),
    # Only slots naming a pod: most slots of a large cache are free.
    ("slot_pod_name_trgm", "agent_slot", "pod_name", "WHERE pod_name <> ''"),
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except Exception as exc:  # not allowed here: searches scan, as before
        log.warning("pg_trgm unavailable (%s): name searches will scan their tables", exc)
        return
    for name, table, column, where in INDEXES:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON {table} "
            f"USING gin (UPPER({column}::text) gin_trgm_ops) {where}"
        )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, *_ in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("agent", "0009_instance_cordon"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="slot",
            index=models.Index(
                condition=models.Q(("pod_name", ""), _negated=True),
                fields=["pod_name", "pod_namespace"],
                name="slot_pod",
            ),
        ),
        migrations.RunPython(create, drop),
    ]
