"""API keys → tenants, and the admin token (§5.3: weights and limits come from the control plane).

A client presents ``Authorization: Bearer <key>``. The key's SHA-256 is compared with every
tenant's ``api_key_sha256`` from the configuration with :func:`hmac.compare_digest`, always over
all tenants (no early exit), so the time taken does not reveal which prefix matched. The tenant
found decides the request's weight and limits; nothing in a request can name or raise them
(R5.3.7).

Rules:

* **no keys configured** (the default: one tenant ``default`` without ``api_key_sha256``):
  every request belongs to that tenant, whatever key it carries — a single-tenant service;
* **keys configured**: a request with a key must match a tenant (else 401); a request with
  no key belongs to the one keyless tenant if the configuration has one, else 401.

The admin API takes a separate bearer token whose SHA-256 is ``server.admin_token_sha256``;
with none configured the admin API is disabled (403).
"""

from __future__ import annotations

import hashlib
import hmac

from calculet.config import SchedulerConfig
from calculet.server.errors import APIError


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None when absent or empty)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


class TenantDirectory:
    """Resolves API keys to configured tenant names (bounded label values for §16 metrics)."""

    def __init__(self, config: SchedulerConfig) -> None:
        self._keyed = tuple((t.name, bytes.fromhex(t.api_key_sha256)) for t in config.tenants
                            if t.api_key_sha256 is not None)
        keyless = [t.name for t in config.tenants if t.api_key_sha256 is None]
        self._keyless: str | None = keyless[0] if keyless else None
        self.names: tuple[str, ...] = tuple(t.name for t in config.tenants)

    def resolve(self, authorization: str | None) -> str:
        """The tenant of a request; :class:`APIError` 401 for an unknown or missing key."""
        if not self._keyed:
            assert self._keyless is not None  # the config guarantees one keyless tenant then
            return self._keyless
        token = bearer(authorization)
        if token is None:
            if self._keyless is not None:
                return self._keyless
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        found: str | None = None
        for name, expected in self._keyed:  # every tenant is compared: no early exit
            if hmac.compare_digest(digest, expected) and found is None:
                found = name
        if found is None:
            raise APIError(401, "unknown API key", code="invalid_api_key")
        return found


class AdminGuard:
    """The admin API's bearer token check (constant-time SHA-256 compare)."""

    def __init__(self, config: SchedulerConfig) -> None:
        value = config.server.admin_token_sha256
        self._expected = bytes.fromhex(value) if value is not None else None

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def check(self, authorization: str | None) -> None:
        if self._expected is None:
            raise APIError(403, "the admin API is disabled: set server.admin_token_sha256 in the configuration",
                           code="admin_disabled")
        token = bearer(authorization)
        digest = hashlib.sha256((token or "").encode("utf-8")).digest()
        if not hmac.compare_digest(digest, self._expected) or token is None:
            raise APIError(401, "invalid admin token", code="invalid_admin_token")
