"""Scheduling verdicts: the extender's last word on each pod it filtered, so the dashboard can
say why a pod is Pending."""
