"""Batching, the executor, recovery and monitoring: how work reaches the device (§2, §3, §7.2,
§8, §12, §14).

Why this exists: these sections only *request* what the device does. ``batch.profiles`` exist
only if the verified calbin compiles them and ``executor.max_inflight: 2`` only with the ping/pong
capability (DESIGN principle 8); :func:`calculet.config.cross_validate` checks that at startup
(R2.7, R15.19). The §14 degrade triggers the spec leaves unquantified are set here (ambiguity 17).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Annotated, Final, Literal

from pydantic import Field, Strict, field_validator, model_validator

from calculet.config.tracing import TracingConfig
from calculet.config.base import (
    UINT16_MAX,
    FieldProblem,
    NonNegInt,
    PosFloat,
    PosInt,
    Section,
    StrictBool,
)

__all__ = ["BatchConfig", "DegradeConfig", "ExecutorConfig", "MonitoringConfig", "RecoveryConfig"]

_DEFAULT_SELECT_THRESHOLDS: Final[Mapping[int, int]] = types.MappingProxyType(
    {16: 12, 8: 6, 4: 3}
)

ProfileSize = Annotated[int, Strict(), Field(gt=0, le=UINT16_MAX)]


class BatchConfig(Section):
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
        Annotated[int, Strict(), Field(gt=1, le=UINT16_MAX)],
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
    deadline_order: Literal["on_time", "at_risk", "strict"] = Field(
        "on_time",
        description="§7.2 item 2 'prefer the earliest deadline'. 'on_time' (issue #13): admission "
        "accepts only what the shared-device finish estimate says can finish (429 with a computed "
        "Retry-After otherwise); under overload the Moore-Hodgson selection keeps the most "
        "requests that can finish on time and ends the rest early; where more sequences hold KV than "
        "a step decodes (B1) the kept requests decode by deadline (the order admission proved "
        "feasible, ties by the fair decode tag); with an admission.itl_target_ms, or where every "
        "sequence is in every step (B16 with 16), only those whose fair-share finish is past "
        "their deadline go by deadline and the rest rotate. 'at_risk' orders by deadline only the candidates whose deadline is within "
        "deadline_slack x (their own remaining tokens x measured step time), ahead of the rest, "
        "which rotate; 'strict' orders every candidate by deadline (with the 120 s default "
        "deadline, concurrent streams then run one after another on B1).",
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
            raise FieldProblem(
                "select_thresholds",
                f"no threshold for profile(s) {missing}; §8 selection needs a minimum ready "
                "count for every profile larger than 1",
            )
        previous: tuple[int, int] | None = None
        for size in sorted(self.select_thresholds):
            threshold = self.select_thresholds[size]
            if previous is not None and threshold < previous[1]:
                raise FieldProblem(
                    "select_thresholds",
                    f"threshold of profile {size} ({threshold}) is below that of the smaller "
                    f"profile {previous[0]} ({previous[1]}); thresholds must not decrease as "
                    "the batch grows (§8)",
                )
            previous = (size, threshold)
        return self


class DegradeConfig(Section):
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


class ExecutorConfig(Section):
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
            raise FieldProblem(
                "fixed_engine",
                "cannot be true with max_inflight 2: two jobs in flight need two engines "
                "(ping and pong, §14)",
            )
        return self


class RecoveryConfig(Section):
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


class MonitoringConfig(Section):
    """Run-time monitoring of the declared machines' invariants (DESIGN, "declare once")."""

    invariants: StrictBool = Field(
        True,
        description="Check the declared invariants after transitions at run time (on by default; how "
        "many transitions: sample_every).",
    )
    sample_every: Annotated[int, Strict()] = Field(
        256, ge=1,
        description="Check one transition (and one engine tick's joint and KV-pool checks) in this many, drawn "
        "at random (1: every one). 256 by default: issue #20's figures (at 4c31c56, 2026-12-01), 16 HTTP streams on "
        "the null device, 0.90 ms CPU per token with monitors off, 1.23 at 1/256, 2.11 at 1/16; the test suite checks "
        "every one.",
    )
    tracing: TracingConfig = Field(
        default_factory=TracingConfig,
        description="OpenTelemetry request traces, exported with OTLP when an endpoint is set (off by default).",
    )
