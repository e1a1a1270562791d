"""The generated hot path of AdmissionBudgetMachine — do not edit: regenerate with `python -m calculet.specgen`.

Printed from the z3 terms of the guards and effects declared in calculet.machines.admission_budgets.AdmissionBudgetMachine by
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

DECLARATION = 'calculet.machines.admission_budgets.AdmissionBudgetMachine'
SHAPE = 'c8df5af67266f9c5'

BINDINGS = {  # name: where the object is found in the declaration (calculet.machines.codegen_module)
    '_row_0_0': ('row', 0),
    '_row_1_0': ('row', 1),
    '_row_2_0': ('row', 2),
    '_row_3_0': ('row', 3),
    '_row_4_0': ('row', 4),
    '_row_5_0': ('row', 5),
    '_each_row_0_0_0': ('row', 0),
    '_each_row_1_0_0': ('row', 1),
    '_each_row_2_0_0': ('row', 2),
    '_each_row_3_0_0': ('row', 3),
    '_each_row_4_0_0': ('row', 4),
    '_each_row_5_0_0': ('row', 5),
    '_init_0': ('init', 'waiting'),
    '_init_1': ('init', 'waiting_tokens'),
    '_init_2': ('init', 'active'),
    '_init_3': ('init', 'active_kv'),
}

_row_0_0: _Any = None
_row_1_0: _Any = None
_row_2_0: _Any = None
_row_3_0: _Any = None
_row_4_0: _Any = None
_row_5_0: _Any = None
_each_row_0_0_0: _Any = None
_each_row_1_0_0: _Any = None
_each_row_2_0_0: _Any = None
_each_row_3_0_0: _Any = None
_each_row_4_0_0: _Any = None
_each_row_5_0_0: _Any = None
_init_0: _Any = None
_init_1: _Any = None
_init_2: _Any = None
_init_3: _Any = None

def _dispatch_0(self: Instance, a):  # AdmissionBudgetMachine: open --accept-->
    if (((self.waiting + 1) <= self.max_waiting_requests) and ((self.waiting_tokens + a['prompt']) <= self.max_waiting_prompt_tokens)):  # accept@open
        self.waiting, self.waiting_tokens = (self.waiting + 1), (self.waiting_tokens + a['prompt'])
        self._state = 'open'  # accept@open
        return 0
    return -1

def _fire_0(self: Instance, _a_prompt, _a_need, _M=_M, _int=_int):  # AdmissionBudgetMachine: open --accept-->
    if _a_need is not _M:
        return None
    if not ((_a_prompt.__class__ is _int and _a_prompt >= 1)):
        return None
    if ((self.waiting + 1) <= self.max_waiting_requests) and ((self.waiting_tokens + _a_prompt) <= self.max_waiting_prompt_tokens):
        self.waiting, self.waiting_tokens = (self.waiting + 1), (self.waiting_tokens + _a_prompt)
        self._state = 'open'  # accept@open
        self.last_transition = _row_0_0
        return 'open'
    return None

def _dispatch_1(self: Instance, a):  # AdmissionBudgetMachine: open --leave-->
    if ((self.waiting >= 1) and (self.waiting_tokens >= a['prompt'])):  # leave@open
        self.waiting, self.waiting_tokens = (self.waiting - 1), (self.waiting_tokens - a['prompt'])
        self._state = 'open'  # leave@open
        return 0
    return -1

def _fire_1(self: Instance, _a_prompt, _a_need, _M=_M, _int=_int):  # AdmissionBudgetMachine: open --leave-->
    if _a_need is not _M:
        return None
    if not ((_a_prompt.__class__ is _int and _a_prompt >= 1)):
        return None
    if (self.waiting >= 1) and (self.waiting_tokens >= _a_prompt):
        self.waiting, self.waiting_tokens = (self.waiting - 1), (self.waiting_tokens - _a_prompt)
        self._state = 'open'  # leave@open
        self.last_transition = _row_1_0
        return 'open'
    return None

def _dispatch_2(self: Instance, a):  # AdmissionBudgetMachine: open --admit-->
    if ((self.waiting >= 1) and (self.waiting_tokens >= a['prompt']) and ((self.active + 1) <= self.max_sequences) and ((self.active_kv + a['need']) <= self.max_kv_tokens)):  # admit@open
        self.waiting, self.waiting_tokens, self.active, self.active_kv = (self.waiting - 1), (self.waiting_tokens - a['prompt']), (self.active + 1), (self.active_kv + a['need'])
        self._state = 'open'  # admit@open
        return 0
    return -1

def _fire_2(self: Instance, _a_prompt, _a_need, _M=_M, _int=_int):  # AdmissionBudgetMachine: open --admit-->
    if not ((_a_prompt.__class__ is _int and _a_prompt >= 1) and (_a_need.__class__ is _int and _a_need >= 2)):
        return None
    if (self.waiting >= 1) and (self.waiting_tokens >= _a_prompt) and ((self.active + 1) <= self.max_sequences) and ((self.active_kv + _a_need) <= self.max_kv_tokens):
        self.waiting, self.waiting_tokens, self.active, self.active_kv = (self.waiting - 1), (self.waiting_tokens - _a_prompt), (self.active + 1), (self.active_kv + _a_need)
        self._state = 'open'  # admit@open
        self.last_transition = _row_2_0
        return 'open'
    return None

def _dispatch_3(self: Instance, a):  # AdmissionBudgetMachine: open --admit_now-->
    if (((self.waiting + 1) <= self.max_waiting_requests) and ((self.waiting_tokens + a['prompt']) <= self.max_waiting_prompt_tokens) and ((self.active + 1) <= self.max_sequences) and ((self.active_kv + a['need']) <= self.max_kv_tokens)):  # admit_now@open
        self.active, self.active_kv = (self.active + 1), (self.active_kv + a['need'])
        self._state = 'open'  # admit_now@open
        return 0
    return -1

def _fire_3(self: Instance, _a_prompt, _a_need, _M=_M, _int=_int):  # AdmissionBudgetMachine: open --admit_now-->
    if not ((_a_prompt.__class__ is _int and _a_prompt >= 1) and (_a_need.__class__ is _int and _a_need >= 2)):
        return None
    if ((self.waiting + 1) <= self.max_waiting_requests) and ((self.waiting_tokens + _a_prompt) <= self.max_waiting_prompt_tokens) and ((self.active + 1) <= self.max_sequences) and ((self.active_kv + _a_need) <= self.max_kv_tokens):
        self.active, self.active_kv = (self.active + 1), (self.active_kv + _a_need)
        self._state = 'open'  # admit_now@open
        self.last_transition = _row_3_0
        return 'open'
    return None

def _dispatch_4(self: Instance, a):  # AdmissionBudgetMachine: open --release-->
    if ((self.active >= 1) and (self.active_kv >= a['need'])):  # release@open
        self.active, self.active_kv = (self.active - 1), (self.active_kv - a['need'])
        self._state = 'open'  # release@open
        return 0
    return -1

def _fire_4(self: Instance, _a_prompt, _a_need, _M=_M, _int=_int):  # AdmissionBudgetMachine: open --release-->
    if _a_prompt is not _M:
        return None
    if not ((_a_need.__class__ is _int and _a_need >= 2)):
        return None
    if (self.active >= 1) and (self.active_kv >= _a_need):
        self.active, self.active_kv = (self.active - 1), (self.active_kv - _a_need)
        self._state = 'open'  # release@open
        self.last_transition = _row_4_0
        return 'open'
    return None

def _dispatch_5(self: Instance, a):  # AdmissionBudgetMachine: open --refuse-->
    if True:  # refuse@open
        self._state = 'open'  # refuse@open
        return 0
    return -1

def _fire_5(self: Instance, _a_prompt, _a_need, _M=_M, _int=_int):  # AdmissionBudgetMachine: open --refuse-->
    if _a_prompt is not _M or _a_need is not _M:
        return None
    self._state = 'open'  # refuse@open
    self.last_transition = _row_5_0
    return 'open'
    return None

_table: dict[str, dict[str, _Any]] = {
    'open': {'accept': _dispatch_0, 'leave': _dispatch_1, 'admit': _dispatch_2, 'admit_now': _dispatch_3, 'release': _dispatch_4, 'refuse': _dispatch_5},
}

_ft: dict[str, dict[str, _Any]] = {
    'open': {'accept': _fire_0, 'leave': _fire_1, 'admit': _fire_2, 'admit_now': _fire_3, 'release': _fire_4, 'refuse': _fire_5},
}

def _given(prompt, need):  # AdmissionBudgetMachine: the arguments given, as the exact path takes them
    a = {}
    if prompt is not _M:
        a['prompt'] = prompt
    if need is not _M:
        a['need'] = need
    return a

def _each_0(instances: _Sequence[Instance], prompt, need):  # AdmissionBudgetMachine: --accept--> on each instance
    if need is not _M or prompt is _M:
        return _one_by_one(instances, 'accept', {'prompt': prompt, 'need': need}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_prompt in zip(instances, prompt):
        state = self._state
        if state == 'open' and (_a_prompt.__class__ is _int and _a_prompt >= 1):
            if ((self.waiting + 1) <= self.max_waiting_requests) and ((self.waiting_tokens + _a_prompt) <= self.max_waiting_prompt_tokens):
                self.waiting, self.waiting_tokens = (self.waiting + 1), (self.waiting_tokens + _a_prompt)
                self._state = 'open'  # accept@open
                self.last_transition = _each_row_0_0_0
                append('open')
                continue
        append(_exact(self, 'accept', {'prompt': _a_prompt}))
    return targets

def _each_1(instances: _Sequence[Instance], prompt, need):  # AdmissionBudgetMachine: --leave--> on each instance
    if need is not _M or prompt is _M:
        return _one_by_one(instances, 'leave', {'prompt': prompt, 'need': need}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_prompt in zip(instances, prompt):
        state = self._state
        if state == 'open' and (_a_prompt.__class__ is _int and _a_prompt >= 1):
            if (self.waiting >= 1) and (self.waiting_tokens >= _a_prompt):
                self.waiting, self.waiting_tokens = (self.waiting - 1), (self.waiting_tokens - _a_prompt)
                self._state = 'open'  # leave@open
                self.last_transition = _each_row_1_0_0
                append('open')
                continue
        append(_exact(self, 'leave', {'prompt': _a_prompt}))
    return targets

def _each_2(instances: _Sequence[Instance], prompt, need):  # AdmissionBudgetMachine: --admit--> on each instance
    if prompt is _M or need is _M:
        return _one_by_one(instances, 'admit', {'prompt': prompt, 'need': need}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_prompt, _a_need in zip(instances, prompt, need):
        state = self._state
        if state == 'open' and (_a_prompt.__class__ is _int and _a_prompt >= 1) and (_a_need.__class__ is _int and _a_need >= 2):
            if (self.waiting >= 1) and (self.waiting_tokens >= _a_prompt) and ((self.active + 1) <= self.max_sequences) and ((self.active_kv + _a_need) <= self.max_kv_tokens):
                self.waiting, self.waiting_tokens, self.active, self.active_kv = (self.waiting - 1), (self.waiting_tokens - _a_prompt), (self.active + 1), (self.active_kv + _a_need)
                self._state = 'open'  # admit@open
                self.last_transition = _each_row_2_0_0
                append('open')
                continue
        append(_exact(self, 'admit', {'prompt': _a_prompt, 'need': _a_need}))
    return targets

def _each_3(instances: _Sequence[Instance], prompt, need):  # AdmissionBudgetMachine: --admit_now--> on each instance
    if prompt is _M or need is _M:
        return _one_by_one(instances, 'admit_now', {'prompt': prompt, 'need': need}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_prompt, _a_need in zip(instances, prompt, need):
        state = self._state
        if state == 'open' and (_a_prompt.__class__ is _int and _a_prompt >= 1) and (_a_need.__class__ is _int and _a_need >= 2):
            if ((self.waiting + 1) <= self.max_waiting_requests) and ((self.waiting_tokens + _a_prompt) <= self.max_waiting_prompt_tokens) and ((self.active + 1) <= self.max_sequences) and ((self.active_kv + _a_need) <= self.max_kv_tokens):
                self.active, self.active_kv = (self.active + 1), (self.active_kv + _a_need)
                self._state = 'open'  # admit_now@open
                self.last_transition = _each_row_3_0_0
                append('open')
                continue
        append(_exact(self, 'admit_now', {'prompt': _a_prompt, 'need': _a_need}))
    return targets

def _each_4(instances: _Sequence[Instance], prompt, need):  # AdmissionBudgetMachine: --release--> on each instance
    if prompt is not _M or need is _M:
        return _one_by_one(instances, 'release', {'prompt': prompt, 'need': need}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_need in zip(instances, need):
        state = self._state
        if state == 'open' and (_a_need.__class__ is _int and _a_need >= 2):
            if (self.active >= 1) and (self.active_kv >= _a_need):
                self.active, self.active_kv = (self.active - 1), (self.active_kv - _a_need)
                self._state = 'open'  # release@open
                self.last_transition = _each_row_4_0_0
                append('open')
                continue
        append(_exact(self, 'release', {'need': _a_need}))
    return targets

def _each_5(instances: _Sequence[Instance], prompt, need):  # AdmissionBudgetMachine: --refuse--> on each instance
    if prompt is not _M or need is not _M:
        return _one_by_one(instances, 'refuse', {'prompt': prompt, 'need': need}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'open' and True:
            self._state = 'open'  # refuse@open
            self.last_transition = _each_row_5_0_0
            append('open')
            continue
        append(_exact(self, 'refuse', {}))
    return targets

_each: dict[str, _Any] = {'accept': _each_0, 'leave': _each_1, 'admit': _each_2, 'admit_now': _each_3, 'release': _each_4, 'refuse': _each_5}

def fire_each_plain(instances, event, prompt=_M, need=_M):  # AdmissionBudgetMachine
    n = len(instances)
    if prompt is not _M and len(prompt) != n:
        raise ValueError(f'fire_each: prompt has {len(prompt)} values for {n} instances')
    if need is not _M and len(need) != n:
        raise ValueError(f'fire_each: need has {len(need)} values for {n} instances')
    if n == 1:
        self = instances[0]
        prompt = prompt if prompt is _M else prompt[0]
        need = need if need is _M else need[0]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(prompt, need))]
        target = fast(self, prompt, need)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(prompt, need))]
    run = _each.get(event)
    if run is None:
        return _one_by_one(instances, event, {'prompt': prompt, 'need': need}, None)
    return run(instances, prompt, need)

def fire_each_sampled(instances, event, prompt=_M, need=_M):  # AdmissionBudgetMachine
    n = len(instances)
    if prompt is not _M and len(prompt) != n:
        raise ValueError(f'fire_each: prompt has {len(prompt)} values for {n} instances')
    if need is not _M and len(need) != n:
        raise ValueError(f'fire_each: need has {len(need)} values for {n} instances')
    if n == 1:
        self = instances[0]
        prompt = prompt if prompt is _M else prompt[0]
        need = need if need is _M else need[0]
        if next(_draws):
            return [_exact(self, event, _given(prompt, need))]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(prompt, need))]
        target = fast(self, prompt, need)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(prompt, need))]
    run = _each.get(event)
    drawn = list(_islice(_draws, n))
    if run is None:
        return _one_by_one(instances, event, {'prompt': prompt, 'need': need}, drawn)
    if True in drawn:
        return _split(run, instances, event, {'prompt': prompt, 'need': need}, drawn)
    return run(instances, prompt, need)

@_mypyc_attr(allow_interpreted_subclasses=True)
class Instance:
    """AdmissionBudgetMachine's instance: its state, last row, parameters and variables, typed as declared."""

    __slots__ = ('_state', 'last_transition', 'max_sequences', 'max_kv_tokens', 'max_waiting_requests', 'max_waiting_prompt_tokens', 'waiting', 'waiting_tokens', 'active', 'active_kv')

    _state: str
    last_transition: _Any
    max_sequences: int
    max_kv_tokens: int
    max_waiting_requests: int
    max_waiting_prompt_tokens: int
    waiting: int
    waiting_tokens: int
    active: int
    active_kv: int

    def fire_plain(self, event, prompt=_M, need=_M) -> _Any:  # AdmissionBudgetMachine
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(prompt, need))
        target = fast(self, prompt, need)
        if target is not None:
            return target
        return _exact(self, event, _given(prompt, need))

    def fire_sampled(self, event, prompt=_M, need=_M) -> _Any:  # AdmissionBudgetMachine
        if next(_draws):
            return _exact(self, event, _given(prompt, need))
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(prompt, need))
        target = fast(self, prompt, need)
        if target is not None:
            return target
        return _exact(self, event, _given(prompt, need))

    def _check_invariants(self, pre) -> _Any:  # AdmissionBudgetMachine
        broken = []
        if not (self.waiting <= self.max_waiting_requests):
            broken.append(('waiting_within_max_waiting_requests', 'R5.1.2'))
        if not (self.waiting_tokens <= self.max_waiting_prompt_tokens):
            broken.append(('waiting_tokens_within_max_waiting_prompt_tokens', 'R5.1.2'))
        if not (self.active <= self.max_sequences):
            broken.append(('active_within_max_sequences', 'R5.1.2'))
        if not (self.active_kv <= self.max_kv_tokens):
            broken.append(('active_kv_within_max_kv_tokens', 'R5.1.2'))
        if not (self.waiting >= 0):
            broken.append(('bounds_waiting', 'type'))
        if not (self.waiting_tokens >= 0):
            broken.append(('bounds_waiting_tokens', 'type'))
        if not (self.active >= 0):
            broken.append(('bounds_active', 'type'))
        if not (self.active_kv >= 0):
            broken.append(('bounds_active_kv', 'type'))
        return broken

    def __init__(self, *, max_sequences=_MISSING, max_kv_tokens=_MISSING, max_waiting_requests=_MISSING, max_waiting_prompt_tokens=_MISSING, **extra) -> None:  # AdmissionBudgetMachine
        if extra or not ((max_sequences.__class__ is _int and max_sequences >= 1) and (max_kv_tokens.__class__ is _int and max_kv_tokens >= 1) and (max_waiting_requests.__class__ is _int and max_waiting_requests >= 1) and (max_waiting_prompt_tokens.__class__ is _int and max_waiting_prompt_tokens >= 1)):
            return _slow_init(self, extra, max_sequences=max_sequences, max_kv_tokens=max_kv_tokens, max_waiting_requests=max_waiting_requests, max_waiting_prompt_tokens=max_waiting_prompt_tokens)
        self.max_sequences = max_sequences
        self.max_kv_tokens = max_kv_tokens
        self.max_waiting_requests = max_waiting_requests
        self.max_waiting_prompt_tokens = max_waiting_prompt_tokens
        self.waiting = _init_0
        self.waiting_tokens = _init_1
        self.active = _init_2
        self.active_kv = _init_3
        self._state = 'open'
        self.last_transition = None

    def snapshot(self) -> _Any:  # AdmissionBudgetMachine
        copy: Instance = _new(self.__class__)
        copy.max_sequences = self.max_sequences
        copy.max_kv_tokens = self.max_kv_tokens
        copy.max_waiting_requests = self.max_waiting_requests
        copy.max_waiting_prompt_tokens = self.max_waiting_prompt_tokens
        copy.waiting = self.waiting
        copy.waiting_tokens = self.waiting_tokens
        copy.active = self.active
        copy.active_kv = self.active_kv
        copy._state = self._state
        copy.last_transition = self.last_transition
        return copy

fire_plain = Instance.fire_plain
fire_sampled = Instance.fire_sampled
_check_invariants = Instance._check_invariants
__init__ = Instance.__init__
snapshot = Instance.snapshot
_new: _Any = Instance.__new__  # object's, or the compiled class's allocator (no __init__)
