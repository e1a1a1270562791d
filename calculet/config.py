"""The ``calculet-scheduler/v1`` configuration (§15), loaded from YAML.

Why a strict schema: §15 configures a scheduler whose wrong value can silently cost fairness
(§5.3), starve long prompts (§6) or ask the device for something it cannot do (§2, §14). So the
loader rejects unknown keys, wrong types and out-of-range values, and every error names the
field path (``queues.decode_weight: must be > 0``) so a person can fix the file without reading
the code. Scalars are *strict*: a quoted ``"8"`` is not an integer and ``1`` is not ``true``.

The values in §15 are the current product's settings; they are the defaults here (ambiguity 18
reads them as defaults, so does this module). Fields that §15 does not list but other sections
need (ambiguity 8) have defaults chosen and documented on each field:

* ``admission``: the §5.1 ``CapacityBudget`` (``max_sequences``, ``max_kv_tokens``,
  ``max_inflight_jobs``) and the §6 long-task quota (R6.11);
* ``queues.wfq_decode_weight``: the ``decode_weight`` of the §5.3 WFQ cost formula, kept apart
  from the WRR weight of the same name (ambiguity 7, see :class:`QueuesConfig`);
* ``batch.select_thresholds`` (§8, R8.2) and ``batch.max_tenant_lane_share`` (§7.2 item 3);
* ``executor.drain_deadline_ms`` (§12), ``executor.physical_devices`` (§3, R1.8) and the §14
  degrade thresholds;
* ``tenants`` (§5.3), ``models`` and ``trust`` (§11 steps 1–2), ``server`` and ``monitoring``.

What the device can do is never decided by this file alone (DESIGN principle 8):
:func:`cross_validate` checks the requested profiles, in-flight depth and device count against
the verified package manifest and the runtime's capability contract, and fails fast (R15.19).
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from calculet.errors import ConfigError
from calculet.yamlfile import read_yaml_file

__all__ = [
    "SCHEMA_ID",
    "DEFAULT_CONFIG_PATH",
    "EXAMPLE_CONFIG_PATH",
    "AdmissionConfig",
    "LongPrefillQuota",
    "QueuesConfig",
    "BatchConfig",
    "DegradeConfig",
    "ExecutorConfig",
    "RecoveryConfig",
    "MonitoringConfig",
    "TenantConfig",
    "ModelEntry",
    "TrustConfig",
    "ServerConfig",
    "SchedulerConfig",
    "CapacityBudget",
    "default_config",
    "parse_config",
    "load_config",
    "cross_validate",
    "config_json_schema",
]

SCHEMA_ID: Final = "calculet-scheduler/v1"
"""The only schema id this loader reads (§15, R15.1)."""

_DATA_DIR: Final = Path(__file__).resolve().parent / "data" / "config"
DEFAULT_CONFIG_PATH: Final = _DATA_DIR / "default.yaml"
"""The §15 reference configuration, byte-for-byte the spec's values."""
EXAMPLE_CONFIG_PATH: Final = _DATA_DIR / "example.yaml"
"""A commented example with tenants, models and trust settings."""

_UINT16_MAX: Final = 65_535
_UINT32_MAX: Final = 4_294_967_295
_UINT64_MAX: Final = 18_446_744_073_709_551_615

# Strict scalar types: YAML already gives typed values, so a quoted number or a 0/1 boolean is
# almost always a mistake worth reporting rather than coercing.
PosInt = Annotated[int, Strict(), Field(gt=0)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
StrictBool = Annotated[bool, Strict()]
PosFloat = Annotated[float, Strict(), Field(gt=0)]
Sha256Hex = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{64}$")]
# Tenant names and model aliases become metric label values (§16: bounded label sets), so
# they are short identifiers, never free text.
LabelName = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class _FieldProblem(ValueError):
    """A cross-field check failed; ``field`` is the path below the validated model's location.

    Pydantic reports a model validator's error at the model's own location; raising this
    instead lets the error formatter name the exact field (``queues.medium_prefill_max_tokens``).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class _Section(BaseModel):
    """Common settings: unknown keys are errors and a loaded config is immutable.

    Immutability matters because one config object is shared by the engine thread, the HTTP
    handlers and the metrics exporter (DESIGN principle 2).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# --------------------------------------------------------------------------------------------
# admission (§5.1, §5.2, §6)
# --------------------------------------------------------------------------------------------


class LongPrefillQuota(_Section):
    """The §6 long-task quota: the only lever against head-of-line blocking without chunking.

    A prompt is *long* when it exceeds ``queues.medium_prefill_max_tokens`` (§6: >4096). Until
    the five chunking preconditions of §6 hold, the scheduler may not split a prompt, so it
    bounds how many long prefills are admitted and how many wait (R6.11).
    """

    max_admitted: PosInt = Field(
        1,
        description="Long prefills (prompt > queues.medium_prefill_max_tokens) admitted at once "
        "(prefill-ready or running). §6, R6.11.",
    )
    max_waiting: PosInt = Field(
        8,
        description="Long prefills allowed to wait for admission; the next one is rejected "
        "with 429. §6, R6.11.",
    )


class AdmissionConfig(_Section):
    """Admission limits (§5.1 ``CapacityBudget``, §5.2 outcomes, §6 long-task quota)."""

    max_waiting_requests: Annotated[PosInt, Field(le=_UINT32_MAX)] = Field(
        128,
        description="Requests allowed to wait; beyond it RejectCapacity (429). §15, R15.3.",
    )
    max_waiting_prompt_tokens: Annotated[PosInt, Field(le=_UINT64_MAX)] = Field(
        262_144,
        description="Prompt tokens allowed to wait; beyond it RejectCapacity (429). §15, R15.4.",
    )
    deadline_default_ms: PosInt = Field(
        120_000,
        description="Deadline of a request that gives none, in ms from creation (monotonic "
        "clock). §15, R15.5.",
    )
    max_sequences: Annotated[PosInt, Field(le=_UINT32_MAX)] = Field(
        16,
        description="Active sequences (admitted, holding KV). §5.1 CapacityBudget.max_sequences. "
        "16 lets the largest §8 profile (B16) be filled; the KV budget still bounds it.",
    )
    max_kv_tokens: Annotated[PosInt, Field(le=_UINT64_MAX)] | None = Field(
        None,
        description="KV tokens the service may reserve. §5.1 CapacityBudget.max_kv_tokens. "
        "null = the KV capacity of the loaded model's capacity plan (§11 step 4); a value "
        "can only lower that capacity, never raise it.",
    )
    max_inflight_jobs: Annotated[PosInt, Field(le=2)] | None = Field(
        None,
        description="Device jobs in flight. §5.1 CapacityBudget.max_inflight_jobs. "
        "null = executor.max_inflight; a value must not exceed it.",
    )
    long_prefill_quota: LongPrefillQuota = Field(
        default_factory=LongPrefillQuota,
        description="Long-task quota (§6, R6.11).",
    )
    queue_needs_prospect: bool = Field(
        True,
        description="§5.2: a request is queued only with 'a prospect of obtaining resources before "
        "the deadline'. When requests are already waiting, one whose estimated wait (from the "
        "measured WFQ service rate) plus max_new_tokens decode steps (at the measured step time) "
        "ends past its deadline is rejected at once with 429 instead of being accepted and "
        "expiring later. false = queue whenever a limit has room.",
    )

    def kv_token_limit(self, device_kv_tokens: int) -> int:
        """The KV token budget: the device's planned capacity, lowered by ``max_kv_tokens``.

        The service tracks KV lengths itself because ``canAllocate`` is only a hint (§5.1,
        R5.1.3); the configured value can never promise more than the capacity plan found.
        """
        if device_kv_tokens < 0:
            raise ValueError("device_kv_tokens must be >= 0")
        if self.max_kv_tokens is None:
            return device_kv_tokens
        return min(self.max_kv_tokens, device_kv_tokens)


# --------------------------------------------------------------------------------------------
# queues (§6 WRR, §5.3 WFQ)
# --------------------------------------------------------------------------------------------


class QueuesConfig(_Section):
    """Queue classes and weights (§6 WRR ``decode:short:medium:long = 8:4:2:1``, §5.3 WFQ).

    Ambiguity 7 — ``decode_weight`` appears twice in the spec: as the WRR share of decode
    service opportunities (§6, §15 ``queues.decode_weight``) and as the multiplier of output
    tokens in the WFQ cost ``prompt_tokens + decode_weight * requested_output_tokens`` (§5.3).
    They measure different things (a count of service opportunities vs. the token cost of one
    requested output token) and are tuned by different experiments, so they are **two
    parameters**: ``decode_weight`` is the WRR weight, ``wfq_decode_weight`` the cost
    multiplier. Both default to the spec's 8, so the spec's numbers hold unchanged (R5.3.2:
    100 prompt + 8 × 10 output = 180), and changing the WRR share no longer silently changes
    every tenant's fairness accounting.
    """

    decode_weight: PosInt = Field(
        8, description="WRR service opportunities of the decode queue. §6, §15, R15.6."
    )
    short_prefill_weight: PosInt = Field(
        4, description="WRR service opportunities of short prefills. §6, §15, R15.7."
    )
    medium_prefill_weight: PosInt = Field(
        2, description="WRR service opportunities of medium prefills. §6, §15, R15.8."
    )
    long_prefill_weight: PosInt = Field(
        1,
        description="WRR service opportunities of long prefills; > 0 so long prompts are never "
        "starved (§5.3, R5.3.4). §6, §15, R15.9.",
    )
    short_prefill_max_tokens: PosInt = Field(
        512, description="A prompt of at most this many tokens is short. §6, §15, R15.10."
    )
    medium_prefill_max_tokens: PosInt = Field(
        4096,
        description="A prompt of at most this many tokens (and more than "
        "short_prefill_max_tokens) is medium; longer is long. §6, §15, R15.11.",
    )
    wfq_decode_weight: PosInt = Field(
        8,
        description="Cost of one requested output token in the WFQ cost "
        "prompt_tokens + wfq_decode_weight * requested_output_tokens (§5.3, R5.3.2). "
        "Separate from the WRR decode_weight (ambiguity 7).",
    )

    @model_validator(mode="after")
    def _classes_ordered(self) -> QueuesConfig:
        if self.medium_prefill_max_tokens <= self.short_prefill_max_tokens:
            raise _FieldProblem(
                "medium_prefill_max_tokens",
                f"must be > short_prefill_max_tokens ({self.short_prefill_max_tokens}); "
                "the short/medium/long classes of §6 must not overlap",
            )
        return self

    def wrr_weights(self) -> dict[str, int]:
        """The §6 WRR weights by queue name, in the spec's order decode:short:medium:long."""
        return {
            "decode": self.decode_weight,
            "short": self.short_prefill_weight,
            "medium": self.medium_prefill_weight,
            "long": self.long_prefill_weight,
        }

    def prefill_class(self, prompt_tokens: int) -> str:
        """The §6 queue class of a prompt: ``short`` (≤512), ``medium`` (≤4096) or ``long``."""
        if prompt_tokens <= self.short_prefill_max_tokens:
            return "short"
        if prompt_tokens <= self.medium_prefill_max_tokens:
            return "medium"
        return "long"


# --------------------------------------------------------------------------------------------
# batch (§2, §7.2, §8)
# --------------------------------------------------------------------------------------------

_DEFAULT_SELECT_THRESHOLDS: Final[Mapping[int, int]] = types.MappingProxyType(
    {16: 12, 8: 6, 4: 3}
)

ProfileSize = Annotated[int, Strict(), Field(gt=0, le=_UINT16_MAX)]


class BatchConfig(_Section):
    """Batch profiles and their selection (§2, §7.2, §8).

    ``profiles`` only *requests* compiled batch sizes; they exist only if the verified calbin
    manifest compiles them (§2: "must not be changed arbitrarily through configuration"), which
    :func:`cross_validate` checks at startup (R2.7, R15.19).
    """

    profiles: tuple[ProfileSize, ...] = Field(
        (1,),
        min_length=1,
        description="Compiled batch sizes to use; each must exist in the calbin manifest "
        "(R2.7, R15.19). The current product can only use [1] (R15.18). §15, R15.12.",
    )
    batching_window_us: Annotated[NonNegInt, Field(le=10_000_000)] = Field(
        0,
        description="Longest wait to fill a batch, in µs; 0 = dispatch at the first tick. It "
        "never delays past the earliest deadline (§7.2 item 4). §15, R15.13.",
    )
    select_thresholds: dict[
        Annotated[int, Strict(), Field(gt=1, le=_UINT16_MAX)],
        Annotated[int, Strict(), Field(gt=0)],
    ] = Field(
        default_factory=lambda: dict(_DEFAULT_SELECT_THRESHOLDS),
        description="Profile size -> minimum ready sequences to select it (§8 example policy: "
        "B16 at >= 12, B8 at >= 6, B4 at >= 3). Every configured profile > 1 needs a "
        "threshold; B1 (or the smallest profile) is the fallback. R8.1, R8.2.",
    )
    max_tenant_lane_share: Annotated[PosFloat, Field(le=1.0)] = Field(
        0.5,
        description="Largest share of a batch's lanes one tenant may occupy unless no other "
        "tenant has a candidate (§7.2 item 3). 1.0 = no cap.",
    )
    deadline_order: Literal["at_risk", "strict"] = Field(
        "at_risk",
        description="§7.2 item 2 'prefer the earliest deadline': 'strict' orders every candidate "
        "by deadline (with the 120 s default deadline, concurrent streams then run one after "
        "another on B1); 'at_risk' orders by deadline only the candidates whose deadline is "
        "within deadline_slack x (remaining tokens x measured step time), ahead of the rest, "
        "which rotate by the fair decode tag (§7.2: 'for the same deadline use virtual finish / "
        "fair round robin').",
    )
    deadline_slack: Annotated[PosFloat, Field(ge=1.0, le=100.0)] = Field(
        2.0,
        description="'at_risk' horizon: a candidate is at risk when its deadline is within this "
        "many times the time its remaining tokens need at the measured step time.",
    )

    @field_validator("profiles")
    @classmethod
    def _profiles_unique_sorted(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        duplicates = sorted({p for p in value if value.count(p) > 1})
        if duplicates:
            raise ValueError(f"duplicate profile(s) {duplicates}")
        return tuple(sorted(value))

    @model_validator(mode="after")
    def _thresholds_cover_profiles(self) -> BatchConfig:
        missing = [p for p in self.profiles if p > 1 and p not in self.select_thresholds]
        if missing:
            raise _FieldProblem(
                "select_thresholds",
                f"no threshold for profile(s) {missing}; §8 selection needs a minimum ready "
                "count for every profile larger than 1",
            )
        previous: tuple[int, int] | None = None
        for size in sorted(self.select_thresholds):
            threshold = self.select_thresholds[size]
            if previous is not None and threshold < previous[1]:
                raise _FieldProblem(
                    "select_thresholds",
                    f"threshold of profile {size} ({threshold}) is below that of the smaller "
                    f"profile {previous[0]} ({previous[1]}); thresholds must not decrease as "
                    "the batch grows (§8)",
                )
            previous = (size, threshold)
        return self


# --------------------------------------------------------------------------------------------
# executor (§3, §12, §14)
# --------------------------------------------------------------------------------------------


class DegradeConfig(_Section):
    """Quantified §14 automatic-degrade triggers (ambiguity 17).

    Output crosstalk, status/counter anomalies and uncertain recovery always degrade; the two
    triggers the spec leaves unquantified are set here. The P99 default reuses M2's ``P99
    regression <= 5%`` (§19) so ping/pong is degraded exactly when it stops meeting the bar it
    needed to be enabled.
    """

    p99_regression_ratio: Annotated[PosFloat, Field(le=10.0)] = Field(
        0.05,
        description="Degrade ping/pong when P99 latency exceeds the single-in-flight baseline "
        "by more than this ratio (0.05 = +5%, M2's bar). §14, R14.7.",
    )
    consecutive_busy_or_timeout: Annotated[PosInt, Field(le=1000)] = Field(
        3,
        description="Degrade after this many consecutive DeviceBusy/timeout results. §14, R14.8.",
    )


class ExecutorConfig(_Section):
    """The device executor (§3, §12, §14)."""

    max_inflight: PosInt = Field(
        1,
        description="Jobs in flight on the device: 1 (serial, the C0 baseline) or 2 "
        "(ping/pong, opt-in, needs the ping/pong capability). §14, §15, R1.3, R15.14.",
    )
    fixed_engine: StrictBool = Field(
        False,
        description="Pin every job to one engine/bank instead of alternating ping and pong "
        "(ambiguity 18); incompatible with max_inflight 2. §14, §15, R15.15.",
    )
    physical_devices: PosInt = Field(
        1,
        description="Physical devices this process drives. CalRT 0.7.6 supports exactly 1; more "
        "boards scale out as more processes (§3, R1.8).",
    )
    drain_deadline_ms: PosInt = Field(
        120_000,
        description="How long unload waits for active requests and in-flight jobs before "
        "entering Recovering (§12). Defaults to deadline_default_ms so every request with the "
        "default deadline has ended by then.",
    )
    degrade: DegradeConfig = Field(
        default_factory=DegradeConfig, description="Automatic ping/pong degrade triggers (§14)."
    )

    @field_validator("max_inflight")
    @classmethod
    def _one_or_two(cls, value: int) -> int:
        if value not in (1, 2):
            raise ValueError(
                f"must be 1 or 2, got {value}; CalRT 0.7.6 has at most two engines "
                "(2 = ping/pong, opt-in, §14)"
            )
        return value

    @model_validator(mode="after")
    def _fixed_engine_is_serial(self) -> ExecutorConfig:
        if self.fixed_engine and self.max_inflight == 2:
            raise _FieldProblem(
                "fixed_engine",
                "cannot be true with max_inflight 2: two jobs in flight need two engines "
                "(ping and pong, §14)",
            )
        return self


# --------------------------------------------------------------------------------------------
# recovery, monitoring
# --------------------------------------------------------------------------------------------


class RecoveryConfig(_Section):
    """Device fault recovery limits (§12, §14, §15)."""

    max_resets_per_10min: Annotated[NonNegInt, Field(le=1000)] = Field(
        2,
        description="Device resets allowed in any sliding 10-minute window; once reached, "
        "recovery stops resetting and the model stays unavailable (ambiguity 18). 0 = never "
        "reset automatically. §15, R15.16.",
    )
    restart_on_unknown_dma: StrictBool = Field(
        True,
        description="After a DMA ends in an unknown state, restart the runtime session instead "
        "of continuing to serve (ambiguity 18). §15, R15.17.",
    )


class MonitoringConfig(_Section):
    """Run-time monitoring of the declared machines' invariants (DESIGN, "declare once")."""

    invariants: StrictBool = Field(
        True,
        description="Check every declared invariant after each transition at run time.",
    )


# --------------------------------------------------------------------------------------------
# tenants, models, trust, server
# --------------------------------------------------------------------------------------------


class TenantConfig(_Section):
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


def _default_tenants() -> tuple[TenantConfig, ...]:
    """With no tenants configured, every request belongs to one tenant ``default`` (weight 1)."""
    return (TenantConfig(name="default", weight=1.0),)


class ModelEntry(_Section):
    """A model alias and the signed package that provides it (§10, §11)."""

    alias: LabelName = Field(description="Model alias clients address (§10).")
    package: Path = Field(
        description="Package directory or .tar archive; must lie under a trust.trusted_roots "
        "entry (§11 step 1). A relative path is relative to the config file's directory."
    )


class TrustConfig(_Section):
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
    max_file_bytes: Annotated[PosInt, Field(le=_UINT64_MAX)] = Field(
        32 * 1024**3,
        description="Largest file a package may hold (bytes); the reference model's parameters "
        "are 16.938 GiB (§13.1).",
    )


class ServerConfig(_Section):
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


# --------------------------------------------------------------------------------------------
# the whole file
# --------------------------------------------------------------------------------------------


class SchedulerConfig(_Section):
    """A whole ``calculet-scheduler/v1`` file (§15).

    ``schema`` is required and must be ``calculet-scheduler/v1`` (R15.1): a file written for
    another schema version is rejected before any other field is read, rather than being
    half-understood.
    """

    schema_id: Annotated[str, Strict()] = Field(
        alias="schema", description="Must be 'calculet-scheduler/v1' (§15, R15.1)."
    )
    model_alias: LabelName = Field(
        "qwen3", description="The alias this scheduler serves (§15, R15.2)."
    )
    admission: AdmissionConfig = Field(
        default_factory=AdmissionConfig,
        description="Admission limits: §5.1 CapacityBudget, §5.2 outcomes, §6 long-task quota.",
    )
    queues: QueuesConfig = Field(
        default_factory=QueuesConfig,
        description="Prefill classes and WRR weights (§6), WFQ cost weight (§5.3).",
    )
    batch: BatchConfig = Field(
        default_factory=BatchConfig,
        description="Batch profiles and their selection (§2, §7.2, §8).",
    )
    executor: ExecutorConfig = Field(
        default_factory=ExecutorConfig,
        description="Device executor: in-flight depth, engines, drain, degrade (§3, §12, §14).",
    )
    recovery: RecoveryConfig = Field(
        default_factory=RecoveryConfig, description="Fault recovery limits (§15)."
    )
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig, description="Run-time invariant monitoring."
    )
    tenants: tuple[TenantConfig, ...] = Field(
        default_factory=_default_tenants,
        description="WFQ tenants (§5.3). Empty or absent = one tenant 'default' with weight 1.",
    )
    models: tuple[ModelEntry, ...] = Field(
        (), description="Model aliases and their signed packages (§10, §11)."
    )
    trust: TrustConfig = Field(
        default_factory=TrustConfig,
        description="Trusted package roots and signing keys (§11 steps 1-2).",
    )
    server: ServerConfig = Field(
        default_factory=ServerConfig, description="HTTP service settings."
    )

    @field_validator("schema_id")
    @classmethod
    def _known_schema(cls, value: str) -> str:
        if value != SCHEMA_ID:
            raise ValueError(f"unknown schema {value!r}; this calculet reads {SCHEMA_ID!r}")
        return value

    @field_validator("tenants", mode="before")
    @classmethod
    def _empty_tenants_mean_default(cls, value: object) -> object:
        if value is None or (isinstance(value, list | tuple) and len(value) == 0):
            return _default_tenants()
        return value

    @field_validator("tenants")
    @classmethod
    def _tenants_distinct(cls, value: tuple[TenantConfig, ...]) -> tuple[TenantConfig, ...]:
        seen_names: dict[str, int] = {}
        seen_keys: dict[str, int] = {}
        keyless: list[str] = []
        for index, tenant in enumerate(value):
            if tenant.name in seen_names:
                raise _FieldProblem(
                    f"[{index}].name",
                    f"duplicate tenant name {tenant.name!r} "
                    f"(also tenants[{seen_names[tenant.name]}])",
                )
            seen_names[tenant.name] = index
            if tenant.api_key_sha256 is None:
                keyless.append(tenant.name)
            elif tenant.api_key_sha256 in seen_keys:
                raise _FieldProblem(
                    f"[{index}].api_key_sha256",
                    f"same API key hash as tenants[{seen_keys[tenant.api_key_sha256]}]; a key "
                    "must identify exactly one tenant",
                )
            else:
                seen_keys[tenant.api_key_sha256] = index
        if len(keyless) > 1:
            raise ValueError(
                f"tenants {keyless} have no api_key_sha256; at most one tenant may serve "
                "requests without a key"
            )
        return value

    @field_validator("models")
    @classmethod
    def _aliases_distinct(cls, value: tuple[ModelEntry, ...]) -> tuple[ModelEntry, ...]:
        seen: dict[str, int] = {}
        for index, entry in enumerate(value):
            if entry.alias in seen:
                raise _FieldProblem(
                    f"[{index}].alias",
                    f"duplicate model alias {entry.alias!r} (also models[{seen[entry.alias]}])",
                )
            seen[entry.alias] = index
        return value

    @model_validator(mode="after")
    def _cross_section(self) -> SchedulerConfig:
        jobs = self.admission.max_inflight_jobs
        if jobs is not None and jobs > self.executor.max_inflight:
            raise _FieldProblem(
                "admission.max_inflight_jobs",
                f"must be <= executor.max_inflight ({self.executor.max_inflight}); the budget "
                "cannot promise more jobs than the executor runs",
            )
        if self.models and self.model_alias not in {m.alias for m in self.models}:
            raise _FieldProblem(
                "model_alias",
                f"{self.model_alias!r} is not among models[].alias "
                f"{sorted(m.alias for m in self.models)}",
            )
        return self

    def capacity_budget(self, device_kv_tokens: int) -> CapacityBudget:
        """The §5.1 ``CapacityBudget`` for a model whose capacity plan offers this KV capacity."""
        return CapacityBudget(
            max_sequences=self.admission.max_sequences,
            max_kv_tokens=self.admission.kv_token_limit(device_kv_tokens),
            max_waiting_requests=self.admission.max_waiting_requests,
            max_waiting_prompt_tokens=self.admission.max_waiting_prompt_tokens,
            max_inflight_jobs=(
                self.admission.max_inflight_jobs
                if self.admission.max_inflight_jobs is not None
                else self.executor.max_inflight
            ),
        )

    def tenant(self, name: str) -> TenantConfig:
        """The tenant called ``name``; ``KeyError`` if there is none."""
        for tenant in self.tenants:
            if tenant.name == name:
                return tenant
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class CapacityBudget:
    """The §5.1 ``CapacityBudget`` as configured (R5.1.1), with KV capacity resolved."""

    max_sequences: int
    max_kv_tokens: int
    max_waiting_requests: int
    max_waiting_prompt_tokens: int
    max_inflight_jobs: int


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------


def default_config() -> SchedulerConfig:
    """The §15 reference configuration (every default), identical to ``default.yaml``."""
    return SchedulerConfig.model_validate({"schema": SCHEMA_ID})


def parse_config(
    data: object, *, source: str = "<config>", base_dir: Path | None = None
) -> SchedulerConfig:
    """Validate already-parsed YAML/JSON data as a ``calculet-scheduler/v1`` config.

    The schema id is checked first: a file for another schema is reported as exactly that,
    not as a flood of unknown-key errors. Every other problem is reported at once, one line
    per field path. With ``base_dir``, relative package, trusted-root and key paths are made
    relative to it (the config file's directory), so a config and its packages move together.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections, got {_describe(data)}",
            source=source,
            errors=[("", "not a mapping")],
        )
    if "schema" not in data:
        message = f"required: every config starts with 'schema: {SCHEMA_ID}' (§15)"
        raise ConfigError(
            f"{source}: schema: {message}", source=source, errors=[("schema", message)]
        )
    schema = data["schema"]
    if schema != SCHEMA_ID:
        message = f"unknown schema {schema!r}; this calculet reads {SCHEMA_ID!r}"
        raise ConfigError(
            f"{source}: schema: {message}", source=source, errors=[("schema", message)]
        )
    try:
        config = SchedulerConfig.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(error) for error in exc.errors(include_url=False)]
        lines = "\n".join(
            f"  {path}: {message}" if path else f"  {message}" for path, message in problems
        )
        count = len(problems)
        raise ConfigError(
            f"{source}: {count} invalid setting{'s' if count != 1 else ''}:\n{lines}",
            source=source,
            errors=problems,
        ) from None
    if base_dir is not None:
        config = _rebase_paths(config, base_dir)
    return config


def load_config(path: str | Path) -> SchedulerConfig:
    """Load and validate a ``calculet-scheduler/v1`` YAML file (§15).

    Errors (missing file, YAML syntax, duplicate keys, invalid settings) raise
    :class:`~calculet.errors.ConfigError` whose message starts with the file name and names
    each offending field path.
    """
    file = Path(path)
    data = read_yaml_file(file, ConfigError, "config")
    if data is None:
        raise ConfigError(
            f"{file}: the file is empty; it needs at least 'schema: {SCHEMA_ID}'",
            source=str(file),
            errors=[("schema", "required")],
        )
    return parse_config(data, source=str(file), base_dir=file.resolve().parent)


def cross_validate(
    config: SchedulerConfig,
    *,
    manifest_profiles: Collection[int],
    manifest_label: str = "the calbin manifest",
    max_inflight_supported: int = 1,
    ping_pong: bool = False,
    physical_devices_supported: int = 1,
    multi_profile_residency: bool = False,
    runtime_label: str = "CalRT 0.7.6",
) -> None:
    """Fail fast when the config asks for something the package or the device cannot do.

    Called at startup after the package is verified (§11 steps 1–3) and before any device
    configuration (R17.1.6). Inputs are plain values so this module depends neither on the
    manifest model nor on the adapter: ``manifest_profiles`` is the set of compiled batches
    in the verified manifest; the other flags come from the runtime's capability contract
    (``calculet.adapters.calrt.DeviceCapabilities``): ``max_inflight_supported`` ←
    ``max_inflight_jobs.value``, ``ping_pong`` ← ``ping_pong.value``,
    ``multi_profile_residency`` ← ``multi_profile_residency.value``,
    ``physical_devices_supported`` ← ``physical_devices_per_process.value``.

    * every requested profile must be compiled in the manifest (§2, §15; R2.7, R15.18, R15.19);
    * several profiles need a runtime that keeps several profiles resident (§8, R8.4);
    * ``max_inflight: 2`` needs the ping/pong capability and an in-flight depth of 2 (§14, R1.3);
    * more than one physical device needs a runtime that supports it (§3, R1.8).

    All problems are reported together in one :class:`ConfigError`.
    """
    compiled = sorted(set(manifest_profiles))
    problems: list[tuple[str, str]] = []
    if not compiled:
        problems.append(
            ("batch.profiles", f"{manifest_label} declares no compiled batch profile at all")
        )
    else:
        for profile in config.batch.profiles:
            if profile not in compiled:
                problems.append(
                    (
                        "batch.profiles",
                        f"profile {profile} (B{profile}) is not compiled in {manifest_label} "
                        f"(compiled batches: {compiled}); compiled_batch comes only from a "
                        "validated calbin and cannot be added by configuration (§2, §15)",
                    )
                )
    if len(config.batch.profiles) > 1 and not multi_profile_residency:
        problems.append(
            (
                "batch.profiles",
                f"{list(config.batch.profiles)} needs several profiles resident at once, which "
                f"{runtime_label} does not offer; configure one profile per instance and route "
                "between instance pools (§8)",
            )
        )
    inflight = config.executor.max_inflight
    if inflight > max_inflight_supported:
        problems.append(
            (
                "executor.max_inflight",
                f"{inflight} jobs in flight requested, but {runtime_label} supports at most "
                f"{max_inflight_supported} (§14)",
            )
        )
    if inflight == 2 and not ping_pong:
        problems.append(
            (
                "executor.max_inflight",
                f"2 needs the ping/pong capability, which {runtime_label} / {manifest_label} "
                "does not offer; use 1 (§14, R1.3)",
            )
        )
    devices = config.executor.physical_devices
    if devices > physical_devices_supported:
        problems.append(
            (
                "executor.physical_devices",
                f"{devices} physical devices requested, but {runtime_label} drives at most "
                f"{physical_devices_supported} per process; run one process per board behind a "
                "load balancer (§3, R1.8)",
            )
        )
    if problems:
        lines = "\n".join(f"  {path}: {message}" for path, message in problems)
        raise ConfigError(
            f"configuration does not match {manifest_label} / {runtime_label}:\n{lines}",
            errors=problems,
        )


def config_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of ``calculet-scheduler/v1``, with the YAML key names.

    The field descriptions cite the spec, so the generated reference document needs no
    second, hand-written description of the configuration.
    """
    schema = SchedulerConfig.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "calculet-scheduler/v1"
    schema["description"] = "Calculet scheduler configuration (spec §15)."
    schema["properties"]["schema"]["const"] = SCHEMA_ID
    return schema


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _rebase_paths(config: SchedulerConfig, base_dir: Path) -> SchedulerConfig:
    def rebase(path: Path) -> Path:
        return path if path.is_absolute() else base_dir / path

    trust = config.trust.model_copy(
        update={
            "trusted_roots": tuple(rebase(p) for p in config.trust.trusted_roots),
            "trusted_keys_dir": (
                rebase(config.trust.trusted_keys_dir)
                if config.trust.trusted_keys_dir is not None
                else None
            ),
        }
    )
    models = tuple(m.model_copy(update={"package": rebase(m.package)}) for m in config.models)
    return config.model_copy(update={"trust": trust, "models": models})


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, int | float):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if part == "[key]":
            path += " (key)"
        elif isinstance(part, int):
            path += f"[{part}]"
        elif path:
            path += f".{part}"
        else:
            path = str(part)
    return path


def _join(path: str, field: str) -> str:
    if not path:
        return field
    return path + field if field.startswith("[") else f"{path}.{field}"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The pydantic model validating the mapping at ``loc`` (to list its allowed keys)."""
    model: type[BaseModel] | None = SchedulerConfig
    annotation: Any = None
    for part in loc:
        if isinstance(part, int):
            if annotation is None:
                return None
            model = _unwrap_model(annotation)
            annotation = None
            continue
        if model is None:
            return None
        field = next(
            (f for name, f in model.model_fields.items() if (f.alias or name) == part), None
        )
        if field is None:
            return None
        annotation = field.annotation
        model = _unwrap_model(annotation)
    return model


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


_TYPE_NAMES: Final = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a path string",
}


def _format_error(error: Mapping[str, Any]) -> tuple[str, str]:
    """Turn one pydantic error into ``(field path, message a person can act on)``."""
    loc: tuple[int | str, ...] = tuple(error["loc"])
    kind: str = error["type"]
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    given = error.get("input")
    path = _loc_to_path(loc)
    if kind == "value_error":
        problem = ctx.get("error")
        if isinstance(problem, _FieldProblem):
            return _join(path, problem.field), problem.message
        text = str(problem) if problem is not None else str(error["msg"])
        return path, text.removeprefix("Value error, ")
    if kind == "missing":
        return path, "required field is missing"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        if model is None:
            return path, "unknown key"
        allowed = [f.alias or name for name, f in model.model_fields.items()]
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return path, f"unknown key{suggestion} (allowed: {', '.join(allowed)})"
    if kind == "greater_than":
        return path, f"must be > {ctx['gt']}, got {given!r}"
    if kind == "greater_than_equal":
        return path, f"must be >= {ctx['ge']}, got {given!r}"
    if kind == "less_than":
        return path, f"must be < {ctx['lt']}, got {given!r}"
    if kind == "less_than_equal":
        return path, f"must be <= {ctx['le']}, got {given!r}"
    if kind == "too_short":
        if ctx.get("min_length") == 1:
            return path, "must not be empty"
        return path, f"must have at least {ctx.get('min_length')} items"
    if kind == "too_long":
        return path, f"must have at most {ctx.get('max_length')} items"
    if kind == "string_too_short":
        return path, "must not be empty"
    if kind == "string_pattern_mismatch":
        return path, f"must match {ctx.get('pattern')}, got {_describe(given)}"
    if kind in _TYPE_NAMES:
        return path, f"must be {_TYPE_NAMES[kind]}, got {_describe(given)}"
    return path, str(error["msg"])
