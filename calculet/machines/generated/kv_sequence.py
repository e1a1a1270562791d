"""The generated hot path of KvSequenceMachine — do not edit: regenerate with `python -m calculet.specgen`.

Printed from the z3 terms of the guards and effects declared in calculet.machines.kv_sequence.KvSequenceMachine by
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

DECLARATION = 'calculet.machines.kv_sequence.KvSequenceMachine'
SHAPE = '4825e9d6298fa508'

BINDINGS = {  # name: where the object is found in the declaration (calculet.machines.codegen_module)
    '_row_0_0': ('row', 0),
    '_row_1_0': ('row', 1),
    '_row_2_0': ('row', 2),
    '_row_3_0': ('row', 3),
    '_row_4_0': ('row', 4),
    '_row_5_0': ('row', 5),
    '_row_6_0': ('row', 6),
    '_row_7_0': ('row', 7),
    '_row_8_0': ('row', 8),
    '_row_9_0': ('row', 9),
    '_each_row_0_0_0': ('row', 0),
    '_each_row_1_0_0': ('row', 1),
    '_each_row_1_1_0': ('row', 2),
    '_each_row_2_0_0': ('row', 3),
    '_each_row_2_1_0': ('row', 4),
    '_each_row_3_0_0': ('row', 5),
    '_each_row_4_0_0': ('row', 6),
    '_each_row_4_1_0': ('row', 7),
    '_each_row_5_0_0': ('row', 8),
    '_each_row_6_0_0': ('row', 9),
    '_init_0': ('init', 'seq_id'),
    '_init_1': ('init', 'generation'),
    '_init_2': ('init', 'committed_len'),
    '_init_3': ('init', 'reserved_len'),
}

_row_0_0: _Any = None
_row_1_0: _Any = None
_row_2_0: _Any = None
_row_3_0: _Any = None
_row_4_0: _Any = None
_row_5_0: _Any = None
_row_6_0: _Any = None
_row_7_0: _Any = None
_row_8_0: _Any = None
_row_9_0: _Any = None
_each_row_0_0_0: _Any = None
_each_row_1_0_0: _Any = None
_each_row_1_1_0: _Any = None
_each_row_2_0_0: _Any = None
_each_row_2_1_0: _Any = None
_each_row_3_0_0: _Any = None
_each_row_4_0_0: _Any = None
_each_row_4_1_0: _Any = None
_each_row_5_0_0: _Any = None
_each_row_6_0_0: _Any = None
_init_0: _Any = None
_init_1: _Any = None
_init_2: _Any = None
_init_3: _Any = None

def _dispatch_0(self: Instance, a):  # KvSequenceMachine: free --reserve-->
    if (a['tokens'] <= self.max_seq):  # reserve@free
        self.seq_id, self.generation, self.reserved_len, self.committed_len = a['seq'], a['gen'], a['tokens'], 0
        self._state = 'reserved'  # reserve@free
        return 0
    return -1

def _fire_0(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: free --reserve-->
    if not ((_a_seq.__class__ is _int and _a_seq >= 1) and (_a_gen.__class__ is _int and _a_gen >= 1) and (_a_tokens.__class__ is _int and _a_tokens >= 1)):
        return None
    if (_a_tokens <= self.max_seq):
        self.seq_id, self.generation, self.reserved_len, self.committed_len = _a_seq, _a_gen, _a_tokens, 0
        self._state = 'reserved'  # reserve@free
        self.last_transition = _row_0_0
        return 'reserved'
    return None

def _dispatch_1(self: Instance, a):  # KvSequenceMachine: reserved --commit-->
    if ((self.committed_len + a['tokens']) <= self.reserved_len):  # commit@reserved
        self.committed_len = (self.committed_len + a['tokens'])
        self._state = 'active'  # commit@reserved
        return 0
    return -1

def _fire_1(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: reserved --commit-->
    if _a_seq is not _M or _a_gen is not _M:
        return None
    if not ((_a_tokens.__class__ is _int and _a_tokens >= 1)):
        return None
    if ((self.committed_len + _a_tokens) <= self.reserved_len):
        self.committed_len = (self.committed_len + _a_tokens)
        self._state = 'active'  # commit@reserved
        self.last_transition = _row_1_0
        return 'active'
    return None

def _dispatch_2(self: Instance, a):  # KvSequenceMachine: active --commit-->
    if ((self.committed_len + a['tokens']) <= self.reserved_len):  # commit@active
        self.committed_len = (self.committed_len + a['tokens'])
        self._state = 'active'  # commit@active
        return 0
    return -1

def _fire_2(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: active --commit-->
    if _a_seq is not _M or _a_gen is not _M:
        return None
    if not ((_a_tokens.__class__ is _int and _a_tokens >= 1)):
        return None
    if ((self.committed_len + _a_tokens) <= self.reserved_len):
        self.committed_len = (self.committed_len + _a_tokens)
        self._state = 'active'  # commit@active
        self.last_transition = _row_2_0
        return 'active'
    return None

def _dispatch_3(self: Instance, a):  # KvSequenceMachine: reserved --fault-->
    if True:  # fault@reserved
        self._state = 'unknown'  # fault@reserved
        return 0
    return -1

def _fire_3(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: reserved --fault-->
    if _a_seq is not _M or _a_gen is not _M or _a_tokens is not _M:
        return None
    self._state = 'unknown'  # fault@reserved
    self.last_transition = _row_3_0
    return 'unknown'
    return None

def _dispatch_4(self: Instance, a):  # KvSequenceMachine: active --fault-->
    if True:  # fault@active
        self._state = 'unknown'  # fault@active
        return 0
    return -1

def _fire_4(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: active --fault-->
    if _a_seq is not _M or _a_gen is not _M or _a_tokens is not _M:
        return None
    self._state = 'unknown'  # fault@active
    self.last_transition = _row_4_0
    return 'unknown'
    return None

def _dispatch_5(self: Instance, a):  # KvSequenceMachine: active --remove_tail-->
    if (a['tokens'] < self.committed_len):  # remove_tail@active
        self.committed_len = (self.committed_len - a['tokens'])
        self._state = 'active'  # remove_tail@active
        return 0
    return -1

def _fire_5(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: active --remove_tail-->
    if _a_seq is not _M or _a_gen is not _M:
        return None
    if not ((_a_tokens.__class__ is _int and _a_tokens >= 1)):
        return None
    if (_a_tokens < self.committed_len):
        self.committed_len = (self.committed_len - _a_tokens)
        self._state = 'active'  # remove_tail@active
        self.last_transition = _row_5_0
        return 'active'
    return None

def _dispatch_6(self: Instance, a):  # KvSequenceMachine: reserved --release-->
    if True:  # release@reserved
        self._state = 'releasing'  # release@reserved
        return 0
    return -1

def _fire_6(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: reserved --release-->
    if _a_seq is not _M or _a_gen is not _M or _a_tokens is not _M:
        return None
    self._state = 'releasing'  # release@reserved
    self.last_transition = _row_6_0
    return 'releasing'
    return None

def _dispatch_7(self: Instance, a):  # KvSequenceMachine: active --release-->
    if True:  # release@active
        self._state = 'releasing'  # release@active
        return 0
    return -1

def _fire_7(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: active --release-->
    if _a_seq is not _M or _a_gen is not _M or _a_tokens is not _M:
        return None
    self._state = 'releasing'  # release@active
    self.last_transition = _row_7_0
    return 'releasing'
    return None

def _dispatch_8(self: Instance, a):  # KvSequenceMachine: unknown --recover-->
    if True:  # recover@unknown
        self._state = 'releasing'  # recover@unknown
        return 0
    return -1

def _fire_8(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: unknown --recover-->
    if _a_seq is not _M or _a_gen is not _M or _a_tokens is not _M:
        return None
    self._state = 'releasing'  # recover@unknown
    self.last_transition = _row_8_0
    return 'releasing'
    return None

def _dispatch_9(self: Instance, a):  # KvSequenceMachine: releasing --confirm_release-->
    if True:  # confirm_release@releasing
        self.seq_id, self.generation, self.reserved_len, self.committed_len = 0, 0, 0, 0
        self._state = 'free'  # confirm_release@releasing
        return 0
    return -1

def _fire_9(self: Instance, _a_seq, _a_gen, _a_tokens, _M=_M, _int=_int):  # KvSequenceMachine: releasing --confirm_release-->
    if _a_seq is not _M or _a_gen is not _M or _a_tokens is not _M:
        return None
    self.seq_id, self.generation, self.reserved_len, self.committed_len = 0, 0, 0, 0
    self._state = 'free'  # confirm_release@releasing
    self.last_transition = _row_9_0
    return 'free'
    return None

_table: dict[str, dict[str, _Any]] = {
    'free': {'reserve': _dispatch_0},
    'reserved': {'commit': _dispatch_1, 'fault': _dispatch_3, 'release': _dispatch_6},
    'active': {'commit': _dispatch_2, 'fault': _dispatch_4, 'remove_tail': _dispatch_5, 'release': _dispatch_7},
    'unknown': {'recover': _dispatch_8},
    'releasing': {'confirm_release': _dispatch_9},
}

_ft: dict[str, dict[str, _Any]] = {
    'free': {'reserve': _fire_0},
    'reserved': {'commit': _fire_1, 'fault': _fire_3, 'release': _fire_6},
    'active': {'commit': _fire_2, 'fault': _fire_4, 'remove_tail': _fire_5, 'release': _fire_7},
    'unknown': {'recover': _fire_8},
    'releasing': {'confirm_release': _fire_9},
}

def _given(seq, gen, tokens):  # KvSequenceMachine: the arguments given, as the exact path takes them
    a = {}
    if seq is not _M:
        a['seq'] = seq
    if gen is not _M:
        a['gen'] = gen
    if tokens is not _M:
        a['tokens'] = tokens
    return a

def _each_0(instances: _Sequence[Instance], seq, gen, tokens):  # KvSequenceMachine: --reserve--> on each instance
    if seq is _M or gen is _M or tokens is _M:
        return _one_by_one(instances, 'reserve', {'seq': seq, 'gen': gen, 'tokens': tokens}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_seq, _a_gen, _a_tokens in zip(instances, seq, gen, tokens):
        state = self._state
        if state == 'free' and (_a_seq.__class__ is _int and _a_seq >= 1) and (_a_gen.__class__ is _int and _a_gen >= 1) and (_a_tokens.__class__ is _int and _a_tokens >= 1):
            if (_a_tokens <= self.max_seq):
                self.seq_id, self.generation, self.reserved_len, self.committed_len = _a_seq, _a_gen, _a_tokens, 0
                self._state = 'reserved'  # reserve@free
                self.last_transition = _each_row_0_0_0
                append('reserved')
                continue
        append(_exact(self, 'reserve', {'seq': _a_seq, 'gen': _a_gen, 'tokens': _a_tokens}))
    return targets

def _each_1(instances: _Sequence[Instance], seq, gen, tokens):  # KvSequenceMachine: --commit--> on each instance
    if seq is not _M or gen is not _M or tokens is _M:
        return _one_by_one(instances, 'commit', {'seq': seq, 'gen': gen, 'tokens': tokens}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_tokens in zip(instances, tokens):
        state = self._state
        if state == 'reserved' and (_a_tokens.__class__ is _int and _a_tokens >= 1):
            if ((self.committed_len + _a_tokens) <= self.reserved_len):
                self.committed_len = (self.committed_len + _a_tokens)
                self._state = 'active'  # commit@reserved
                self.last_transition = _each_row_1_0_0
                append('active')
                continue
        elif state == 'active' and (_a_tokens.__class__ is _int and _a_tokens >= 1):
            if ((self.committed_len + _a_tokens) <= self.reserved_len):
                self.committed_len = (self.committed_len + _a_tokens)
                self._state = 'active'  # commit@active
                self.last_transition = _each_row_1_1_0
                append('active')
                continue
        append(_exact(self, 'commit', {'tokens': _a_tokens}))
    return targets

def _each_2(instances: _Sequence[Instance], seq, gen, tokens):  # KvSequenceMachine: --fault--> on each instance
    if seq is not _M or gen is not _M or tokens is not _M:
        return _one_by_one(instances, 'fault', {'seq': seq, 'gen': gen, 'tokens': tokens}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'reserved' and True:
            self._state = 'unknown'  # fault@reserved
            self.last_transition = _each_row_2_0_0
            append('unknown')
            continue
        elif state == 'active' and True:
            self._state = 'unknown'  # fault@active
            self.last_transition = _each_row_2_1_0
            append('unknown')
            continue
        append(_exact(self, 'fault', {}))
    return targets

def _each_3(instances: _Sequence[Instance], seq, gen, tokens):  # KvSequenceMachine: --remove_tail--> on each instance
    if seq is not _M or gen is not _M or tokens is _M:
        return _one_by_one(instances, 'remove_tail', {'seq': seq, 'gen': gen, 'tokens': tokens}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_tokens in zip(instances, tokens):
        state = self._state
        if state == 'active' and (_a_tokens.__class__ is _int and _a_tokens >= 1):
            if (_a_tokens < self.committed_len):
                self.committed_len = (self.committed_len - _a_tokens)
                self._state = 'active'  # remove_tail@active
                self.last_transition = _each_row_3_0_0
                append('active')
                continue
        append(_exact(self, 'remove_tail', {'tokens': _a_tokens}))
    return targets

def _each_4(instances: _Sequence[Instance], seq, gen, tokens):  # KvSequenceMachine: --release--> on each instance
    if seq is not _M or gen is not _M or tokens is not _M:
        return _one_by_one(instances, 'release', {'seq': seq, 'gen': gen, 'tokens': tokens}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'reserved' and True:
            self._state = 'releasing'  # release@reserved
            self.last_transition = _each_row_4_0_0
            append('releasing')
            continue
        elif state == 'active' and True:
            self._state = 'releasing'  # release@active
            self.last_transition = _each_row_4_1_0
            append('releasing')
            continue
        append(_exact(self, 'release', {}))
    return targets

def _each_5(instances: _Sequence[Instance], seq, gen, tokens):  # KvSequenceMachine: --recover--> on each instance
    if seq is not _M or gen is not _M or tokens is not _M:
        return _one_by_one(instances, 'recover', {'seq': seq, 'gen': gen, 'tokens': tokens}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'unknown' and True:
            self._state = 'releasing'  # recover@unknown
            self.last_transition = _each_row_5_0_0
            append('releasing')
            continue
        append(_exact(self, 'recover', {}))
    return targets

def _each_6(instances: _Sequence[Instance], seq, gen, tokens):  # KvSequenceMachine: --confirm_release--> on each instance
    if seq is not _M or gen is not _M or tokens is not _M:
        return _one_by_one(instances, 'confirm_release', {'seq': seq, 'gen': gen, 'tokens': tokens}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'releasing' and True:
            self.seq_id, self.generation, self.reserved_len, self.committed_len = 0, 0, 0, 0
            self._state = 'free'  # confirm_release@releasing
            self.last_transition = _each_row_6_0_0
            append('free')
            continue
        append(_exact(self, 'confirm_release', {}))
    return targets

_each: dict[str, _Any] = {'reserve': _each_0, 'commit': _each_1, 'fault': _each_2, 'remove_tail': _each_3, 'release': _each_4, 'recover': _each_5, 'confirm_release': _each_6}

def fire_each_plain(instances, event, seq=_M, gen=_M, tokens=_M):  # KvSequenceMachine
    n = len(instances)
    if seq is not _M and len(seq) != n:
        raise ValueError(f'fire_each: seq has {len(seq)} values for {n} instances')
    if gen is not _M and len(gen) != n:
        raise ValueError(f'fire_each: gen has {len(gen)} values for {n} instances')
    if tokens is not _M and len(tokens) != n:
        raise ValueError(f'fire_each: tokens has {len(tokens)} values for {n} instances')
    if n == 1:
        self = instances[0]
        seq = seq if seq is _M else seq[0]
        gen = gen if gen is _M else gen[0]
        tokens = tokens if tokens is _M else tokens[0]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(seq, gen, tokens))]
        target = fast(self, seq, gen, tokens)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(seq, gen, tokens))]
    run = _each.get(event)
    if run is None:
        return _one_by_one(instances, event, {'seq': seq, 'gen': gen, 'tokens': tokens}, None)
    return run(instances, seq, gen, tokens)

def fire_each_sampled(instances, event, seq=_M, gen=_M, tokens=_M):  # KvSequenceMachine
    n = len(instances)
    if seq is not _M and len(seq) != n:
        raise ValueError(f'fire_each: seq has {len(seq)} values for {n} instances')
    if gen is not _M and len(gen) != n:
        raise ValueError(f'fire_each: gen has {len(gen)} values for {n} instances')
    if tokens is not _M and len(tokens) != n:
        raise ValueError(f'fire_each: tokens has {len(tokens)} values for {n} instances')
    if n == 1:
        self = instances[0]
        seq = seq if seq is _M else seq[0]
        gen = gen if gen is _M else gen[0]
        tokens = tokens if tokens is _M else tokens[0]
        if next(_draws):
            return [_exact(self, event, _given(seq, gen, tokens))]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(seq, gen, tokens))]
        target = fast(self, seq, gen, tokens)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(seq, gen, tokens))]
    run = _each.get(event)
    drawn = list(_islice(_draws, n))
    if run is None:
        return _one_by_one(instances, event, {'seq': seq, 'gen': gen, 'tokens': tokens}, drawn)
    if True in drawn:
        return _split(run, instances, event, {'seq': seq, 'gen': gen, 'tokens': tokens}, drawn)
    return run(instances, seq, gen, tokens)

@_mypyc_attr(allow_interpreted_subclasses=True)
class Instance:
    """KvSequenceMachine's instance: its state, last row, parameters and variables, typed as declared."""

    __slots__ = ('_state', 'last_transition', 'max_seq', 'lane', 'seq_id', 'generation', 'committed_len', 'reserved_len')

    _state: str
    last_transition: _Any
    max_seq: int
    lane: int
    seq_id: int
    generation: int
    committed_len: int
    reserved_len: int

    def fire_plain(self, event, seq=_M, gen=_M, tokens=_M) -> _Any:  # KvSequenceMachine
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(seq, gen, tokens))
        target = fast(self, seq, gen, tokens)
        if target is not None:
            return target
        return _exact(self, event, _given(seq, gen, tokens))

    def fire_sampled(self, event, seq=_M, gen=_M, tokens=_M) -> _Any:  # KvSequenceMachine
        if next(_draws):
            return _exact(self, event, _given(seq, gen, tokens))
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(seq, gen, tokens))
        target = fast(self, seq, gen, tokens)
        if target is not None:
            return target
        return _exact(self, event, _given(seq, gen, tokens))

    def _check_invariants(self, pre) -> _Any:  # KvSequenceMachine
        broken = []
        if not ((self.committed_len <= self.reserved_len) and (self.reserved_len <= self.max_seq)):
            broken.append(('lengths_ordered', 'R9.2.3'))
        if not ((not ((self._state == 'free'))) or ((self.seq_id == 0) and (self.generation == 0) and (self.reserved_len == 0) and (self.committed_len == 0))):
            broken.append(('free_is_empty', 'R9.2.2'))
        if not ((not (not ((self._state == 'free')))) or ((self.seq_id >= 1) and (self.generation >= 1) and (self.reserved_len >= 1))):
            broken.append(('held_lane_has_owner', 'R9.2.1'))
        if not (((not ((self._state == 'reserved'))) or (self.committed_len == 0)) and ((not ((self._state == 'active'))) or (self.committed_len >= 1))):
            broken.append(('reserved_has_nothing_committed', 'R9.2.4'))
        if not (self.seq_id >= 0):
            broken.append(('bounds_seq_id', 'type'))
        if not (self.generation >= 0):
            broken.append(('bounds_generation', 'type'))
        if not (self.committed_len >= 0):
            broken.append(('bounds_committed_len', 'type'))
        if not (self.reserved_len >= 0):
            broken.append(('bounds_reserved_len', 'type'))
        if pre is not None:
            if not ((not ((not ((pre._state == 'free'))) and (not ((self._state == 'free'))))) or ((self.seq_id == pre.seq_id) and (self.generation == pre.generation))):
                broken.append(('owner_fixed_while_held', 'R9.2.1'))
            if not ((not (((self._state == 'free')) and (not ((pre._state == 'free'))))) or ((pre._state == 'releasing'))):
                broken.append(('free_only_after_confirmed_release', 'R9.2.2'))
            if not ((not ((pre._state == 'unknown'))) or (((self._state == 'unknown')) or ((self._state == 'releasing')))):
                broken.append(('unknown_is_quarantined', 'R9.2.6'))
        return broken

    def __init__(self, *, max_seq=_MISSING, lane=_MISSING, **extra) -> None:  # KvSequenceMachine
        if extra or not ((max_seq.__class__ is _int and max_seq >= 1) and (lane.__class__ is _int and lane >= 0)):
            return _slow_init(self, extra, max_seq=max_seq, lane=lane)
        self.max_seq = max_seq
        self.lane = lane
        self.seq_id = _init_0
        self.generation = _init_1
        self.committed_len = _init_2
        self.reserved_len = _init_3
        self._state = 'free'
        self.last_transition = None

    def snapshot(self) -> _Any:  # KvSequenceMachine
        copy: Instance = _new(self.__class__)
        copy.max_seq = self.max_seq
        copy.lane = self.lane
        copy.seq_id = self.seq_id
        copy.generation = self.generation
        copy.committed_len = self.committed_len
        copy.reserved_len = self.reserved_len
        copy._state = self._state
        copy.last_transition = self.last_transition
        return copy

fire_plain = Instance.fire_plain
fire_sampled = Instance.fire_sampled
_check_invariants = Instance._check_invariants
__init__ = Instance.__init__
snapshot = Instance.snapshot
_new: _Any = Instance.__new__  # object's, or the compiled class's allocator (no __init__)
