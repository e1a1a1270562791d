"""Issue #17: specs/traceability.md credits an R-id only to a proof or test that states it."""

from __future__ import annotations

from calculet.invariants.traceability import proof_references


def test_requirements_are_credited_only_to_properties_that_state_them():
    refs = proof_references()
    # R7.2.1 (excluded from selection), R12.5 (KV freed, pools destroyed) and R4.7 (promise set and
    # stream close once) were credited to invariants about something else.
    assert "RequestMachine.decoding_has_budget" not in refs.get("R7.2.1", [])
    assert "ModelMachine.unloading_is_idle" not in refs.get("R12.5", [])
    assert "DeviceJobMachine.delivered_only_when_completed" not in refs.get("R4.7", [])
    # ... and are now credited where their text is what the property states
    assert "ModelMachine.unloading_is_idle" in refs["R12.3"]          # unload waits for the pinned requests
    assert "RequestMachine.decoding_has_budget" in refs["R5.1.4"]     # never exceeds the context
    # Ready again only with no job in doubt: the jobs are the jobs table's, so it is the joint system's (issue #20)
    assert "GenerationJobSystem.job_in_doubt_only_while_recovering" in refs["R12.10"]
    assert "GenerationJobSystem.job_on_the_device_keeps_its_generations_buffers" in refs["R12.10"]
    assert "GenerationJobSystem.jobs_only_on_a_live_generation" in refs["R12.3"]  # ... and for its jobs


def test_the_generation_couplings_are_credited_to_what_they_state():
    """#17: the counters (R10.2), the unload's wait (R12.3), sequences freed before the pools
    (R12.5), one engine per job (R14.3) and no job in doubt on a Ready generation (R12.10) are
    credited to the joint properties that state them — and nothing else is credited to those."""
    refs = proof_references()
    assert refs["R10.2"] == ["GenerationRequestSystem.active_requests_are_the_pinned_live_requests",
                             "GenerationRequestSystem.counted_exactly_while_pinned_and_live",
                             "GenerationJobSystem.counted_exactly_while_on_the_device"]
    assert refs["R12.5"] == ["GenerationRequestSystem.holding_request_keeps_its_generations_buffers"]
    assert "GenerationRequestSystem.requests_pinned_only_to_a_live_generation" in refs["R12.3"]
    assert "GenerationJobSystem.one_engine_per_job_on_the_device" in refs["R14.3"]
    assert "GenerationJobSystem.job_in_doubt_only_while_recovering" in refs["R12.10"]
    # R14.4 (each in-flight job its own KV transaction) only to the device jobs × KV lanes system
    assert refs["R14.4"] and all(r.startswith("JobLaneSystem.") for r in refs["R14.4"])


def test_every_credited_proof_names_a_catalogued_requirement():
    from calculet.invariants.traceability import catalogue
    known = {r.id for r in catalogue()}
    assert set(proof_references()) <= known
