"""Admission and queues: who gets in, who waits, and in which queue (§5.1, §5.2, §5.3, §6).

Why this exists: these sections decide fairness and head-of-line blocking — the §5.1
``CapacityBudget``, the §5.2 outcomes, the §6 long-task quota (R6.11), the §6 WRR classes and
weights and the §5.3 WFQ cost weight (ambiguity 7, see :class:`QueuesConfig`). The values in
§15 are the defaults (ambiguity 18); fields §15 does not list have defaults documented on each
field (ambiguity 8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, model_validator

from calculet.config.base import UINT32_MAX, UINT64_MAX, FieldProblem, PosInt, Section

__all__ = ["AdmissionConfig", "CapacityBudget", "LongPrefillQuota", "QueuesConfig"]


class LongPrefillQuota(Section):
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


class AdmissionConfig(Section):
    """Admission limits (§5.1 ``CapacityBudget``, §5.2 outcomes, §6 long-task quota)."""

    max_waiting_requests: Annotated[PosInt, Field(le=UINT32_MAX)] = Field(
        128,
        description="Requests allowed to wait; beyond it RejectCapacity (429). §15, R15.3.",
    )
    max_waiting_prompt_tokens: Annotated[PosInt, Field(le=UINT64_MAX)] = Field(
        262_144,
        description="Prompt tokens allowed to wait; beyond it RejectCapacity (429). §15, R15.4.",
    )
    deadline_default_ms: PosInt = Field(
        120_000,
        description="Deadline of a request that gives none, in ms from creation (monotonic "
        "clock). §15, R15.5.",
    )
    max_sequences: Annotated[PosInt, Field(le=UINT32_MAX)] = Field(
        16,
        description="Active sequences (admitted, holding KV). §5.1 CapacityBudget.max_sequences. "
        "16 lets the largest §8 profile (B16) be filled; the KV budget still bounds it.",
    )
    max_kv_tokens: Annotated[PosInt, Field(le=UINT64_MAX)] | None = Field(
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

    ttft_target_ms: PosInt | None = Field(
        None,
        description="Time-to-first-token target (latency SLO, issue #13) of a tenant that sets "
        "none: with batch.deadline_order 'on_time' a request that would wait longer than this "
        "for its first token gets 429 at once. null = only the deadline bounds the wait.",
    )
    itl_target_ms: PosInt | None = Field(
        None,
        description="Inter-token-latency target (latency SLO, issue #13) of a tenant that sets "
        "none: with batch.deadline_order 'on_time' only as many streams enter decoding as the "
        "device serves within the smallest target among them (measured step time); the rest "
        "wait. null = no cap beyond the budget.",
    )

    miss_target: Annotated[float, Field(gt=0, lt=0.5)] = Field(
        0.005,
        description="With batch.deadline_order 'on_time': the share of admitted requests allowed to "
        "end past their deadline (issue #13 asks at most 1 %). Admission plans with a margin on "
        "the finish estimate that each late outcome raises and each on-time one lowers; it "
        "settles where this share of outcomes is late.",
    )
    initial_margin: Annotated[float, Field(ge=0, le=0.5)] = Field(
        0.2,
        description="With batch.deadline_order 'on_time': the admission margin before any outcome "
        "(admission plans as if device times were this fraction slower). 0.2 is about where the "
        "margin settled in the issue #13 overload runs; with no late outcome it decays to 0.",
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


class QueuesConfig(Section):
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
            raise FieldProblem(
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


@dataclass(frozen=True, slots=True)
class CapacityBudget:
    """The §5.1 ``CapacityBudget`` as configured (R5.1.1), with KV capacity resolved."""

    max_sequences: int
    max_kv_tokens: int
    max_waiting_requests: int
    max_waiting_prompt_tokens: int
    max_inflight_jobs: int
