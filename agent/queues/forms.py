from __future__ import annotations

from django import forms

from akri_site.dashboard.forms import _RangeMixin


class QueueRangeForm(_RangeMixin):
    """The Queues pages' time range (the charts); the last hour by default."""

    default_range = "1h"


class EvictForm(forms.Form):
    reason = forms.CharField(required=False, max_length=500)
    # The foreign pods the operator saw on the confirmation page ("ns/name@uid").
    pods = forms.CharField(widget=forms.MultipleHiddenInput, required=False)

    def confirmed(self, data) -> list[str]:
        return [p for p in data.getlist("pods") if p]
