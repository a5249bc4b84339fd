"""What the dashboard shows of brokers: the objects as watched, what we last did to them, and
what stops a Configuration's brokers from being deployed."""

from __future__ import annotations

from django.db import models


class Broker(models.Model):
    """A broker Pod or Job, or an Instance/Configuration Service, as the controller's watch
    last saw it. A mirror: the API server is the truth."""

    class Kind(models.TextChoices):
        POD = "Pod"
        JOB = "Job"
        SERVICE = "Service"

    namespace = models.CharField(max_length=253)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, blank=True)
    configuration = models.CharField(max_length=253, blank=True, db_index=True)
    instance = models.CharField(max_length=253, blank=True, db_index=True)
    node = models.CharField(max_length=253, blank=True, db_index=True)
    phase = models.CharField(max_length=32, blank=True)
    deleting = models.BooleanField(default=False)
    created_at = models.DateTimeField(null=True, blank=True)
    seen_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "kind", "name"], name="broker_unique")
        ]
        ordering = ["namespace", "configuration", "instance", "node", "kind", "name"]

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


class BrokerAction(models.Model):
    """One write (or refusal) by the broker deployer: append-only history."""

    class Action(models.TextChoices):
        CREATED = "created"
        ADOPTED = "adopted"  # found already there and ours (a 409, or a re-owned Service)
        DELETED = "deleted"
        REFUSED = "refused"  # the API server refused the object: the spec is at fault
        CONFLICT = "conflict"  # the name is taken by something not ours: left alone

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    namespace = models.CharField(max_length=253)
    configuration = models.CharField(max_length=253, db_index=True)
    instance = models.CharField(max_length=253, blank=True)
    kind = models.CharField(max_length=16)
    name = models.CharField(max_length=253)
    action = models.CharField(max_length=16, choices=Action.choices)
    detail = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["namespace", "kind", "name", "-at"])]
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.action} {self.kind} {self.namespace}/{self.name}"


class ConfigurationBrokers(models.Model):
    """Broker deployment state per Configuration: a spec error blocks it until the
    Configuration changes (``blocked_key`` is its generation and fingerprint then)."""

    namespace = models.CharField(max_length=253)
    configuration = models.CharField(max_length=253)
    error = models.TextField(blank=True)
    blocked_key = models.CharField(max_length=128, blank=True)
    problems = models.TextField(blank=True)  # not blocking: names taken by objects not ours
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "configuration"], name="configuration_brokers_unique"
            )
        ]

    def __str__(self) -> str:
        return f"brokers of {self.namespace}/{self.configuration}"

    def blocks(self, key: str) -> bool:
        return bool(self.error) and self.blocked_key == key
