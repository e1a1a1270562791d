"""The generated hot path of DeviceJobMachine — do not edit: regenerate with `python -m calculet.specgen`.

Printed from the z3 terms of the guards and effects declared in calculet.machines.job.DeviceJobMachine by
calculet.machines.codegen_module (issue #20); `python -m calculet.specgen --check` fails when this file is
not what the declaration produces. The runtime imports it (calculet.machines.compiled) instead of
generating it at each start.
"""

from __future__ import annotations

from itertools import islice as _islice
from typing import Any as _Any, Sequence as _Sequence

from calculet.machines.written import MISSING as _M

try:  # mypyc's: the compiled Instance may be subclassed by the runtime's class of the machine
    from mypy_extensions import mypyc_attr as _mypyc_attr
except ImportError:  # the service's install has no mypy_extensions: in plain Python it does nothing
    def _mypyc_attr(*_: str, **__: object) -> _Any:  # type: ignore  # (a redefinition, for mypy)
        return lambda cls: cls

_MISSING = _M
_int = int
_draws: _Any = iter(())  # the monitor's draws: set by calculet.machines.monitor.Monitor.install
_exact: _Any = None  # the runtime's exact path: set by calculet.machines.compiled.bind
_one_by_one: _Any = None  # the runtime's exact path: set by calculet.machines.compiled.bind
_split: _Any = None  # the runtime's exact path: set by calculet.machines.compiled.bind
_slow_init: _Any = None  # the runtime's exact path: set by calculet.machines.compiled.bind

DECLARATION = 'calculet.machines.job.DeviceJobMachine'
SHAPE = '47dccf48f60bd6f8'

BINDINGS = {  # name: where the object is found in the declaration (calculet.machines.codegen_module)
    '_row_0_0': ('row', 0),
    '_row_1_0': ('row', 1),
    '_row_2_0': ('row', 2),
    '_row_2_1': ('row', 3),
    '_row_3_0': ('row', 4),
    '_row_4_0': ('row', 5),
    '_row_5_0': ('row', 6),
    '_row_6_0': ('row', 7),
    '_row_7_0': ('row', 8),
    '_row_8_0': ('row', 9),
    '_each_row_0_0_0': ('row', 0),
    '_each_row_1_0_0': ('row', 1),
    '_each_row_2_0_0': ('row', 2),
    '_each_row_2_0_1': ('row', 3),
    '_each_row_3_0_0': ('row', 4),
    '_each_row_4_0_0': ('row', 5),
    '_each_row_5_0_0': ('row', 6),
    '_each_row_6_0_0': ('row', 7),
    '_each_row_6_1_0': ('row', 8),
    '_each_row_7_0_0': ('row', 9),
    '_enum_JobEngine': ('enum', 'param', 'engine'),
    '_init_0': ('init', 'buffers_held'),
    '_init_1': ('init', 'delivered'),
    '_init_2': ('init', 'fault_reported'),
}

_row_0_0: _Any = None
_row_1_0: _Any = None
_row_2_0: _Any = None
_row_2_1: _Any = None
_row_3_0: _Any = None
_row_4_0: _Any = None
_row_5_0: _Any = None
_row_6_0: _Any = None
_row_7_0: _Any = None
_row_8_0: _Any = None
_each_row_0_0_0: _Any = None
_each_row_1_0_0: _Any = None
_each_row_2_0_0: _Any = None
_each_row_2_0_1: _Any = None
_each_row_3_0_0: _Any = None
_each_row_4_0_0: _Any = None
_each_row_5_0_0: _Any = None
_each_row_6_0_0: _Any = None
_each_row_6_1_0: _Any = None
_each_row_7_0_0: _Any = None
_enum_JobEngine: _Any = None
_init_0: _Any = None
_init_1: _Any = None
_init_2: _Any = None

def _dispatch_0(self: Instance, a):  # DeviceJobMachine: prepared --submit-->
    if True:  # submit@prepared
        self._state = 'submitted'  # submit@prepared
        return 0
    return -1

def _fire_0(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: prepared --submit-->
    if _a_ok is not _M:
        return None
    self._state = 'submitted'  # submit@prepared
    self.last_transition = _row_0_0
    return 'submitted'
    return None

def _dispatch_1(self: Instance, a):  # DeviceJobMachine: prepared --submit_rejected-->
    if True:  # submit_rejected@prepared
        self.buffers_held = False
        self._state = 'failed'  # submit_rejected@prepared
        return 0
    return -1

def _fire_1(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: prepared --submit_rejected-->
    if _a_ok is not _M:
        return None
    self.buffers_held = False
    self._state = 'failed'  # submit_rejected@prepared
    self.last_transition = _row_1_0
    return 'failed'
    return None

def _dispatch_2(self: Instance, a):  # DeviceJobMachine: submitted --complete-->
    if a['ok']:  # complete_ok
        self.delivered, self.buffers_held = (self.delivered + 1), False
        self._state = 'completed'  # complete_ok
        return 0
    if (not a['ok']):  # complete_error
        self.buffers_held = False
        self._state = 'failed'  # complete_error
        return 1
    return -1

def _fire_2(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: submitted --complete-->
    if not ((_a_ok is True or _a_ok is False)):
        return None
    if _a_ok:
        self.delivered, self.buffers_held = (self.delivered + 1), False
        self._state = 'completed'  # complete_ok
        self.last_transition = _row_2_0
        return 'completed'
    if (not _a_ok):
        self.buffers_held = False
        self._state = 'failed'  # complete_error
        self.last_transition = _row_2_1
        return 'failed'
    return None

def _dispatch_3(self: Instance, a):  # DeviceJobMachine: submitted --timeout-->
    if True:  # timeout@submitted
        self._state = 'timed_out'  # timeout@submitted
        return 0
    return -1

def _fire_3(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: submitted --timeout-->
    if _a_ok is not _M:
        return None
    self._state = 'timed_out'  # timeout@submitted
    self.last_transition = _row_3_0
    return 'timed_out'
    return None

def _dispatch_4(self: Instance, a):  # DeviceJobMachine: submitted --fault-->
    if True:  # fault@submitted
        self.fault_reported = True
        self._state = 'quarantined'  # fault@submitted
        return 0
    return -1

def _fire_4(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: submitted --fault-->
    if _a_ok is not _M:
        return None
    self.fault_reported = True
    self._state = 'quarantined'  # fault@submitted
    self.last_transition = _row_4_0
    return 'quarantined'
    return None

def _dispatch_5(self: Instance, a):  # DeviceJobMachine: timed_out --quarantine-->
    if True:  # quarantine@timed_out
        self._state = 'quarantined'  # quarantine@timed_out
        return 0
    return -1

def _fire_5(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: timed_out --quarantine-->
    if _a_ok is not _M:
        return None
    self._state = 'quarantined'  # quarantine@timed_out
    self.last_transition = _row_5_0
    return 'quarantined'
    return None

def _dispatch_6(self: Instance, a):  # DeviceJobMachine: timed_out --late_complete-->
    if True:  # late_complete@timed_out
        self.buffers_held = False
        self._state = 'failed'  # late_complete@timed_out
        return 0
    return -1

def _fire_6(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: timed_out --late_complete-->
    if _a_ok is not _M:
        return None
    self.buffers_held = False
    self._state = 'failed'  # late_complete@timed_out
    self.last_transition = _row_6_0
    return 'failed'
    return None

def _dispatch_7(self: Instance, a):  # DeviceJobMachine: quarantined --late_complete-->
    if True:  # late_complete@quarantined
        self.buffers_held = False
        self._state = 'failed'  # late_complete@quarantined
        return 0
    return -1

def _fire_7(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: quarantined --late_complete-->
    if _a_ok is not _M:
        return None
    self.buffers_held = False
    self._state = 'failed'  # late_complete@quarantined
    self.last_transition = _row_7_0
    return 'failed'
    return None

def _dispatch_8(self: Instance, a):  # DeviceJobMachine: quarantined --reset_done-->
    if True:  # reset_done@quarantined
        self.buffers_held = False
        self._state = 'failed'  # reset_done@quarantined
        return 0
    return -1

def _fire_8(self: Instance, _a_ok, _M=_M, _int=_int):  # DeviceJobMachine: quarantined --reset_done-->
    if _a_ok is not _M:
        return None
    self.buffers_held = False
    self._state = 'failed'  # reset_done@quarantined
    self.last_transition = _row_8_0
    return 'failed'
    return None

_table: dict[str, dict[str, _Any]] = {
    'prepared': {'submit': _dispatch_0, 'submit_rejected': _dispatch_1},
    'submitted': {'complete': _dispatch_2, 'timeout': _dispatch_3, 'fault': _dispatch_4},
    'timed_out': {'quarantine': _dispatch_5, 'late_complete': _dispatch_6},
    'quarantined': {'late_complete': _dispatch_7, 'reset_done': _dispatch_8},
}

_ft: dict[str, dict[str, _Any]] = {
    'prepared': {'submit': _fire_0, 'submit_rejected': _fire_1},
    'submitted': {'complete': _fire_2, 'timeout': _fire_3, 'fault': _fire_4},
    'timed_out': {'quarantine': _fire_5, 'late_complete': _fire_6},
    'quarantined': {'late_complete': _fire_7, 'reset_done': _fire_8},
}

def _given(ok):  # DeviceJobMachine: the arguments given, as the exact path takes them
    a = {}
    if ok is not _M:
        a['ok'] = ok
    return a

def _each_0(instances: _Sequence[Instance], ok):  # DeviceJobMachine: --submit--> on each instance
    if ok is not _M:
        return _one_by_one(instances, 'submit', {'ok': ok}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'prepared' and True:
            self._state = 'submitted'  # submit@prepared
            self.last_transition = _each_row_0_0_0
            append('submitted')
            continue
        append(_exact(self, 'submit', {}))
    return targets

def _each_1(instances: _Sequence[Instance], ok):  # DeviceJobMachine: --submit_rejected--> on each instance
    if ok is not _M:
        return _one_by_one(instances, 'submit_rejected', {'ok': ok}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'prepared' and True:
            self.buffers_held = False
            self._state = 'failed'  # submit_rejected@prepared
            self.last_transition = _each_row_1_0_0
            append('failed')
            continue
        append(_exact(self, 'submit_rejected', {}))
    return targets

def _each_2(instances: _Sequence[Instance], ok):  # DeviceJobMachine: --complete--> on each instance
    if ok is _M:
        return _one_by_one(instances, 'complete', {'ok': ok}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_ok in zip(instances, ok):
        state = self._state
        if state == 'submitted' and (_a_ok is True or _a_ok is False):
            if _a_ok:
                self.delivered, self.buffers_held = (self.delivered + 1), False
                self._state = 'completed'  # complete_ok
                self.last_transition = _each_row_2_0_0
                append('completed')
                continue
            if (not _a_ok):
                self.buffers_held = False
                self._state = 'failed'  # complete_error
                self.last_transition = _each_row_2_0_1
                append('failed')
                continue
        append(_exact(self, 'complete', {'ok': _a_ok}))
    return targets

def _each_3(instances: _Sequence[Instance], ok):  # DeviceJobMachine: --timeout--> on each instance
    if ok is not _M:
        return _one_by_one(instances, 'timeout', {'ok': ok}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'submitted' and True:
            self._state = 'timed_out'  # timeout@submitted
            self.last_transition = _each_row_3_0_0
            append('timed_out')
            continue
        append(_exact(self, 'timeout', {}))
    return targets

def _each_4(instances: _Sequence[Instance], ok):  # DeviceJobMachine: --fault--> on each instance
    if ok is not _M:
        return _one_by_one(instances, 'fault', {'ok': ok}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'submitted' and True:
            self.fault_reported = True
            self._state = 'quarantined'  # fault@submitted
            self.last_transition = _each_row_4_0_0
            append('quarantined')
            continue
        append(_exact(self, 'fault', {}))
    return targets

def _each_5(instances: _Sequence[Instance], ok):  # DeviceJobMachine: --quarantine--> on each instance
    if ok is not _M:
        return _one_by_one(instances, 'quarantine', {'ok': ok}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'timed_out' and True:
            self._state = 'quarantined'  # quarantine@timed_out
            self.last_transition = _each_row_5_0_0
            append('quarantined')
            continue
        append(_exact(self, 'quarantine', {}))
    return targets

def _each_6(instances: _Sequence[Instance], ok):  # DeviceJobMachine: --late_complete--> on each instance
    if ok is not _M:
        return _one_by_one(instances, 'late_complete', {'ok': ok}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'timed_out' and True:
            self.buffers_held = False
            self._state = 'failed'  # late_complete@timed_out
            self.last_transition = _each_row_6_0_0
            append('failed')
            continue
        elif state == 'quarantined' and True:
            self.buffers_held = False
            self._state = 'failed'  # late_complete@quarantined
            self.last_transition = _each_row_6_1_0
            append('failed')
            continue
        append(_exact(self, 'late_complete', {}))
    return targets

def _each_7(instances: _Sequence[Instance], ok):  # DeviceJobMachine: --reset_done--> on each instance
    if ok is not _M:
        return _one_by_one(instances, 'reset_done', {'ok': ok}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'quarantined' and True:
            self.buffers_held = False
            self._state = 'failed'  # reset_done@quarantined
            self.last_transition = _each_row_7_0_0
            append('failed')
            continue
        append(_exact(self, 'reset_done', {}))
    return targets

_each: dict[str, _Any] = {'submit': _each_0, 'submit_rejected': _each_1, 'complete': _each_2, 'timeout': _each_3, 'fault': _each_4, 'quarantine': _each_5, 'late_complete': _each_6, 'reset_done': _each_7}

def fire_each_plain(instances, event, ok=_M):  # DeviceJobMachine
    n = len(instances)
    if ok is not _M and len(ok) != n:
        raise ValueError(f'fire_each: ok has {len(ok)} values for {n} instances')
    if n == 1:
        self = instances[0]
        ok = ok if ok is _M else ok[0]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(ok))]
        target = fast(self, ok)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(ok))]
    run = _each.get(event)
    if run is None:
        return _one_by_one(instances, event, {'ok': ok}, None)
    return run(instances, ok)

def fire_each_sampled(instances, event, ok=_M):  # DeviceJobMachine
    n = len(instances)
    if ok is not _M and len(ok) != n:
        raise ValueError(f'fire_each: ok has {len(ok)} values for {n} instances')
    if n == 1:
        self = instances[0]
        ok = ok if ok is _M else ok[0]
        if next(_draws):
            return [_exact(self, event, _given(ok))]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(ok))]
        target = fast(self, ok)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(ok))]
    run = _each.get(event)
    drawn = list(_islice(_draws, n))
    if run is None:
        return _one_by_one(instances, event, {'ok': ok}, drawn)
    if True in drawn:
        return _split(run, instances, event, {'ok': ok}, drawn)
    return run(instances, ok)

@_mypyc_attr(allow_interpreted_subclasses=True)
class Instance:
    """DeviceJobMachine's instance: its state, last row, parameters and variables, typed as declared."""

    __slots__ = ('_state', 'last_transition', 'job_id', 'generation', 'engine', 'lanes', 'buffers_held', 'delivered', 'fault_reported')

    _state: str
    last_transition: _Any
    job_id: int
    generation: int
    engine: _Any
    lanes: int
    buffers_held: bool
    delivered: int
    fault_reported: bool

    def fire_plain(self, event, ok=_M) -> _Any:  # DeviceJobMachine
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(ok))
        target = fast(self, ok)
        if target is not None:
            return target
        return _exact(self, event, _given(ok))

    def fire_sampled(self, event, ok=_M) -> _Any:  # DeviceJobMachine
        if next(_draws):
            return _exact(self, event, _given(ok))
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(ok))
        target = fast(self, ok)
        if target is not None:
            return target
        return _exact(self, event, _given(ok))

    def _check_invariants(self, pre) -> _Any:  # DeviceJobMachine
        broken = []
        if not ((self.delivered == 1) == ((self._state == 'completed'))):
            broken.append(('delivered_only_when_completed', 'design'))
        if not (self.buffers_held == ((self._state == 'prepared') or (self._state == 'submitted') or (self._state == 'timed_out') or (self._state == 'quarantined'))):
            broken.append(('buffers_held_until_device_done', 'R14.3'))
        if not ((not self.fault_reported) or ((self._state == 'quarantined') or (self._state == 'failed'))):
            broken.append(('fault_reported_only_by_a_completion', 'R7.4.6'))
        if not ((self.delivered >= 0) and (self.delivered <= 1)):
            broken.append(('bounds_delivered', 'type'))
        if pre is not None:
            if not ((not (((pre._state == 'submitted')) and (not self.buffers_held))) or ((self._state == 'completed') or (self._state == 'failed'))):
                broken.append(('no_release_while_writable', 'R12.11'))
            if not (((not ((pre._state == 'completed'))) or ((self._state == 'completed'))) and ((not ((pre._state == 'failed'))) or ((self._state == 'failed')))):
                broken.append(('terminal_is_final', 'R4.6'))
        return broken

    def __init__(self, *, job_id=_MISSING, generation=_MISSING, engine=_MISSING, lanes=_MISSING, **extra) -> None:  # DeviceJobMachine
        if extra or not ((job_id.__class__ is _int and job_id >= 1) and (generation.__class__ is _int and generation >= 1) and (engine.__class__ is _enum_JobEngine) and (lanes.__class__ is _int and lanes >= 1 and lanes <= 16)):
            return _slow_init(self, extra, job_id=job_id, generation=generation, engine=engine, lanes=lanes)
        self.job_id = job_id
        self.generation = generation
        self.engine = engine
        self.lanes = lanes
        self.buffers_held = _init_0
        self.delivered = _init_1
        self.fault_reported = _init_2
        self._state = 'prepared'
        self.last_transition = None

    def snapshot(self) -> _Any:  # DeviceJobMachine
        copy: Instance = _new(self.__class__)
        copy.job_id = self.job_id
        copy.generation = self.generation
        copy.engine = self.engine
        copy.lanes = self.lanes
        copy.buffers_held = self.buffers_held
        copy.delivered = self.delivered
        copy.fault_reported = self.fault_reported
        copy._state = self._state
        copy.last_transition = self.last_transition
        return copy

fire_plain = Instance.fire_plain
fire_sampled = Instance.fire_sampled
_check_invariants = Instance._check_invariants
__init__ = Instance.__init__
snapshot = Instance.snapshot
_new: _Any = Instance.__new__  # object's, or the compiled class's allocator (no __init__)
