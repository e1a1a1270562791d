"""Issue #20: the on_time device models built with one constructor each are the ones ``slowed`` and
``dataclasses.replace`` built (:mod:`calculet.runtime.scheduling.on_time_device`).

The step timer measures at every decode step, so the measured, admitting and alone models are rebuilt per step
wherever one is read; they are now built directly rather than through ``replace`` (``DeviceModel.slowed`` too). The
decisions read every field (``==`` keys the refusal cache and the retry slots), so the models must be equal, field
for field, to the ones built before. Mutants caught: a field left unslowed (``prefill_fixed_s``, ``step_period_s``,
``token_s``, ``slot_token_s``), the alone model keeping ``token_s``, ``slot_token_s`` or the compiled batch, the margin
applied to the alone step twice.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.estimate_error import EstimateErrors
from calculet.runtime.scheduling.estimates import PrefillTimer, StepTimer
from calculet.runtime.scheduling.finish_estimate import DeviceModel
from calculet.runtime.scheduling.on_time_device import MeasuredDevice, _alone

times = st.floats(0.0, 5.0, allow_nan=False)
positive = st.floats(1e-4, 5.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(step=positive, batch=st.sampled_from([1, 4, 16]), engines=st.sampled_from([1, 2]), fixed=times, per=times,
       chunk=st.sampled_from([None, 64]), token=times, period=times, margin=st.floats(0.0, 3.0, allow_nan=False),
       fastest=positive, slot=times)
def test_the_models_are_those_slowed_and_replace_built(step: float, batch: int, engines: int, fixed: float,
                                                        per: float, chunk: int | None, token: float, period: float,
                                                        margin: float, fastest: float, slot: float) -> None:
    model = DeviceModel(step, batch, engines, fixed, per, chunk, token, period, slot)
    factor = 1.0 + margin
    fields = ("decode_step_s", "prefill_fixed_s", "prefill_per_token_s", "token_s", "step_period_s", "slot_token_s")
    times_slowed = {name: getattr(model, name) * factor for name in fields}
    assert model.slowed(factor) == dataclasses.replace(model, **times_slowed)  # every time field, nothing else
    alone_step = min(fastest, step)
    expected = dataclasses.replace(model, decode_step_s=alone_step, compiled_batch=1, engines=1, token_s=0.0,
                                   slot_token_s=0.0)
    assert _alone(model, alone_step, factor) == expected.slowed(factor)
    assert _alone(model, alone_step, 1.0) == expected


def test_measured_device_builds_from_the_timers_and_the_alone_model_follows_the_fastest_step():
    step_times, prefill_times, errors = StepTimer(), PrefillTimer(), EstimateErrors(0.01, 0.25)
    devices = MeasuredDevice(step_times, prefill_times, errors)
    assert devices.device(16, 1, None) is None  # no step measured
    step_times.observe(0.02, lanes=16, compiled=16, decoding=16, now=1.0)
    prefill_times.observe(32, 0.01)
    fast = devices.device(16, 1, None)
    assert fast is not None and fast == devices.device(16, 1, None)  # built afresh: OnTimePolicy.model keys it
    admitting = devices.admitting_model(fast)
    assert admitting == fast.slowed(1.25) and admitting is devices.admitting_model(fast)
    assert devices.admission_model(fast) is admitting  # the replan reads the kept one
    assert devices.admission_model(admitting) == admitting.slowed(1.25)  # admission's own model: slowed twice
    for k in range(20):  # the device slows: the smoothed step grows, the fastest stays
        step_times.observe(0.2, lanes=16, compiled=16, decoding=16, now=2.0 + k)
    slow = devices.device(16, 1, None)
    assert slow is not None and slow.decode_step_s > 0.1
    devices.admitting_model(slow)
    alone = devices.admitting_alone()
    assert alone == dataclasses.replace(slow, decode_step_s=0.02, compiled_batch=1, engines=1, token_s=0.0,
                                        slot_token_s=0.0).slowed(1.25)
    devices.restart()
    assert devices.admitting_alone() is None  # nothing built since
    devices.admitting_model(slow)
    assert devices.admitting_alone() == devices.admitting_model(slow).__class__(
        slow.decode_step_s * 1.25, 1, 1, slow.prefill_fixed_s * 1.25, slow.prefill_per_token_s * 1.25, None, 0.0,
        slow.step_period_s * 1.25)
