"""The CalRT contract types: return codes, error mapping, capability tiers, profiles, result checks."""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import pytest

from calculet.adapters.calrt import (
    Anomaly,
    BatchProfile,
    BufferHandle,
    BufferKind,
    Capability,
    CcuFault,
    ContextOp,
    ContextOps,
    ContextOpSupport,
    DecodeJob,
    DeviceAlreadyExists,
    DeviceBusy,
    DeviceCapabilities,
    DeviceInvalidArgument,
    DeviceInvalidState,
    DeviceOutOfMemory,
    DeviceTimeout,
    DmaUnknown,
    EvidenceSource,
    EvidenceTier,
    InactiveLanePolicy,
    JobBuffers,
    JobId,
    JobKind,
    JobResult,
    JobTicket,
    KvLayoutDescriptor,
    KvManagerMode,
    LaneResult,
    MaskContract,
    OperationNotSupported,
    PrimitiveType,
    ReturnCode,
    StatusCounters,
    VendorError,
    error_for,
    map_exceptions,
    profile_tier,
    rc_of,
    verify_result,
)
from calculet.errors import (
    BadRequest,
    CalculetError,
    CapacityExhausted,
    DefinitionError,
    DeviceFault,
    NotSupported,
)
from calculet.machines.job import JobEngine

LAYOUT = KvLayoutDescriptor(n_layers=2, n_kv_heads=4, head_dim=16, dtype=PrimitiveType.FP64, block_tokens=16,
                            order="layer,token,head,dim")


def policy(mask: MaskContract = MaskContract.TENSOR, fill: int = -1) -> InactiveLanePolicy:
    return InactiveLanePolicy(mask=mask, kv_manager_mode=KvManagerMode.PER_SEQUENCE, inactive_writes_kv=False,
                              inactive_logits_returned=False, fill_token=fill)


def profile(batch: int, mask: MaskContract = MaskContract.TENSOR) -> BatchProfile:
    return BatchProfile(exact_submodel="m", compiled_batch=batch, max_seq=256, token_dtype=PrimitiveType.INT32,
                        logit_dtype=PrimitiveType.FP32, inactive_policy=policy(mask), kv_layout=LAYOUT, tensors=())


@pytest.mark.req("R19.2")
def test_return_codes_are_a_closed_enum_with_ok_zero() -> None:
    assert ReturnCode.OK == 0 and not ReturnCode.OK
    names = {rc.name for rc in ReturnCode}
    assert {"OK", "INVALID_ARGUMENT", "OUT_OF_MEMORY", "DEVICE_BUSY", "TIMEOUT", "CCU_FAULT", "DMA_UNKNOWN",
            "NOT_SUPPORTED"} <= names
    assert {rc for rc in ReturnCode if rc.is_device_fault} == {ReturnCode.TIMEOUT, ReturnCode.CCU_FAULT,
                                                               ReturnCode.DMA_UNKNOWN}


@pytest.mark.req("R19.2")
@pytest.mark.parametrize(("rc", "cls", "family"), [
    (ReturnCode.INVALID_ARGUMENT, DeviceInvalidArgument, DefinitionError),
    (ReturnCode.ALREADY_EXISTS, DeviceAlreadyExists, DefinitionError),
    (ReturnCode.OUT_OF_MEMORY, DeviceOutOfMemory, CapacityExhausted),
    (ReturnCode.NOT_SUPPORTED, OperationNotSupported, NotSupported),
    (ReturnCode.DEVICE_BUSY, DeviceBusy, DeviceFault),
    (ReturnCode.TIMEOUT, DeviceTimeout, DeviceFault),
    (ReturnCode.CCU_FAULT, CcuFault, DeviceFault),
    (ReturnCode.DMA_UNKNOWN, DmaUnknown, DeviceFault),
    (ReturnCode.INVALID_STATE, DeviceInvalidState, DeviceFault),
])
def test_every_failure_code_maps_to_one_calculet_error_carrying_the_code(
        rc: ReturnCode, cls: type[CalculetError], family: type[CalculetError]) -> None:
    err = error_for(rc, "boom", job=7)
    assert isinstance(err, cls) and isinstance(err, family)
    assert rc_of(err) is rc and err.context["rc"] is rc and err.context["job"] == 7


@pytest.mark.req("R19.2")
def test_every_non_ok_code_has_a_mapping_and_ok_has_none() -> None:
    for rc in ReturnCode:
        if rc is ReturnCode.OK:
            with pytest.raises(DefinitionError):
                error_for(rc, "x")
        else:
            assert rc_of(error_for(rc, "x")) is rc


@pytest.mark.req("R19.2")
def test_map_exceptions_is_the_only_boundary_for_vendor_failures() -> None:
    with pytest.raises(DeviceTimeout) as caught:
        with map_exceptions("Wait", job=3):
            raise VendorError(ReturnCode.TIMEOUT, "job 3 not done")
    assert caught.value.rc is ReturnCode.TIMEOUT and "Wait: job 3 not done" in str(caught.value)
    assert isinstance(caught.value.__cause__, VendorError)

    with pytest.raises(DeviceFault) as other:
        with map_exceptions("Submit"):
            raise KeyError("vendor internals")
    assert other.value.rc is ReturnCode.INTERNAL and not isinstance(other.value, VendorError)

    original = BadRequest("already ours")
    with pytest.raises(BadRequest) as passthrough:
        with map_exceptions("Submit"):
            raise original
    assert passthrough.value is original


@pytest.mark.req("R7.3.1", "R7.3.2")
def test_inactive_lane_policy_has_no_defaults_and_refuses_token_zero() -> None:
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(InactiveLanePolicy))
    with pytest.raises(TypeError):
        InactiveLanePolicy(mask=MaskContract.TENSOR, kv_manager_mode=KvManagerMode.PER_SEQUENCE,  # type: ignore[call-arg]
                           inactive_writes_kv=False, fill_token=-1)
    with pytest.raises(DefinitionError, match="token 0"):
        policy(fill=0)
    with pytest.raises(DefinitionError):
        InactiveLanePolicy(mask=MaskContract.TENSOR, kv_manager_mode=KvManagerMode.PER_SEQUENCE,
                           inactive_writes_kv=None, inactive_logits_returned=False, fill_token=-1)  # type: ignore[arg-type]


@pytest.mark.req("R7.3.3")
def test_batched_profile_without_mask_contract_is_not_usable() -> None:
    assert profile(1, MaskContract.NONE).usable
    b4 = profile(4, MaskContract.NONE)
    assert not b4.usable and "mask contract" in (b4.unusable_reason or "")
    assert profile(4, MaskContract.TENSOR).usable and profile(8, MaskContract.CSR).usable


@pytest.mark.req("R2.5")
def test_batch_profile_has_the_spec_fields() -> None:
    names = [f.name for f in dataclasses.fields(BatchProfile)]
    assert names[:7] == ["exact_submodel", "compiled_batch", "max_seq", "token_dtype", "logit_dtype",
                         "inactive_policy", "kv_layout"]
    hints = typing.get_type_hints(BatchProfile)
    assert hints["compiled_batch"] is int and hints["max_seq"] is int
    assert hints["token_dtype"] is PrimitiveType and hints["inactive_policy"] is InactiveLanePolicy
    with pytest.raises(DefinitionError):
        dataclasses.replace(profile(1), compiled_batch=0x10000)
    assert LAYOUT.bytes_per_token == 2 * 2 * 4 * 16 * 8


@pytest.mark.req("R1.4", "R20.7")
def test_profile_tiers_follow_the_spec() -> None:
    assert profile_tier(1) is EvidenceTier.C0
    assert {profile_tier(b) for b in (4, 8, 16)} == {EvidenceTier.C3}
    assert profile(16).tier is EvidenceTier.C3


@pytest.mark.req("R20.7")
def test_simulated_capability_cannot_claim_a_better_tier_than_the_spec() -> None:
    with pytest.raises(DefinitionError, match="only vendor or measured evidence"):
        Capability("ping_pong", True, EvidenceTier.C0, EvidenceSource.SIMULATED, "§14")
    sim = Capability.rated("ping_pong", True, EvidenceSource.SIMULATED)
    assert sim.tier is EvidenceTier.C1_C2 and sim.simulated and not sim.proved
    vendor = Capability("ping_pong", True, EvidenceTier.C0, EvidenceSource.VENDOR, "vendor doc")
    assert vendor.proved
    with pytest.raises(DefinitionError, match="unknown capability"):
        Capability.rated("teleport", True)  # type: ignore[arg-type]


@pytest.mark.req("R1.2", "R1.3", "R1.7", "R13.2.2", "R13.3.4", "R20.7")
def test_current_product_contract_enables_nothing_unproven() -> None:
    caps = DeviceCapabilities.calrt_076_current()
    assert caps.max_inflight_jobs.value == 1 and not caps.ping_pong.value
    assert not caps.model_coresidency.value and not caps.multi_profile_residency.value
    assert not caps.incremental_prefill.value and not caps.lane_failure_isolation.value
    assert not caps.chiplet_scoped_models.value and caps.configure_device_global.value
    assert not caps.reset_configuration_verified.value
    assert caps.simulated_enabled() == ()
    rows = {r[0]: r for r in caps.rows()}
    assert rows["ping_pong"][2] == "C1/C2" and rows["model_coresidency"][2] == "C3"
    assert rows["physical_devices_per_process"][1:3] == ("1", "C4")


@pytest.mark.req("R9.3.4", "R9.3.5", "R9.3.6", "R9.3.7", "R9.3.8", "R9.3.9")
def test_context_ops_table_matches_section_9_3() -> None:
    ops = ContextOps.calrt_076()
    assert ops.support(ContextOp.APPEND_DECODE).value is ContextOpSupport.SUPPORTED
    assert ops.support(ContextOp.REMOVE_TAIL).value is ContextOpSupport.GATED
    assert ops.support(ContextOp.SHIFT).value is ContextOpSupport.GATED
    for op in (ContextOp.COPY_PREFIX, ContextOp.KEEP_ONE_SEQ, ContextOp.POSITION_ADD_DIV,
               ContextOp.SAVE_LOAD_SESSION):
        assert ops.support(op).value is ContextOpSupport.EMPTY
    with pytest.raises(DefinitionError, match="empty implementation"):
        dataclasses.replace(ops, copy_prefix=Capability.rated("ctx.copy_prefix", ContextOpSupport.SUPPORTED,
                                                                EvidenceSource.SIMULATED))


@pytest.mark.req("R1.3", "R14.1")
def test_capability_contract_rejects_impossible_inflight_combinations() -> None:
    caps = DeviceCapabilities.calrt_076_current()
    with pytest.raises(DefinitionError, match="needs ping/pong"):
        dataclasses.replace(caps, max_inflight_jobs=Capability.rated("max_inflight_jobs", 2))
    with pytest.raises(DefinitionError, match="two engines"):
        dataclasses.replace(caps, ping_pong=Capability.rated("ping_pong", True, EvidenceSource.SIMULATED),
                            max_inflight_jobs=Capability.rated("max_inflight_jobs", 3, EvidenceSource.SIMULATED))
    with pytest.raises(DefinitionError, match="one physical device"):
        dataclasses.replace(caps, physical_devices_per_process=Capability("physical_devices_per_process", 2,
                                                                          EvidenceTier.C0, EvidenceSource.VENDOR, ""))


def _decode_job(seqs: tuple[int, ...], valid: tuple[int, ...], generation: int = 5) -> DecodeJob:
    handle = BufferHandle(1, BufferKind.INPUT, JobKind.DECODE, len(seqs), 64)
    out = BufferHandle(2, BufferKind.OUTPUT, JobKind.DECODE, len(seqs), 64)
    return DecodeJob(generation=generation, calbin_id=1, compiled_batch=len(seqs), engine=JobEngine.PING,
                     buffers=JobBuffers(handle, out), seq_ids=seqs, token_ids=np.array([3] * len(seqs)),
                     positions=np.zeros(len(seqs), dtype=np.int32), lane_valid=np.array(valid, dtype=np.uint8))


def _result(job: DecodeJob, lanes: list[tuple[int, int, bool]], counters: StatusCounters, job_id: int = 9,
            generation: int | None = None) -> JobResult:
    return JobResult(job_id=JobId(job_id), generation=job.generation if generation is None else generation,
                     kind=JobKind.DECODE, engine=JobEngine.PING, calbin_id=1, compiled_batch=job.compiled_batch,
                     rc=ReturnCode.OK,
                     lanes=tuple(LaneResult(lane, seq, valid, ReturnCode.OK, 0, 1, None, 1) for lane, seq, valid in lanes),
                     counters=counters, submitted_at=0.0, completed_at=1.0, output_buffer=job.buffers.output)


@pytest.mark.req("R4.8", "R7.4.2", "R14.5", "R14.6")
def test_verify_result_finds_wrong_job_generation_crosstalk_and_counters() -> None:
    job = _decode_job((11, 12, 0, 0), (1, 1, 0, 0))
    ticket = JobTicket(JobId(9), 5, JobKind.DECODE, JobEngine.PING, 1, 0.0)
    good_lanes = [(0, 11, True), (1, 12, True), (2, 0, False), (3, 0, False)]
    good = StatusCounters(engine_sequence=4, lanes_valid=2, tokens_processed=2, kv_tokens_written=2)
    assert verify_result(job, ticket, _result(job, good_lanes, good), previous_engine_sequence=3).ok

    swapped = [(1, 12, True), (0, 11, True), (2, 0, False), (3, 0, False)]
    check = verify_result(job, ticket, _result(job, swapped, good))
    assert check.has(Anomaly.CROSSTALK) and not check.has(Anomaly.COUNTERS)

    bad = StatusCounters(engine_sequence=3, lanes_valid=3, tokens_processed=2, kv_tokens_written=2)
    check = verify_result(job, ticket, _result(job, good_lanes, bad), previous_engine_sequence=3)
    assert check.has(Anomaly.COUNTERS) and len([a for a, _ in check.anomalies if a is Anomaly.COUNTERS]) == 2

    stale = verify_result(job, ticket, _result(job, good_lanes, good, job_id=8, generation=4))
    assert stale.has(Anomaly.WRONG_JOB) and stale.has(Anomaly.WRONG_GENERATION)


@pytest.mark.req("R7.1.2")
def test_decode_job_arrays_must_span_the_compiled_batch() -> None:
    job = _decode_job((1, 0, 0, 0), (1, 0, 0, 0))
    with pytest.raises(DefinitionError, match="compiled_batch is 4"):
        job._replace(lane_valid=np.array([1, 0], dtype=np.uint8))
    assert job.active_lanes == (0,)


@pytest.mark.parametrize(("batch", "chunk", "needle"), [
    (1, 0, r"must be an int in \[1, max_seq=256\]"),
    (1, 257, r"must be an int in \[1, max_seq=256\]"),
    (1, True, "must be an int"),
    (4, 16, "only the B1 profile"),
])
def test_prefill_chunk_size_is_a_b1_only_positive_int_within_the_context(batch: int, chunk: object,
                                                                         needle: str) -> None:
    """Prefill jobs are B1-shaped (§6), so only B1 may carry the incremental-prefill chunk size."""
    assert profile(1).prefill_chunk_tokens is None
    assert dataclasses.replace(profile(1), prefill_chunk_tokens=256).prefill_chunk_tokens == 256
    with pytest.raises(DefinitionError, match=needle):
        dataclasses.replace(profile(batch), prefill_chunk_tokens=chunk)
