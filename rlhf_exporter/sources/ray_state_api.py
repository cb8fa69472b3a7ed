"""Ray's state API over HTTP for the `ray` source: the dashboard's address, bounded GETs of
JSON (sources/http.py's client: one deadline, no redirect, no encoded answer, at most
MAX_BODY bytes; an answer that would parse into too many objects is refused before it is
parsed), the state API's envelope, filtered lists and per-class summaries."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import orjson

from . import http
from .base import SourceError
from .ray_token import RayToken, auth_error

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
LIMIT = 10_000  # the state API's most rows per answer (RAY_MAX_LIMIT_FROM_API_SERVER)
MAX_BODY = 16 << 20  # bytes; 10,000 detailed actors are ~10 MB (the state API's most rows)
MAX_CONTAINERS = 500_000  # JSON objects and lists in one answer (10,000 actors: ~100,000)
MAX_ITEMS = 4_000_000  # values in one answer, counted as commas (an upper bound)


def resolve_address(setting: str | None, environ: Mapping[str, str] | None = None) -> str:
    """--ray-address, else $RAY_DASHBOARD_ADDRESS, else $RAY_ADDRESS when it is an HTTP URL
    (Ray's job CLI convention; a bare GCS `host:6379`, `auto` or `ray://` is not the
    dashboard), else http://127.0.0.1:8265."""
    environ = os.environ if environ is None else environ
    for value, strict in (
        (setting, False),
        (environ.get("RAY_DASHBOARD_ADDRESS"), False),
        (environ.get("RAY_ADDRESS"), True),
    ):
        if not value:
            continue
        value = value.strip().rstrip("/")
        if value.startswith(("http://", "https://")):
            return value
        if strict:
            continue
        return "http://" + value
    return DEFAULT_ADDRESS


def as_count(value: Any) -> int:
    """num_restarts and friends arrive as strings (protobuf int64 -> JSON)."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


class StateApi:
    """GETs of one Ray dashboard's JSON APIs; `warn_once(key, message, *args)` logs what
    should be said once (a truncated answer)."""

    def __init__(
        self,
        address: str,
        timeout: float,
        token: RayToken | None,
        warn_once: Callable[..., None],
    ):
        self.address = address.rstrip("/")
        self.token = token  # sent as `Authorization: Bearer` (Ray's token authentication)
        self.http = http.Client(timeout=timeout, max_bytes=MAX_BODY, accept="application/json")
        self._warn_once = warn_once

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, params: list[tuple[str, str]] | None = None) -> Any:
        """GET JSON; every failure is a SourceError with a short reason: the HTTP client's
        (sources/http.py: one deadline over the whole read, identity encoding, no redirect,
        at most MAX_BODY bytes), or `too_many_elements` (an answer that would become more
        than MAX_CONTAINERS objects and lists, or MAX_ITEMS values), or `invalid_json`."""
        url = self.address + path + (("?" + urlencode(params)) if params else "")
        headers = self.token.header() if self.token is not None else None
        try:
            raw = self.http.get(url, headers=headers)
        except http.HttpFailure as exc:
            if exc.status in (401, 403):
                raise auth_error(exc.status, path, self.token) from None
            raise SourceError(exc.reason, str(exc)) from None
        if too_many_elements(raw):
            raise SourceError(
                "too_many_elements",
                f"GET {path}: more than {MAX_CONTAINERS} objects or {MAX_ITEMS} values",
            )
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SourceError("invalid_json", f"GET {path}: not JSON ({exc})") from None

    def _state_api(self, path: str, params: list[tuple[str, str]]) -> Mapping[str, Any]:
        """The state API's envelope {result, msg, data: {result: {...}}} -> the inner result."""
        body = self.get(path, params)
        try:
            if body.get("result") is False:
                raise SourceError(
                    "ray_error", f"GET {path}: Ray says: {str(body.get('msg'))[:200]}"
                )
            inner = body["data"]["result"]
            if not isinstance(inner, Mapping):
                raise TypeError
        except (AttributeError, KeyError, TypeError):
            raise SourceError("bad_response", f"GET {path}: not a state API answer") from None
        if truncated(inner):
            what = path + "".join(f" {v}" for k, v in params if k == "filter_values")
            self._warn_once(
                f"truncated {what}",
                "Ray answered %s with %s of %s rows (the state API's limit is %d): "
                "counts are lower bounds",
                what,
                inner.get("num_after_truncation"),
                inner.get("total"),
                LIMIT,
            )
        return inner

    def list(
        self, resource: str, state: str, detail: bool, extra: tuple[tuple[str, str], ...] = ()
    ) -> tuple[list[Any], bool]:
        params = [
            ("limit", str(LIMIT)),
            ("filter_keys", "state"),
            ("filter_predicates", "="),
            ("filter_values", state),
        ]
        for key, value in extra:
            params += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
        if detail:
            params.append(("detail", "1"))
        inner = self._state_api(f"/api/v0/{resource}", params)
        rows = inner.get("result")
        if not isinstance(rows, list):
            raise SourceError("bad_response", f"/api/v0/{resource}: 'result' is not a list")
        return [r for r in rows if isinstance(r, Mapping)], truncated(inner)

    def summary(self, state: str) -> tuple[dict[str, int], bool]:
        """class_name -> count of actors in `state`."""
        params = [("filter_keys", "state"), ("filter_predicates", "="), ("filter_values", state)]
        inner = self._state_api("/api/v0/actors/summarize", params)
        try:
            summary = inner["result"]["node_id_to_summary"]["cluster"]["summary"]
            counts: dict[str, int] = {}
            for key, entry in summary.items():
                name = str(entry.get("class_name") or key)
                counts[name] = counts.get(name, 0) + as_count(
                    entry.get("state_counts", {}).get(state)
                )
        except (AttributeError, KeyError, TypeError):
            raise SourceError(
                "bad_response", "/api/v0/actors/summarize: unexpected shape"
            ) from None
        return counts, truncated(inner)


def too_many_elements(raw: bytes) -> bool:
    """Whether a JSON answer would parse into more than MAX_CONTAINERS objects and lists or
    MAX_ITEMS values. Counted on the bytes (braces and commas inside strings count too: an
    upper bound), so 60 MB of `{},` is refused before it becomes 20 million dicts."""
    containers = items = 0
    for at in range(0, len(raw), 1 << 20):  # by the MiB: no call holds the lock for long
        end = at + (1 << 20)
        containers += raw.count(b"{", at, end) + raw.count(b"[", at, end)
        items += raw.count(b",", at, end)
        if containers > MAX_CONTAINERS or items > MAX_ITEMS:
            return True
    return False


def truncated(inner: Mapping[str, Any]) -> bool:
    total, kept = inner.get("total"), inner.get("num_after_truncation")
    return isinstance(total, int) and isinstance(kept, int) and kept < total
