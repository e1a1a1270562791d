"""The null device's decode step committed at submit (issue #20: :mod:`calculet.adapters.sim.null_plan` — a routed
step through ``NullDecodePlan.submit``, a step off a route through ``NullDecodePlan.commit``) against the general
completion path it replaces for that case (``compute`` → ``commit`` → ``completion_record``).

The same jobs run on two numerics-off devices with no device time: one in real time, which completes each decode
inside Submit through the null plan, and one in virtual time, which completes them through the general path.
Every field of every result except the instants must agree, and so must the KV each job leaves behind and the
device's counts (submitted, completed, per engine, fault decisions)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest

from calculet.adapters.calrt import NO_SEQUENCE, JobResult
from calculet.adapters.host_driver import HostDriver
from calculet.adapters.sim import CostModel, SimConfig, TimeMode, open_sim
from calculet.adapters.sim.presets import SimSession
from calculet.machines.job import JobEngine


@pytest.fixture(params=["current", "next"])  # B1 only; B1/B4/B8/B16 with ping/pong and masked inactive lanes
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[SimSession, SimSession]]:
    fast = open_sim(request.param, config=SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null()))
    general = open_sim(request.param, config=SimConfig(cost=CostModel.null()))  # virtual time: its timeline completes
    try:
        assert fast.device.completes_at_submit and not general.device.completes_at_submit
        yield fast, general
    finally:
        fast.device.close()
        general.device.close()


def _comparable(result: JobResult) -> tuple[object, ...]:
    """A result without its instants (the two devices run on different clocks)."""
    return (result.generation, result.kind, result.engine, result.compiled_batch, result.rc, result.counters,
            result.message, result.output_buffer.kind,
            tuple((lane.lane, lane.seq_id, lane.valid, lane.rc, lane.position, lane.kv_len, lane.logits,
                   lane.greedy_token) for lane in result.lanes))


def _run(session: SimSession, job: object) -> JobResult:
    device = session.device
    ticket = device.submit(job)  # type: ignore[arg-type]
    result = device.wait(ticket.job_id, 5.0)
    assert result.job_id == ticket.job_id
    return result


@pytest.mark.parametrize("seed", range(6))
def test_the_one_pass_record_equals_the_general_completion(pair: tuple[SimSession, SimSession], seed: int) -> None:
    rng = random.Random(seed)
    fast, general = pair
    drivers = [HostDriver(s.device, s.calbin, s.kv, generation=1) for s in pair]
    profiles = [p.compiled_batch for p in fast.calbin.profiles if p.compiled_batch in fast.calbin.configured_profiles]
    seqs = [[s.kv.allocate_sequence() for _ in range(6)] for s in pair]
    assert [int(a) for a in seqs[0]] == [int(b) for b in seqs[1]]
    last: dict[int, int] = {}
    for k in range(6):
        prompt = [rng.randrange(1, 250) for _ in range(rng.randint(1, 5))]
        a, b = (_run(s, d.prefill_job(q[k], prompt)) for s, d, q in zip(pair, drivers, seqs))
        assert _comparable(a) == _comparable(b)
        last[k] = a.lanes[0].greedy_token
    for _ in range(25):
        size = rng.choice(profiles)
        chosen = rng.sample(range(6), rng.randint(1, min(size, 6)))
        idle = [k for k in range(6) if k not in chosen]
        engine = rng.choice([JobEngine.PING, JobEngine.PONG]) if fast.calbin.capabilities.ping_pong.value \
            else JobEngine.PING
        slots: list[int | None] = list(chosen) + [None] * (size - len(chosen))
        rng.shuffle(slots)  # valid lanes anywhere in the batch, inactive ones between them
        parked = [int(seqs[0][idle.pop()]) if slot is None and idle and rng.random() < 0.5 else NO_SEQUENCE
                  for slot in slots]  # an inactive lane may park a sequence (its KV must not move)
        results = []
        for session, driver, q in zip(pair, drivers, seqs):
            lanes = [None if slot is None else (q[slot], last[slot]) for slot in slots]
            results.append(_run(session, driver.decode_job(size, lanes, engine, parked)))
        a, b = results
        assert _comparable(a) == _comparable(b)
        for lane in a.lanes:
            if lane.valid:
                last[slots[lane.lane]] = lane.greedy_token  # type: ignore[index]
        assert [fast.kv.committed_length(q) for q in seqs[0]] == [general.kv.committed_length(q) for q in seqs[1]]
    for _ in range(2):  # B1 steps of one sequence: the first opens the route if none did, the second takes the plan
        a, b = (_run(s, d.decode_job(1, [(q[0], last[0])], JobEngine.PING, [NO_SEQUENCE])) for s, d, q in
                zip(pair, drivers, seqs))
        assert _comparable(a) == _comparable(b)
        last[0] = a.lanes[0].greedy_token
    for session in pair:  # nothing left bound: every sequence and buffer is free for the next job
        assert not session.device.inflight()
        assert all(s.inflight_job is None for s in session.kv._seqs.values())  # noqa: SLF001
    assert fast.device.statistics().buffers_bound == general.device.statistics().buffers_bound == 0
    assert fast.device.statistics().completed == general.device.statistics().completed
    assert fast.device.statistics().completed_per_engine == general.device.statistics().completed_per_engine
    assert fast.device.statistics().submitted == general.device.statistics().submitted
    assert fast.device.statistics().faults.decisions == general.device.statistics().faults.decisions
    assert fast.device._null is not None and fast.device._null.submitted > 0  # noqa: SLF001 - the plan took steps


def test_the_null_submit_refuses_as_the_device_does(pair: tuple[SimSession, SimSession]) -> None:
    """Issue #20: the null device's Submit is its plan's (one frame); a step the plan does not take goes to the
    device's full path, whose refusal is raised, translated and counted as the general device's is — on a routed
    buffer pair (a wrong position after a good step) and off it (an unknown sequence). Mutants caught: the plan
    committing a step its checks should refuse (the KV moves); a refusal not counted in ``submit_refused``."""
    from calculet.adapters.calrt import ReturnCode, rc_of
    from calculet.errors import CalculetError

    fast, general = pair
    assert fast.device.submit.__self__ is fast.device._null  # noqa: SLF001 - the plan's Submit is the device's
    drivers = [HostDriver(s.device, s.calbin, s.kv, generation=1) for s in pair]
    seqs = [s.kv.allocate_sequence() for s in pair]
    for session, driver, seq in zip(pair, drivers, seqs):
        _run(session, driver.prefill_job(seq, [5, 6, 7]))
        _run(session, driver.decode_job(1, [(seq, 9)]))  # a good B1 step: the route is open on the null device
    refusals = []
    for session, driver, seq in zip(pair, drivers, seqs):
        job = driver.decode_job(1, [(seq, 9)])
        job = job._replace(positions=np.array([job.lanes.positions[0] + 1]))
        unknown = driver.decode_job(1, [(seq, 9)])
        unknown = unknown._replace(seq_ids=(int(seq) + 999,))
        codes = []
        for bad in (job, unknown):
            with pytest.raises(CalculetError) as refused:
                session.device.submit(bad)
            codes.append(rc_of(refused.value))
        refusals.append((codes, dict(session.device.statistics().submit_refused), session.kv.committed_length(seq)))
    assert refusals[0] == refusals[1]
    codes, counted, _ = refusals[0]
    assert codes[0] is ReturnCode.INVALID_ARGUMENT and sum(counted.values()) == 2
