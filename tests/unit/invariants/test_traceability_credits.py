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
    assert "ModelMachine.unloading_is_idle" in refs["R12.3"]          # unload waits for both counters
    assert "RequestMachine.decoding_has_budget" in refs["R5.1.4"]     # never exceeds the context
    assert "ModelMachine.ready_only_with_no_job_in_doubt" in refs["R12.10"]


def test_every_credited_proof_names_a_catalogued_requirement():
    from calculet.invariants.traceability import catalogue
    known = {r.id for r in catalogue()}
    assert set(proof_references()) <= known
