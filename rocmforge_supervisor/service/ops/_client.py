"""Talking to a running ``forge serve`` from the CLI (ps, load, unload, logs, activity, usage)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from ..._errors import ServiceError
from ...client import SSEDecoder, Verify, trust_context

__all__ = ["ServiceClient"]


class ServiceClient:
    """``verify``: how an ``https://`` service's certificate is checked (``find_service`` pins the
    one the local service serves); kept as :attr:`verify` for the clients made beside this one."""

    def __init__(self, base_url: str, api_key: str | None = None, *, verify: Verify = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify: ssl.SSLContext | bool = (
            trust_context(verify) if isinstance(verify, str | Path) else verify
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(None, connect=2.0),
            trust_env=False,
            verify=self.verify,
        )

    def close(self) -> None:
        self._http.close()

    def alive(self) -> bool:
        """Whether the service answers. A TLS service whose certificate fails the check is an
        error, not "no service": the user must hear why it was refused."""
        try:
            return self._http.get("/health", timeout=1.0).status_code == 200
        except httpx.ConnectError as exc:
            if isinstance(exc.__cause__, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(
                exc
            ):
                raise ServiceError(
                    f"the forge service at {self.base_url} did not present a trusted certificate: {exc}",
                    hint="check server.tls_cert (the CLI trusts the certificate the service was started with)",
                ) from exc
            return False
        except httpx.HTTPError:
            return False

    def _call(self, method: str, path: str, *, model: str | None = None, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ServiceError(
                f"the forge service at {self.base_url} did not answer: {exc}",
                hint="is `forge serve` running?",
            ) from exc
        if r.status_code == 401:
            raise self._unauthorized()
        if r.status_code >= 400:
            raise _error_from(r, model)
        return r.json()

    def _unauthorized(self) -> ServiceError:
        """The service wants a key this CLI did not send (or not this one): say the two ways to
        give it, which the service's own 401 ("send Authorization: Bearer KEY") cannot know."""
        problem = "refused the API key this command sent" if self.api_key else "needs an API key"
        return ServiceError(
            f"the forge service at {self.base_url} {problem}",
            hint="set FORGE_API_KEY=KEY in the environment, or pass --config FILE: the service's "
            "forge.toml, whose server.api_key the command then sends",
        )

    def models(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._call("GET", "/api/models")["models"]
        return rows

    def load(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self._call("POST", f"/api/models/{_seg(name)}/load", model=name)
        return status

    def unload(self, name: str, *, forget: bool = False) -> dict[str, Any]:
        path = f"/api/models/{_seg(name)}/unload" + ("?forget=true" if forget else "")
        status: dict[str, Any] = self._call("POST", path, model=name)
        return status

    def has_chat_template(self, name: str) -> bool:
        """Whether the model's GGUF carries a chat template (``/api/show``'s ``template``): the
        CLI sends a prompt to such a model as a chat turn, to a base model as text to complete."""
        shown: dict[str, Any] = self._call("POST", "/api/show", model=name, json={"model": name})
        return bool(shown.get("template"))

    def reload(self) -> dict[str, Any]:
        summary: dict[str, Any] = self._call("POST", "/api/reload")
        return summary

    def activity(self, **filters: Any) -> list[dict[str, Any]]:
        """Rows of the activity log, newest first (filters: model, key, status, limit, after)."""
        params = {k: str(v) for k, v in filters.items() if v is not None}
        rows: list[dict[str, Any]] = self._call("GET", "/api/activity", params=params)["activity"]
        return rows

    def usage(self, by: str, since: str) -> dict[str, Any]:
        out: dict[str, Any] = self._call("GET", "/api/usage", params={"by": by, "since": since})
        return out

    def events(self) -> Iterator[dict[str, Any]]:
        """The service's state events (``/api/events``), as they come; ends when closed."""
        decoder = SSEDecoder()
        try:
            with self._http.stream("GET", "/api/events") as r:
                for chunk in r.iter_bytes():
                    for ev in decoder.feed(chunk):
                        if ev.data:
                            yield json.loads(ev.data)
        except (httpx.HTTPError, ValueError):
            return

    def logs(self, name: str, tail: int = 200, follow: bool = False, every: bool = False) -> Iterator[str]:
        params = {"tail": str(tail), "follow": "1" if follow else "0", "all": "1" if every else "0"}
        try:
            with self._http.stream("GET", f"/api/models/{_seg(name)}/logs", params=params) as r:
                if r.status_code == 401:
                    raise self._unauthorized()
                if r.status_code >= 400:
                    r.read()
                    raise _error_from(r, name)
                yield from r.iter_lines()
        except httpx.HTTPError as exc:
            raise ServiceError(f"log stream from {self.base_url} broke: {exc}") from exc


def _seg(name: str) -> str:
    """A model name as one URL path segment, whatever the user typed."""
    return quote(name, safe="")


def _error_from(r: httpx.Response, model: str | None = None) -> ServiceError:
    """One error path for every control-API call: the message of the JSON error body (not the
    body itself), exit code 2 for what the user asked wrongly (unknown model, bad request)."""
    try:
        error = r.json()["error"]
        msg = str(error["message"]) if isinstance(error, dict) else str(error)
    except (ValueError, KeyError, TypeError):
        if r.status_code == 404 and model is not None:  # a name no route matches (e.g. with a "/")
            msg = f"no model named {model!r} in the forge service"
        else:
            msg = r.text.strip()[:300] or f"HTTP {r.status_code}"
    err = ServiceError(msg)
    err.exit_code = 2 if r.status_code in (400, 404, 409, 422) else 1
    return err
