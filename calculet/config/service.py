"""Tenants, models, trust and the HTTP server: who is served, with what, from where (§5.3,
§10, §11 steps 1–2).

Why this exists: tenant weights and limits come from this control-plane file, never from a
request (R5.3.7); a model alias names a signed package that must lie under a trusted root and be
signed by a trusted key (§11 steps 1–2). Nothing is trusted by default. Tenant names and aliases
become metric labels (§16), so they are short identifiers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, Strict

from calculet.config.base import UINT64_MAX, LabelName, PosFloat, PosInt, Section, Sha256Hex

__all__ = ["DeviceConfig", "ModelEntry", "ServerConfig", "TenantConfig", "TrustConfig", "default_tenants"]


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


class DeviceConfig(Section):
    """The device plug-in to drive (issue #18): an entry point of ``calculet.devices`` by name."""

    name: LabelName = Field(
        "sim", description="Device plug-in name (entry-point group 'calculet.devices'); 'sim' = the simulated NPU."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Plug-in specific settings (the simulator: cost)."
    )
    evidence: Path | None = Field(
        None,
        description="Conformance evidence (JSON from python -m calculet.conformance) for this device and "
        "package; without a passing report no capability is offered above C3 (§1, §20).",
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
    max_body_bytes: Annotated[PosInt, Field(le=1024**3)] = Field(
        8 * 1024 * 1024,
        description="Largest request body (bytes), counted while it is read, chunked or not; a "
        "larger one is answered 413 and its connection closed before the rest is read.",
    )
    max_header_bytes: Annotated[PosInt, Field(ge=1024, le=1024 * 1024)] = Field(
        16 * 1024,
        description="Largest request line plus headers (bytes), on either HTTP/1.1 parser (httptools or h11); "
        "headers still incomplete beyond it are answered 431 and the connection closed.",
    )
    header_timeout_s: Annotated[PosFloat, Field(le=300.0)] = Field(
        10.0,
        description="A connection whose request line and headers are not complete this many "
        "seconds after their first byte (or after the connection opened) is answered 408 and "
        "closed, so half-sent requests cannot hold connections.",
    )
    body_timeout_s: Annotated[PosFloat, Field(le=3600.0)] = Field(
        30.0,
        description="Longest pause between two pieces of a request body; past it the request is "
        "answered 408 and its connection closed.",
    )
    body_min_rate_bytes_s: Annotated[PosFloat, Field(le=1024.0**3)] = Field(
        1024.0,
        description="Slowest average rate a request body may arrive at once body_timeout_s has passed: "
        "by t seconds after the headers, at least (t - body_timeout_s) x this many bytes must have "
        "arrived, else 408 and closed — a body trickled a byte at a time, each pause under "
        "body_timeout_s, cannot hold a connection for hours (issue #14).",
    )
    keep_alive_timeout_s: Annotated[PosFloat, Field(le=3600.0)] = Field(
        5.0,
        description="An idle keep-alive connection is closed after this many seconds without a "
        "new request (uvicorn's timeout_keep_alive).",
    )
