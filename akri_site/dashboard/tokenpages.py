"""``/accounts/tokens/``: a signed-in user's own API tokens: listed, made (the key shown once,
on the answer to the POST that made it) and revoked. Admins manage everyone's in the admin."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from akri_site.dashboard import tokens
from akri_site.dashboard.access import viewer_required
from akri_site.dashboard.models import ApiToken


class TokenForm(forms.Form):
    action = forms.ChoiceField(choices=(("create", "create"), ("revoke", "revoke")))
    name = forms.CharField(required=False, max_length=100)
    days = forms.FloatField(required=False, min_value=0, max_value=3660)
    token = forms.IntegerField(required=False, min_value=1)


def _page(request: HttpRequest, status: int = 200, **extra: object) -> HttpResponse:
    mine = ApiToken.objects.filter(user=request.user)
    return render(request, "registration/tokens.html", {"tokens": mine, **extra}, status=status)


@never_cache
@require_http_methods(["GET", "POST"])
@viewer_required
def my_tokens(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request)
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _page(request, 400, errors=form.errors)
    data = form.cleaned_data
    if data["action"] == "create":
        row, key = tokens.issue(request.user, data["name"], data["days"])
        # Rendered, not redirected: the key exists only in this answer.
        return _page(request, 201, new_key=key, new_token=row)
    deleted, _ = ApiToken.objects.filter(user=request.user, pk=data["token"]).delete()
    if not deleted:
        return _page(request, 400, errors={"token": ["You have no such token."]})
    messages.success(request, "Token revoked: scripts using it now get 401.")
    return redirect("my-tokens")
