"""Broker deployment: Akri's controller rules (``agent.domain.brokers``) carried out by Celery."""
