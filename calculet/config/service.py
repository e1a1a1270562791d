"""Tenants, models, trust and the HTTP server: who is served, with what, from where (§5.3,
§10, §11 steps 1–2).

Why this exists: tenant weights and limits come from this control-plane file, never from a
request (R5.3.7); a model alias names a signed package that must lie under a trusted root and be
signed by a trusted key (§11 steps 1–2). Nothing is trusted by default. Tenant names and aliases
become metric labels (§16), so they are short identifiers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, Strict

from calculet.config.base import UINT64_MAX, LabelName, PosFloat, PosInt, Section, Sha256Hex

__all__ = ["ModelEntry", "ServerConfig", "TenantConfig", "TrustConfig", "default_tenants"]


class TenantConfig(Section):
    """One tenant of the §5.3 weighted fair queue.

    Weights and limits come from this control-plane file, never from request parameters
    (R5.3.7). The API key is stored only as its SHA-256 so the file is not a secret.
    """

    name: LabelName = Field(description="Tenant name; a metric label value (§16).")
    api_key_sha256: Sha256Hex | None = Field(
        None,
        description="SHA-256 (lowercase hex) of the tenant's API key. At most one tenant may "
        "omit it; that tenant serves requests that carry no key.",
    )
    weight: Annotated[PosFloat, Field(le=1_000_000.0)] = Field(
        1.0, description="WFQ weight: virtual_finish advances by cost/weight (§5.3, R5.3.3)."
    )
    max_active_sequences: PosInt | None = Field(
        None, description="Active sequences of this tenant; null = only the global budget (§5.3)."
    )
    max_waiting_tokens: PosInt | None = Field(
        None, description="Waiting prompt tokens of this tenant; null = only the global budget."
    )
    qps: PosFloat | None = Field(
        None, description="Requests per second admitted for this tenant; null = unlimited."
    )

    ttft_target_ms: PosInt | None = Field(
        None, description="This tenant's time-to-first-token target (its latency class); null = "
        "admission.ttft_target_ms."
    )
    itl_target_ms: PosInt | None = Field(
        None, description="This tenant's inter-token-latency target (its latency class, e.g. "
        "interactive vs batch); null = admission.itl_target_ms."
    )

def default_tenants() -> tuple[TenantConfig, ...]:
    """With no tenants configured, every request belongs to one tenant ``default`` (weight 1)."""
    return (TenantConfig(name="default", weight=1.0),)


class ModelEntry(Section):
    """A model alias and the signed package that provides it (§10, §11)."""

    alias: LabelName = Field(description="Model alias clients address (§10).")
    package: Path = Field(
        description="Package directory or .tar archive; must lie under a trust.trusted_roots "
        "entry (§11 step 1). A relative path is relative to the config file's directory."
    )


class TrustConfig(Section):
    """Where packages may come from and who may sign them (§11 steps 1–2).

    Nothing is trusted by default: the bundled development key is trusted only when a config
    names its directory, so a production config cannot accept dev-signed packages by accident.
    """

    trusted_roots: tuple[Path, ...] = Field(
        (),
        description="Directories packages must resolve under, after following symlinks "
        "(§11 step 1, R11.1). Relative paths are relative to the config file's directory.",
    )
    trusted_keys_dir: Path | None = Field(
        None,
        description="Directory of trusted Ed25519 public keys (*.pem or *.pub hex) that may sign "
        "manifest.json (§11 step 2, R11.2). Relative to the config file's directory.",
    )
    max_file_bytes: Annotated[PosInt, Field(le=UINT64_MAX)] = Field(
        32 * 1024**3,
        description="Largest file a package may hold (bytes); the reference model's parameters "
        "are 16.938 GiB (§13.1).",
    )


class ServerConfig(Section):
    """The HTTP service (OpenAI-compatible API, admin API, /metrics)."""

    host: Annotated[str, Strict(), Field(min_length=1)] = Field(
        "127.0.0.1", description="Listen address; loopback unless deliberately exposed."
    )
    port: Annotated[int, Strict(), Field(ge=1, le=65_535)] = Field(8000, description="Port.")
    admin_token_sha256: Sha256Hex | None = Field(
        None,
        description="SHA-256 (lowercase hex) of the admin API bearer token; null = admin API "
        "disabled.",
    )
