"""A whole ``calculet-scheduler/v1`` file (§15): the sections and the checks across them.

Why this exists: the sections (admission, queues, batch, executor, recovery, monitoring,
tenants, models, trust, server) each validate themselves; what only the whole file can check —
distinct tenants and key hashes, distinct aliases, an admission budget the executor can honour,
a served alias that is configured — lives here, next to the JSON Schema the spec documents are
generated from (``config_json_schema``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, Strict, field_validator, model_validator

from calculet.config.admission import AdmissionConfig, CapacityBudget, QueuesConfig
from calculet.config.base import SCHEMA_ID, FieldProblem, LabelName, Section, unknown_schema
from calculet.config.execution import (
    BatchConfig,
    ExecutorConfig,
    MonitoringConfig,
    RecoveryConfig,
)
from calculet.config.service import (
    DeviceConfig,
    ModelEntry,
    ServerConfig,
    TenantConfig,
    TrustConfig,
    default_tenants,
)

__all__ = ["SchedulerConfig", "config_json_schema"]


class SchedulerConfig(Section):
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
        default_factory=default_tenants,
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
    device: DeviceConfig = Field(
        default_factory=DeviceConfig, description="The device plug-in and its conformance evidence (#18)."
    )

    @field_validator("schema_id")
    @classmethod
    def _known_schema(cls, value: str) -> str:
        if value != SCHEMA_ID:
            raise ValueError(unknown_schema(value))
        return value

    @field_validator("tenants", mode="before")
    @classmethod
    def _empty_tenants_mean_default(cls, value: object) -> object:
        if value is None or (isinstance(value, list | tuple) and len(value) == 0):
            return default_tenants()
        return value

    @field_validator("tenants")
    @classmethod
    def _tenants_distinct(cls, value: tuple[TenantConfig, ...]) -> tuple[TenantConfig, ...]:
        seen_names: dict[str, int] = {}
        seen_keys: dict[str, int] = {}
        keyless: list[str] = []
        for index, tenant in enumerate(value):
            if tenant.name in seen_names:
                raise FieldProblem(
                    f"[{index}].name",
                    f"duplicate tenant name {tenant.name!r} "
                    f"(also tenants[{seen_names[tenant.name]}])",
                )
            seen_names[tenant.name] = index
            if tenant.api_key_sha256 is None:
                keyless.append(tenant.name)
            elif tenant.api_key_sha256 in seen_keys:
                raise FieldProblem(
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
                raise FieldProblem(
                    f"[{index}].alias",
                    f"duplicate model alias {entry.alias!r} (also models[{seen[entry.alias]}])",
                )
            seen[entry.alias] = index
        return value

    @model_validator(mode="after")
    def _cross_section(self) -> SchedulerConfig:
        jobs = self.admission.max_inflight_jobs
        if jobs is not None and jobs > self.executor.max_inflight:
            raise FieldProblem(
                "admission.max_inflight_jobs",
                f"must be <= executor.max_inflight ({self.executor.max_inflight}); the budget "
                "cannot promise more jobs than the executor runs",
            )
        if self.models and self.model_alias not in {m.alias for m in self.models}:
            raise FieldProblem(
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
