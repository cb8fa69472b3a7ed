"""The token a Ray cluster with token authentication wants (Ray 2.52+), sent as Ray expects.

Ray's dashboard (state API, Jobs API, /api/version) checks `Authorization: Bearer TOKEN`
when the cluster runs with `RAY_AUTH_MODE=token` (Ray 2.60 also turns it on when
`~/.ray/auth_token` exists and `RAY_AUTH_MODE` is unset): without a token it answers 401,
with a wrong one 403 (ray/_private/authentication/http_token_authentication.py).

Where the token comes from, first found wins:

    --ray-token-file FILE   (RLHF_EXPORTER_RAY_TOKEN_FILE; a mounted Secret) re-read when it
                            changes, so a rotated Secret is picked up without a restart
    --ray-token TOKEN       (RLHF_EXPORTER_RAY_TOKEN; prefer the variable: flags show in ps)
    $RAY_AUTH_TOKEN_PATH, $RAY_AUTH_TOKEN   Ray's own variables, as a Ray pod sets them

The token is never logged; the errors say which setting it came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..auth import check_token
from .base import SourceError

MAX_TOKEN_FILE = 64 << 10  # bytes read from a token file at most
SETTING = (
    "ray_token_file (--ray-token-file, RLHF_EXPORTER_RAY_TOKEN_FILE) or RLHF_EXPORTER_RAY_TOKEN"
)


class RayToken:
    """A Ray token from a value or a file (re-read when its mtime or size changes)."""

    def __init__(self, value: str | None = None, path: str | None = None, where: str = ""):
        self.value = check_token(value, where or "ray_token") if value is not None else None
        self.path = Path(path) if path else None
        self.where = where or ("ray_token_file" if path else "ray_token")
        self._stamp: tuple[int, int] | None = None
        self._cached: str | None = None

    @classmethod
    def resolve(
        cls,
        value: str | None,
        path: str | None,
        environ: Mapping[str, str] | None = None,
    ) -> RayToken | None:
        """The settings' token, else Ray's own variables, else None (no token sent)."""
        environ = os.environ if environ is None else environ
        if path:
            return cls(path=path, where="ray_token_file")
        if value:
            return cls(value=value, where="ray_token")
        if environ.get("RAY_AUTH_TOKEN_PATH"):
            return cls(path=environ["RAY_AUTH_TOKEN_PATH"], where="$RAY_AUTH_TOKEN_PATH")
        if environ.get("RAY_AUTH_TOKEN"):
            return cls(value=environ["RAY_AUTH_TOKEN"], where="$RAY_AUTH_TOKEN")
        return None

    def get(self) -> str:
        """The token now; a SourceError (reason `token_file`) names what is wrong with the
        file without showing its content."""
        if self.path is None:
            assert self.value is not None
            return self.value
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp or self._cached is None:
                with open(self.path, "rb") as f:
                    raw = f.read(MAX_TOKEN_FILE + 1)
                if len(raw) > MAX_TOKEN_FILE:
                    raise ValueError(f"larger than {MAX_TOKEN_FILE} bytes: not a token")
                self._cached = check_token(raw.decode("utf-8", "replace"), self.where)
                self._stamp = stamp
        except (OSError, ValueError) as exc:
            self._cached = self._stamp = None
            raise SourceError(
                "token_file", f"Ray token file {self.path} ({self.where}): {exc}"
            ) from None
        assert self._cached is not None
        return self._cached

    def header(self) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.get()}


def auth_error(status: int, path: str, token: RayToken | None) -> SourceError:
    """The SourceError of a 401 or 403 from Ray's dashboard, naming the setting to fix."""
    if status == 401:
        if token is None:
            hint = (
                "this Ray cluster has token authentication on and no token was sent: set "
                f"{SETTING} to its token (`ray get-auth-token` prints it)"
            )
        else:
            hint = f"Ray wants a token and did not take the one from {token.where}"
    else:
        where = token.where if token is not None else "nowhere (none was set)"
        hint = (
            f"Ray refused the token from {where}: it is not this cluster's token; check {SETTING}"
        )
    return SourceError(f"http_{status}", f"GET {path}: HTTP {status}: {hint}")
