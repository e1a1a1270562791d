"""Calculet's admin API as one board's rollout needs it (§10–§12: load, golden check, rollback).

Why apart from the rollout: the rollout decides, this module only asks one board over HTTP
(``GET /admin/models``, ``POST /admin/models/{alias}/load`` — which runs §11 steps 1–11, golden
vectors included, and answers once the new generation is Ready or the load failed —,
``POST …/rollback``, ``GET /health/ready``), and turns answers into plain values or one
:class:`~calculet.errors.CalculetError` that names the board.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from calculet.errors import BadRequest, CalculetError, Unavailable

LOAD_TIMEOUT_S = 300.0
"""A load or rollback answers once Ready (or failed); it includes the old generation's drain."""


@dataclass(frozen=True)
class Served:
    """What a board serves now: its active generation."""

    generation: int
    state: str
    package: str
    package_sha256: str


class BoardAdmin:
    """The admin API of one board at ``base_url`` (``Authorization: Bearer <token>``)."""

    def __init__(self, name: str, base_url: str, token: str, *, timeout_s: float = 10.0,
                 load_timeout_s: float = LOAD_TIMEOUT_S) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s

    # ------------------------------------------------------------------ reads

    def models(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self._call("GET", "/admin/models")["data"]
        return data

    def served(self) -> Served | None:
        """The active generation, or None when the alias points nowhere."""
        active = [e for e in self.models() if e.get("active")]
        if not active:
            return None
        entry = active[-1]
        return Served(int(entry["generation"]), str(entry.get("state")), str(entry.get("package") or ""),
                      str(entry.get("package_sha256") or ""))

    def busy(self) -> int:
        """Requests pinned to any generation plus device jobs still in flight (0 = idle)."""
        return sum(int(e.get("active_requests", 0)) + int(e.get("inflight_jobs", 0)) for e in self.models())

    def active_requests(self) -> int:
        """Requests pinned to any generation (admitted and not yet ended)."""
        return sum(int(e.get("active_requests", 0)) for e in self.models())

    def config(self) -> dict[str, Any]:
        """The board's effective configuration (``GET /admin/config``)."""
        return self._call("GET", "/admin/config")

    def ready(self) -> tuple[bool, str]:
        """``GET /health/ready``: (200?, detail)."""
        try:
            with httpx.Client(timeout=self.timeout_s) as http:
                response = http.get(self.base_url + "/health/ready")
        except httpx.HTTPError as exc:
            return False, f"unreachable: {exc}"
        return response.status_code == 200, str(response.json().get("detail", ""))

    # ------------------------------------------------------------------ operations

    def load(self, alias: str, package: str) -> dict[str, Any]:
        """§11 on this board: verify, configure, golden-check, publish (blocks until done)."""
        return self._call("POST", f"/admin/models/{alias}/load", json={"package": package},
                          timeout=self.load_timeout_s)

    def drain(self, alias: str) -> dict[str, Any]:
        """§12 on this board: new requests 503 and /health/ready 503 at once; accepted ones run on."""
        return self._call("POST", f"/admin/models/{alias}/drain")

    def rollback(self, alias: str) -> dict[str, Any]:
        """§11 step 11: the previous signed artifact, verified and loaded again."""
        return self._call("POST", f"/admin/models/{alias}/rollback", timeout=self.load_timeout_s)

    # ------------------------------------------------------------------ internals

    def _call(self, method: str, path: str, *, timeout: float | None = None, **kw: Any) -> dict[str, Any]:
        try:
            with httpx.Client(timeout=timeout or self.timeout_s) as http:
                response = http.request(method, self.base_url + path, headers=self._headers, **kw)
        except httpx.HTTPError as exc:
            raise Unavailable(f"board {self.name} ({self.base_url}): {method} {path}: {exc}") from None
        try:
            body: dict[str, Any] = response.json()
        except ValueError:
            body = {}
        if response.status_code == 200:
            return body
        message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else None
        error_type: type[CalculetError] = BadRequest if 400 <= response.status_code < 500 else Unavailable
        raise error_type(f"board {self.name}: {method} {path} answered {response.status_code}: "
                         f"{message or response.text[:300]}", status=response.status_code)


__all__ = ["BoardAdmin", "LOAD_TIMEOUT_S", "Served"]
