"""A session's decode targets (issue #20): the calbin id and buffer pair each decode step of a configuration is built
on, read by the executor once per step instead of asking the session for its calbin and buffers. They must change
exactly when the buffers do — created with the pools, dropped with the configuration or the pools — or the executor
would build steps on buffers the device no longer has."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from calculet.adapters.calrt import JobKind
from calculet.adapters.sim import SimCalRT, SimConfig, SimVirtualDevice, package_dir
from calculet.clock import FakeClock
from calculet.errors import DefinitionError
from calculet.machines.job import JobEngine
from calculet.runtime.execution.executor import DeviceExecutor, SubmitRefused
from calculet.runtime.execution.session import RuntimeSession
from calculet.runtime.scheduling.decode import DecodeBatch
from tests.unit.runtime.runtime_support import make_config


@dataclass
class Rig:
    device: SimVirtualDevice
    session: RuntimeSession
    executor: DeviceExecutor


@pytest.fixture
def rig() -> Iterator[Rig]:
    clock = FakeClock()
    device = SimCalRT(SimConfig(clock=clock)).create_virtual_device()
    config = make_config(batch={"profiles": [1, 4]})
    session = RuntimeSession(device, package_dir("next"), config, generation=1).create()
    executor = DeviceExecutor(session, config.executor, clock=clock, job_timeout_s=5.0,
                              prefill_timeout_per_token_s=0.0)
    yield Rig(device, session, executor)
    device.close()


def _expected(session: RuntimeSession) -> dict[tuple[JobEngine, int], tuple[int, object]]:
    """What the targets must hold: every decode buffer pair the session has, with its calbin's id."""
    return {(engine, size): (session.calbin.calbin_id, session.buffers(engine, JobKind.DECODE, size))
            for engine in session.engines for size in session.profiles.sizes}


def test_the_targets_follow_the_buffers_through_a_reset_and_a_teardown(rig: Rig) -> None:
    """Mutants caught: targets not made with the pools (none, or the prefill pair), not dropped with the
    configuration (stale pairs after a ResetConfiguration that has not been followed by new pools yet), not
    dropped with the pools."""
    session = rig.session
    before = _expected(session)
    assert session.decode_targets == before and len(before) == len(session.engines) * 2
    session.reset()
    after = _expected(session)
    assert session.decode_targets == after
    assert all(after[k][1] is not before[k][1] for k in after)  # new pairs: the old ones died with the reset
    session.drop_configuration()  # a ResetConfiguration by another session: the pools die with the configuration
    assert session.decode_targets == {}


def test_the_targets_are_dropped_with_the_pools(rig: Rig) -> None:
    session = rig.session
    assert session.decode_targets
    session.free_sequences()
    assert session.destroy_pools() == []
    assert session.decode_targets == {}


def test_a_decode_step_with_no_target_is_refused_as_the_session_explains(rig: Rig) -> None:
    """Mutant caught: a missing target refused with another code or reason than the session's own lookup
    (``no_decode_target``), or not refused at all (a KeyError out of the executor)."""
    session = rig.session
    with pytest.raises(DefinitionError) as missing:
        session.buffers(JobEngine.PING, JobKind.DECODE, 8)
    explained = session.no_decode_target(JobEngine.PING, 8)
    assert str(explained) == str(missing.value)
    detached = RuntimeSession.detached(rig.device, make_config())
    with pytest.raises(DefinitionError) as no_calbin:
        detached.calbin  # noqa: B018
    assert str(detached.no_decode_target(JobEngine.PING, 1)) == str(no_calbin.value)


def test_the_executor_refuses_a_step_it_cannot_build_without_reaching_the_device(rig: Rig) -> None:
    """Mutant caught: the refusal counted as the device's (``submit_rc``) or the job sent to the device anyway."""
    # the fields the executor reads before it finds no target; the rest left empty
    work = DecodeBatch(3, 1, SimpleNamespace(compiled_batch=8), (), (), (), (), None, 0.0, 0.0, ())  # type: ignore[arg-type]
    submitted = rig.device.statistics().submitted
    outcome = rig.executor.submit(work, JobEngine.PING)
    assert isinstance(outcome, SubmitRefused) and "no decode B8 buffers" in outcome.message
    assert rig.device.statistics().submitted == submitted and rig.executor.statistics().submit_rc == {}


def test_a_prefill_on_a_detached_session_is_refused_for_its_missing_calbin(rig: Rig) -> None:
    """The reason a request fails with names what is missing first (the calbin), as the build did before it was
    folded into ``submit``. Mutant caught: the sequence allocated before the calbin is read (the refusal then says
    the session has no KvManager)."""
    from calculet.runtime.scheduling.prefill import PrefillWork  # noqa: PLC0415

    executor = DeviceExecutor(RuntimeSession.detached(rig.device, make_config()), make_config().executor,
                              clock=FakeClock(), job_timeout_s=5.0, prefill_timeout_per_token_s=0.0)
    work = object.__new__(PrefillWork)
    work.__dict__.update(job_id=1, generation=1, seq_id=1, start_position=0, tokens=2)
    outcome = executor.submit(work, JobEngine.PING, (256, 72))
    assert isinstance(outcome, SubmitRefused) and "has no calbin" in outcome.message
