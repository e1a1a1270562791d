"""The device the ``on_time`` planner plans with: measured, slowed for admission, alone (issues #13, #20).

Why this module exists: every estimate of :mod:`.on_time_planner` reads a :class:`~.finish_estimate.DeviceModel`
built from the step and prefill timers (:mod:`.estimates`), and admission reads two more derived from it — the
device slowed by the estimator's measured error (:mod:`.estimate_error`'s margin), and the device serving one
request alone ("never" and a candidate on an idle device are judged on it). The step timer measures at every
decode step, so wherever a model is read after a step — a ``submit()``, the replan, the HTTP front's snapshot at
each actor turn — the models are built again. Issue #20 measured that chain (measured + admitting model) at 11.4 µs
of CPU per step when each derived model went through ``dataclasses.replace`` (as ``DeviceModel.slowed`` did then),
and an admitted ``submit()`` between two steps at 23-26 µs against 11-12 within one step (``bench/admission_screen.py``);
here each model is one constructor call with the same products, the measured one keyed once, and the alone model
built only when read: 4.6 µs per step, 15.7-16.1 µs per submit between steps. Moved out of the planner for the
size limits; the planner delegates.
"""

from __future__ import annotations

import math

from calculet.runtime.scheduling.estimate_error import EstimateErrors
from calculet.runtime.scheduling.estimates import PrefillTimer, StepTimer
from calculet.runtime.scheduling.finish_estimate import DeviceModel

__all__ = ["MeasuredDevice"]


class MeasuredDevice:
    """The measured device model, admission's slowed copy and its alone model, each built once per change."""

    __slots__ = ("step_times", "prefill_times", "errors", "admitting_of", "admitting_margin", "admitting",
                 "_alone_step", "_alone", "_fastest_step")

    def __init__(self, step_times: StepTimer, prefill_times: PrefillTimer, errors: EstimateErrors) -> None:
        self.step_times = step_times
        self.prefill_times = prefill_times
        self.errors = errors
        self.admitting_of: DeviceModel | None = None
        """The model :attr:`admitting` was built from (read by ``OnTimePlanner.admit`` without a call, #20)."""
        self.admitting_margin = 0.0
        """The margin :attr:`admitting` was slowed by."""
        self.admitting: DeviceModel | None = None
        self._alone_step = math.inf  # the alone model's step, fixed when ``admitting`` was built
        self._alone: DeviceModel | None = None  # admitting_alone(), built on its first read after ``admitting``
        self._fastest_step = math.inf  # the fastest decode step measured since the last restart (the smoothed step)

    def device(self, compiled_batch: int, engines: int, chunk: int | None) -> DeviceModel | None:
        """The measured device of that shape, built now from the timers, or None until a decode step has been
        measured. Its one caller keys it (``OnTimePolicy.model``: on the timers' sample counts, which change only
        when they measure, the profile set and the engines), so a model is built once per change (#20)."""
        step_times = self.step_times
        step = step_times.decode_step_s
        if step <= 0:
            return None
        if step < self._fastest_step:
            self._fastest_step = step
        fixed, per_token = self.prefill_times.cost()
        return DeviceModel(step, compiled_batch, engines, fixed, per_token, chunk, step_times.token_s,
                           step_times.period_high_s, step_times.slot_token_s)

    def admitting_model(self, model: DeviceModel) -> DeviceModel:
        """``model`` slowed by admission's margin, kept while it and the margin are (#20: not per ``submit()``);
        the alone model is built on its first read (:meth:`admitting_alone`), from the step it would have now."""
        margin = self.errors.margin
        admitting = self.admitting
        if model is not self.admitting_of or margin != self.admitting_margin or admitting is None:
            self.admitting_of, self.admitting_margin = model, margin
            self.admitting = admitting = model.slowed(1.0 + margin)
            self._alone_step = min(self._fastest_step, model.decode_step_s)
            self._alone = None
        return admitting

    def admission_model(self, model: DeviceModel) -> DeviceModel:
        """``model`` slowed by the margin: the kept :attr:`admitting` when ``model`` is the one it was built from,
        else built and not kept (a replan on admission's own model slows it twice, and keeps the cache as it is)."""
        margin = self.errors.margin
        if model is self.admitting_of and margin == self.admitting_margin and self.admitting is not None:
            return self.admitting
        return model.slowed(1.0 + margin)

    def alone_model(self, model: DeviceModel) -> DeviceModel:
        """``model`` serving one request alone (see ``OnTimePlanner.alone_model``), not slowed."""
        return _alone(model, min(self._fastest_step, model.decode_step_s), 1.0)

    def admitting_alone(self) -> DeviceModel | None:
        """:meth:`alone_model` of the device :meth:`admitting_model` last built, slowed by the same margin."""
        alone = self._alone
        if alone is None and self.admitting_of is not None:
            self._alone = alone = _alone(self.admitting_of, self._alone_step, 1.0 + self.admitting_margin)
        return alone

    def restart(self) -> None:
        """The device starts afresh (a reset, a new generation): the fastest step measured before says nothing
        of it. Kept, a request was judged alone (and "never") on the step of a device that has since slowed —
        optimistic admission; the next model built sets it again, from the step measured then."""
        self._fastest_step = math.inf
        self.admitting = self.admitting_of = self._alone = None


def _alone(model: DeviceModel, step: float, factor: float) -> DeviceModel:
    """``model`` on one lane at ``step``, nobody else's prefills between its steps (``token_s`` 0), slowed by
    ``factor``: ``alone_model`` then ``slowed(factor)``, the same products, one construction (a product by 1.0
    is exact)."""
    return DeviceModel(step * factor, 1, 1, model.prefill_fixed_s * factor, model.prefill_per_token_s * factor,
                       model.prefill_chunk_tokens, 0.0, model.step_period_s * factor)
