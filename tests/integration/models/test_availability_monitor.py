"""The scheduler's availability is monitored against the serving generation's ModelMachine on the
live engine (#17, §10–§12): the engine's tick monitor rejects a hand-set availability that the
machine does not allow, and accepts the real lifecycle (every other test here runs with it on)."""

from __future__ import annotations

import pytest

from calculet.machines.errors import InvariantViolation
from calculet.runtime.scheduling.admission import ModelAvailability
from tests.integration.models.support import Client, ModelsEnv, make_rig


@pytest.mark.req("R12.2", "R10.4")
def test_a_hand_set_availability_the_machine_does_not_allow_is_caught_on_the_next_tick(env: ModelsEnv) -> None:
    rig = make_rig(env.config(env.package("model-a")))
    client = Client(rig)
    first = client.submit(4)
    rig.driver.run_until_idle()
    assert client.outcome(first).state == "completed"
    core = rig.driver.core
    gen = core.scheduler.generation
    assert rig.models.counter_faults(core.scheduler.registry.live()) == []  # READY of a Ready generation
    # the fault: the scheduler is told Recovering while the generation's machine is still Ready
    core.scheduler.set_model(gen, ModelAvailability.RECOVERING)
    faults = {name for name, _ in rig.models.counter_faults(core.scheduler.registry.live())}
    assert faults == {"scheduler_availability_is_the_model_machines"}
    with pytest.raises(InvariantViolation) as caught:
        client.submit(4)
        rig.driver.run_until_idle()
    assert caught.value.invariant == "scheduler_availability_is_the_model_machines"
