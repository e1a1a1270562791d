"""The four lifecycles: the spec's enumerations, refusals that change nothing, key paths."""

from __future__ import annotations

import pytest

from calculet.machines import ALL_MACHINES, KvSequenceMachine, ModelMachine, RequestMachine, DeviceJobMachine
from calculet.machines.errors import TransitionNotAllowed
from calculet.machines.request import FinishReason
from tests.machine_support import PARAMS, arg_sets, explore, key


@pytest.mark.req("R2.2", "R2.3")
def test_request_states_are_the_spec_enumeration_in_order():
    d = RequestMachine.definition
    assert [s for s in d.states] == [
        "new", "waiting_model", "waiting_admission", "prefill_ready", "prefill_running",
        "decode_ready", "decode_running", "finishing", "completed", "cancelled", "failed"]
    assert d.terminal == {"completed", "cancelled", "failed"}


@pytest.mark.req("R9.1.1")
def test_kv_sequence_states_are_the_spec_enumeration():
    """§9.1 KvSequenceState (R9.1.1): exactly the six values, in order. The machine has every one but Updating,
    which the declared projection derives: a working lane with its step open (#20). Mutants caught: the
    projection ignoring the open step (Updating never reported), Updating placed elsewhere, Unknown with its step
    open reported Updating."""
    from calculet.machines.kv_sequence import KV_SEQUENCE_STATE, KvSequenceState
    assert [s.value for s in KvSequenceState] == ["free", "reserved", "active", "updating", "unknown", "releasing"]
    assert list(KV_SEQUENCE_STATE.states) == [s.value for s in KvSequenceState]
    assert list(KvSequenceMachine.definition.states) == [s for s in KvSequenceState if s != "updating"]
    of = KV_SEQUENCE_STATE.of
    assert [of(s, True) for s in KvSequenceMachine.definition.states] == [
        "free", "updating", "updating", "unknown", "releasing"]
    assert [of(s, False) for s in KvSequenceMachine.definition.states] == list(KvSequenceMachine.definition.states)
    assert all(isinstance(of(s, o), KvSequenceState) for s in KvSequenceMachine.definition.states for o in (0, 1))


@pytest.mark.req("R10.1")
def test_model_states_are_the_spec_enumeration_in_order():
    assert list(ModelMachine.definition.states) == [
        "unloaded", "validating", "configuring", "warming", "ready", "draining", "unloading",
        "recovering", "failed"]


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_every_refused_event_leaves_state_and_variables_unchanged(machine):
    """Every reachable configuration (small domain) × every event × candidate arguments."""
    refused = 0
    for params in PARAMS[machine.definition.name]:
        for inst in explore(machine, params):
            for event in machine.definition.events:
                for args in arg_sets(machine, event, inst):
                    before = key(inst)
                    probe = inst.snapshot()
                    try:
                        probe.fire(event, **args)
                    except TransitionNotAllowed as exc:
                        refused += 1
                        assert key(probe) == before
                        assert exc.machine == machine.definition.name and exc.event == event
                        assert exc.state == inst.state
    assert refused > 50


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_unknown_event_and_bad_arguments_are_refused(machine):
    inst = machine.create(**PARAMS[machine.definition.name][0])
    before = key(inst)
    with pytest.raises(TransitionNotAllowed, match="unknown event"):
        inst.fire("no_such_event")
    for event, ev in machine.definition.events.items():
        if ev.args:
            with pytest.raises(TransitionNotAllowed):
                inst.fire(event)  # missing arguments
            with pytest.raises(TransitionNotAllowed):
                inst.fire(event, **{name: "x" for name in ev.args})  # wrong types
    assert key(inst) == before


@pytest.mark.req("R4.4", "R4.5")
def test_request_cancel_while_running_sets_a_flag_and_drains():
    r = RequestMachine.create(prompt_tokens=4, max_new_tokens=8, max_seq=32)
    r.fire("bind", gen=1)
    r.fire("admit")
    r.fire("submit_prefill", job=7)
    r.fire("cancel")
    assert r.state == "prefill_running" and r.cancel_requested
    r.fire("cancel")  # idempotent while draining
    with pytest.raises(TransitionNotAllowed):
        r.fire("prefill_done", job=6, ok=True, stop=False)  # stale job id
    assert r.fire("prefill_done", job=7, ok=True, stop=False) == "cancelled"
    assert r.finish_reason is FinishReason.CANCELLED and r.closes == 1


@pytest.mark.req("R4.4")
@pytest.mark.parametrize("path", [[], [("bind", {"gen": 1})], [("bind", {"gen": 1}), ("admit", {})]])
def test_request_cancel_before_running_completes_at_once(path):
    r = RequestMachine.create(prompt_tokens=4, max_new_tokens=8, max_seq=32)
    for event, args in path:
        r.fire(event, **args)
    assert r.fire("cancel") == "cancelled"
    with pytest.raises(TransitionNotAllowed):
        r.fire("cancel")  # terminal: the registry answers idempotently without firing


@pytest.mark.req("R9.2.5", "R9.2.6")
def test_kv_commit_only_after_success_and_unknown_is_quarantined():
    kv = KvSequenceMachine.create(max_seq=16, lane=2)
    kv.fire("reserve", seq=5, gen=1, tokens=10)
    assert kv.state == "reserved" and kv.committed_len == 0
    kv.fire("commit", tokens=4)
    assert kv.committed_len == 4
    with pytest.raises(TransitionNotAllowed):
        kv.fire("commit", tokens=7)  # past the reservation
    kv.fire("fault")
    assert kv.state == "unknown" and kv.committed_len == 4
    with pytest.raises(TransitionNotAllowed):
        kv.fire("reserve", seq=6, gen=1, tokens=1)
    kv.fire("recover")
    kv.fire("confirm_release")
    assert kv.state == "free"


@pytest.mark.req("R12.10")
def test_model_drain_deadline_with_jobs_goes_to_recovering_and_keeps_buffers():
    m = ModelMachine.create(generation=3)
    for event in ("load", "validated", "configured", "warmed"):
        m.fire(event)
    m.fire("drain", replace=False, inflight=1)  # one job on the device (the jobs table's count)
    with pytest.raises(TransitionNotAllowed):
        m.fire("drained", inflight=1)
    with pytest.raises(TransitionNotAllowed):  # the deadline matters only while a job is on the device
        m.fire("drain_deadline", inflight=0)
    assert m.fire("drain_deadline", inflight=1) == "recovering" and m.buffers
    with pytest.raises(TransitionNotAllowed):  # not while the job is still in doubt
        m.fire("recovered", inflight=1)
    assert m.fire("recovered", inflight=0) == "draining"


def test_device_job_delivers_once_and_quarantines_timeouts():
    j = DeviceJobMachine.create(job_id=9, generation=1, engine=DeviceJobMachine.definition.params["engine"].type.default, lanes=4)
    j.fire("submit")
    j.fire("timeout")
    assert j.buffers_held
    j.fire("quarantine")
    with pytest.raises(TransitionNotAllowed):
        j.fire("complete", ok=True)
    j.fire("reset_done")
    assert j.state == "failed" and not j.buffers_held and j.delivered == 0
