"""RequestRegistry (§4): the §4 interface, cancel in every state, terminal once, stale callbacks."""

from __future__ import annotations

import inspect

import pytest

from calculet.errors import BadRequest, NotFound
from calculet.machines import TransitionNotAllowed
from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.scheduling.registry import CallbackResult, CancelResult, RequestRegistry
from calculet.runtime.request import InferenceRequest
from tests.unit.runtime.runtime_support import CountingSink, Harness


def new_record(registry: RequestRegistry, prompt: int = 10, new: int = 3):
    sink = CountingSink()
    rec = registry.create(InferenceRequest(prompt, new), sink, max_seq=1024, arrival=0.0, deadline=120.0)
    return rec, sink


def drive_to(registry: RequestRegistry, rec, state: str) -> None:
    """Fire the events that take a fresh record to ``state`` (registry only; no scheduler)."""
    paths = {
        "new": [],
        "waiting_model": [("wait_model", {})],
        "waiting_admission": [("bind", {"gen": 1})],
        "prefill_ready": [("bind", {"gen": 1}), ("admit", {})],
        "prefill_running": [("bind", {"gen": 1}), ("admit", {}), ("submit_prefill", {"job": 5})],
        "decode_ready": [("bind", {"gen": 1}), ("admit", {}), ("submit_prefill", {"job": 5}),
                         ("prefill_done", {"job": 5, "ok": True, "stop": False})],
        "decode_running": [("bind", {"gen": 1}), ("admit", {}), ("submit_prefill", {"job": 5}),
                           ("prefill_done", {"job": 5, "ok": True, "stop": False}), ("submit_decode", {"job": 6})],
        "finishing": [("bind", {"gen": 1}), ("admit", {}), ("submit_prefill", {"job": 5}),
                      ("prefill_done", {"job": 5, "ok": True, "stop": True})],
    }
    for event, args in paths[state]:
        registry.fire(rec, event, **args)
    assert rec.state == state


@pytest.mark.req("R4.1", "R4.8")
def test_registry_interface_is_the_spec_one_and_callbacks_name_generation_and_job():
    for name in ("create", "cancel", "on_prefill_complete", "on_decode_complete", "finish"):
        assert callable(getattr(RequestRegistry, name))
    for name in ("on_prefill_complete", "on_decode_complete"):
        params = inspect.signature(getattr(RequestRegistry, name)).parameters
        assert params["generation"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["job_id"].kind is inspect.Parameter.KEYWORD_ONLY
    registry = RequestRegistry()
    rec, _ = new_record(registry)
    with pytest.raises(TypeError):
        registry.on_decode_complete(rec.request_id, ok=True, stop=False, token=1)  # type: ignore[call-arg]


def test_create_refuses_token_counts_below_one():
    registry = RequestRegistry()
    with pytest.raises(BadRequest):
        registry.create(InferenceRequest(0, 3), CountingSink(), max_seq=64, arrival=0, deadline=1)
    assert len(registry) == 0


@pytest.mark.req("R4.4", "R4.3")
@pytest.mark.parametrize("state", ["new", "waiting_model", "waiting_admission", "prefill_ready", "decode_ready",
                                   "finishing"])
def test_cancel_completes_at_once_outside_running(state):
    registry = RequestRegistry()
    rec, sink = new_record(registry)
    drive_to(registry, rec, state)
    result = registry.cancel(rec.request_id)
    assert result.result is CancelResult.CANCELLED
    assert result.outcome is not None and result.outcome.state == "cancelled"
    assert result.outcome.finish_reason is FinishReason.CANCELLED and result.outcome.http_status == 499
    assert sink.closes == 1
    # idempotent: again, and again — no transition, no second close
    for _ in range(3):
        again = registry.cancel(rec.request_id)
        assert again.result is CancelResult.ALREADY_TERMINAL and again.outcome == result.outcome
    assert sink.closes == 1
    assert rec.machine.closes == 1


@pytest.mark.req("R4.5", "R4.3")
@pytest.mark.parametrize("state,event", [("prefill_running", "prefill_done"), ("decode_running", "decode_done")])
def test_cancel_while_running_sets_a_flag_and_the_job_drains(state, event):
    registry = RequestRegistry()
    rec, sink = new_record(registry)
    drive_to(registry, rec, state)
    assert registry.cancel(rec.request_id).result is CancelResult.PENDING
    fired = rec.machine.last_transition
    assert registry.cancel(rec.request_id).result is CancelResult.PENDING
    assert rec.machine.last_transition is fired  # the repeated cancel fired nothing
    assert rec.state == state and rec.machine.cancel_requested and sink.closes == 0
    done = registry.on_decode_complete if event == "decode_done" else registry.on_prefill_complete
    cb = done(rec.request_id, generation=1, job_id=rec.job_id, ok=True, stop=False, token=42)
    assert cb.result is CallbackResult.APPLIED and cb.target == "cancelled"
    assert sink.tokens == []  # the drained job's output is discarded
    assert sink.outcome.state == "cancelled"


def test_cancel_of_an_unknown_request_is_not_found():
    with pytest.raises(NotFound):
        RequestRegistry().cancel(12345)


@pytest.mark.req("R4.6", "R4.7")
def test_terminal_state_and_close_happen_once_whatever_races():
    registry = RequestRegistry()
    rec, sink = new_record(registry)
    drive_to(registry, rec, "finishing")
    outcome = registry.finish(rec.request_id)
    assert outcome.state == "completed" and outcome.http_status == 200
    assert registry.finish(rec.request_id) == outcome
    assert registry.cancel(rec.request_id).result is CancelResult.ALREADY_TERMINAL
    assert registry.finish(rec.request_id, FinishReason.ERROR) == outcome
    assert sink.closes == 1 and sink.outcome == outcome


def test_finish_with_a_reason_that_does_not_fit_is_refused_and_changes_nothing():
    registry = RequestRegistry()
    rec, sink = new_record(registry)
    drive_to(registry, rec, "decode_ready")
    with pytest.raises(TransitionNotAllowed):
        registry.finish(rec.request_id, FinishReason.STOP)
    assert rec.state == "decode_ready" and sink.closes == 0
    assert registry.finish(rec.request_id, FinishReason.ERROR).state == "failed"


@pytest.mark.req("R4.9", "R4.8")
def test_a_decode_step_settles_its_current_lanes_and_counts_the_stale_ones():
    """``decode_done_each`` (one call per decode step, issue #20): lanes whose request has moved on or
    belongs to another job are stale (counted, nothing fired, None), the others deliver their token."""
    registry = RequestRegistry()
    recs = [new_record(registry) for _ in range(3)]
    for rec, _ in recs:
        drive_to(registry, rec, "decode_running")
    (a, sink_a), (b, sink_b), (c, sink_c) = recs
    registry.cancel(b.request_id)  # still decode_running with its cancel flag: the result is current
    job = a.job_id
    registry.fire(c, "decode_done", job=job, ok=True, stop=False)  # c moved on: its result is stale now
    targets = registry.decode_done_each([a, b, c], 1, job, [True, True, True], [False, False, False],
                                        [7, 8, 9], ["", "", ""])
    assert targets[0] == "decode_ready" and targets[2] is None
    assert targets[1] is not None and b.state != "decode_running"
    assert 7 in sink_a.tokens and 9 not in sink_c.tokens
    assert registry.statistics().stale_callbacks == 1
    every_current = registry.decode_done_each([], 1, job, [], [], [], [])
    assert every_current == []


@pytest.mark.req("R4.9", "R4.8")
def test_stale_callbacks_are_dropped_and_change_nothing():
    registry = RequestRegistry()
    rec, sink = new_record(registry)
    drive_to(registry, rec, "decode_running")
    before = (rec.state, rec.machine.values())
    for kwargs in ({"generation": 2, "job_id": rec.job_id}, {"generation": 1, "job_id": rec.job_id + 1}):
        cb = registry.on_decode_complete(rec.request_id, ok=True, stop=False, token=9, **kwargs)
        assert cb.result is CallbackResult.STALE
    # a prefill callback for a request that is decoding is stale too
    assert registry.on_prefill_complete(rec.request_id, generation=1, job_id=rec.job_id, ok=True, stop=False,
                                        token=9).result is CallbackResult.STALE
    assert (rec.state, rec.machine.values()) == before and 9 not in sink.tokens
    assert registry.statistics().stale_callbacks == 3


@pytest.mark.req("R4.9")
def test_stale_completion_after_timeout_still_reclaims_slot_and_lanes():
    h = Harness.build(sizes=(1,), lanes=2)
    rid = h.submit(prompt=8, new=5).request_id
    plan = h.step()
    assert isinstance(plan.work, PrefillWork)
    h.scheduler.submitted(plan.work.job_id)
    h.scheduler.job_timed_out(plan.work.job_id)
    assert h.state(rid) == "failed" and h.sinks[rid].outcome.finish_reason is FinishReason.ERROR
    assert len(h.scheduler.jobs) == 1                       # the slot stays held: the device may write
    assert h.kv.statistics().by_state["unknown"] == 1       # and the lane is quarantined
    assert h.step().work is None                            # so nothing else is submitted (in-flight 1)
    applied = h.complete(plan.work)                         # the late completion arrives
    assert applied.stale
    assert h.sinks[rid].tokens == [] and h.sinks[rid].closes == 1
    assert len(h.scheduler.jobs) == 0
    assert h.confirm_all() == 1 and h.scheduler.idle()


@pytest.mark.req("R4.9")
def test_duplicate_and_unknown_completions_are_stale():
    h = Harness.build(sizes=(1,), lanes=2)
    rid = h.submit(prompt=8, new=2).request_id
    plan = h.step()
    h.run(plan)
    assert h.complete(plan.work).stale   # the same completion again
    batch = h.next_decode()
    h.scheduler.submitted(batch.job_id)
    assert isinstance(batch, DecodeBatch)
    h.complete(batch)
    assert h.complete(batch).stale
    assert h.sinks[rid].closes == 1 and len(h.sinks[rid].tokens) == 2
    assert h.scheduler.statistics().stale_completions == 2


@pytest.mark.req("R4.2")
def test_request_fields_change_only_through_the_machine():
    registry = RequestRegistry()
    rec, _ = new_record(registry)
    with pytest.raises(AttributeError):
        rec.machine.state = "completed"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        rec.state = "completed"  # type: ignore[misc]


def test_registry_statistics_count_states_and_outcomes():
    registry = RequestRegistry()
    a, _ = new_record(registry)
    b, _ = new_record(registry)
    drive_to(registry, a, "decode_ready")
    registry.cancel(b.request_id)
    stats = registry.statistics()
    assert stats.created == 2 and stats.live == 1 and stats.by_state == {"decode_ready": 1}
    assert stats.terminal_by_reason == {"CANCELLED": 1} and stats.closes == 1


@pytest.mark.req("R4.1")
def test_fire_all_tells_the_listener_every_move_but_the_quiet_ones():
    """fire_all (one call per decode step, issue #20): a batch whose every move is between quiet states
    tells nothing; a batch with any other move tells exactly those, and closes what ends."""
    told: list[tuple[int, str, str]] = []
    registry = RequestRegistry(listener=lambda rec, source, target: told.append((rec.request_id, source, target)))
    registry.quiet = frozenset({"decode_ready", "decode_running"})
    recs = [new_record(registry)[0] for _ in range(3)]
    for rec in recs:
        drive_to(registry, rec, "decode_ready")
    told.clear()
    registry.fire_all(recs, "submit_decode", job=6)
    assert told == [] and all(rec.state == "decode_running" for rec in recs)
    other, sink = new_record(registry)
    drive_to(registry, other, "waiting_admission")
    told.clear()
    registry.fire_all([recs[0], other], "cancel")  # a running request gets its flag (quiet); a waiting one ends
    assert told == [(other.request_id, "waiting_admission", "cancelled")]
    assert recs[0].machine.cancel_requested and sink.closes == 1
    told.clear()
    registry.fire_all(recs[1:], "decode_done", job=6, ok=True, stop=True)  # quiet to Finishing: told, each
    assert told == [(rec.request_id, "decode_running", "finishing") for rec in recs[1:]]
    one, one_sink = new_record(registry)  # one record (a B1 step): the same telling
    drive_to(registry, one, "decode_ready")
    told.clear()
    registry.fire_all([one], "submit_decode", job=8)
    registry.fire_all([one], "decode_done", job=8, ok=True, stop=True)
    assert told == [(one.request_id, "decode_running", "finishing")] and one_sink.closes == 0
    with pytest.raises(TransitionNotAllowed):
        registry.fire_all([one], "submit_decode", job=9)
    assert one.state == "finishing"


@pytest.mark.req("R4.1")
def test_quiet_moves_are_told_to_the_quiet_listener_once_per_call():
    """Issue #20, the decode cycle as one unit: a batch call's quiet moves go to the quiet listener in one call
    (records, source, targets), in lane order, and never to the per-record listener; the other moves still
    go to the listener one by one. Mutants caught: the quiet moves told to nobody (an observer then misses a
    decode step), told through the listener record by record, or told once per record."""
    told: list[tuple[int, str, str]] = []
    steps: list[tuple[list[int], str, list[str]]] = []
    registry = RequestRegistry(listener=lambda rec, source, target: told.append((rec.request_id, source, target)))
    registry.quiet = frozenset({"decode_ready", "decode_running"})
    registry.quiet_listener = lambda recs, source, targets: steps.append(
        ([rec.request_id for rec in recs], source, list(targets)))
    recs = [new_record(registry, new=5)[0] for _ in range(3)]
    for rec in recs:
        drive_to(registry, rec, "decode_ready")
    ids = [rec.request_id for rec in recs]
    told.clear()
    registry.fire_all(recs, "submit_decode", job=6)
    assert steps == [(ids, "decode_ready", ["decode_running"] * 3)] and told == []
    steps.clear()
    targets = registry.decode_done_each(recs, 1, 6, [True] * 3, [False, True, False], [7, 8, 9], [""] * 3)
    assert targets == ["decode_ready", "finishing", "decode_ready"]
    assert steps == [([ids[0], ids[2]], "decode_running", ["decode_ready", "decode_ready"])]
    assert told == [(ids[1], "decode_running", "finishing")]
    steps.clear()
    told.clear()
    registry.fire_all(recs[:1], "submit_decode", job=7)  # one record (a B1 step): the same telling
    registry.decode_done_each(recs[:1], 1, 7, [True], [False], [5], [""])
    assert steps == [([ids[0]], "decode_ready", ["decode_running"]), ([ids[0]], "decode_running", ["decode_ready"])]
    assert told == []
