"""The generated hot path of ModelMachine — do not edit: regenerate with `python -m calculet.specgen`.

Printed from the z3 terms of the guards and effects declared in calculet.machines.model.ModelMachine by
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

DECLARATION = 'calculet.machines.model.ModelMachine'
SHAPE = 'ae3fdda0a399a388'

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
    '_row_10_0': ('row', 10),
    '_row_11_0': ('row', 11),
    '_row_12_0': ('row', 12),
    '_row_13_0': ('row', 13),
    '_row_14_0': ('row', 14),
    '_row_14_1': ('row', 15),
    '_row_15_0': ('row', 16),
    '_row_16_0': ('row', 17),
    '_row_17_0': ('row', 18),
    '_row_18_0': ('row', 19),
    '_row_19_0': ('row', 20),
    '_row_19_1': ('row', 21),
    '_row_20_0': ('row', 22),
    '_row_21_0': ('row', 23),
    '_row_22_0': ('row', 24),
    '_row_23_0': ('row', 25),
    '_each_row_0_0_0': ('row', 0),
    '_each_row_1_0_0': ('row', 1),
    '_each_row_2_0_0': ('row', 2),
    '_each_row_3_0_0': ('row', 3),
    '_each_row_4_0_0': ('row', 4),
    '_each_row_4_1_0': ('row', 5),
    '_each_row_4_2_0': ('row', 6),
    '_each_row_5_0_0': ('row', 7),
    '_each_row_6_0_0': ('row', 8),
    '_each_row_6_1_0': ('row', 9),
    '_each_row_6_2_0': ('row', 10),
    '_each_row_6_3_0': ('row', 11),
    '_each_row_7_0_0': ('row', 12),
    '_each_row_7_1_0': ('row', 13),
    '_each_row_7_2_0': ('row', 14),
    '_each_row_7_2_1': ('row', 15),
    '_each_row_8_0_0': ('row', 16),
    '_each_row_9_0_0': ('row', 17),
    '_each_row_10_0_0': ('row', 18),
    '_each_row_10_1_0': ('row', 19),
    '_each_row_11_0_0': ('row', 20),
    '_each_row_11_0_1': ('row', 21),
    '_each_row_12_0_0': ('row', 22),
    '_each_row_13_0_0': ('row', 23),
    '_each_row_14_0_0': ('row', 24),
    '_each_row_15_0_0': ('row', 25),
    '_init_0': ('init', 'active_requests'),
    '_init_1': ('init', 'buffers'),
    '_init_2': ('init', 'unload_pending'),
    '_init_3': ('init', 'replacing'),
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
_row_10_0: _Any = None
_row_11_0: _Any = None
_row_12_0: _Any = None
_row_13_0: _Any = None
_row_14_0: _Any = None
_row_14_1: _Any = None
_row_15_0: _Any = None
_row_16_0: _Any = None
_row_17_0: _Any = None
_row_18_0: _Any = None
_row_19_0: _Any = None
_row_19_1: _Any = None
_row_20_0: _Any = None
_row_21_0: _Any = None
_row_22_0: _Any = None
_row_23_0: _Any = None
_each_row_0_0_0: _Any = None
_each_row_1_0_0: _Any = None
_each_row_2_0_0: _Any = None
_each_row_3_0_0: _Any = None
_each_row_4_0_0: _Any = None
_each_row_4_1_0: _Any = None
_each_row_4_2_0: _Any = None
_each_row_5_0_0: _Any = None
_each_row_6_0_0: _Any = None
_each_row_6_1_0: _Any = None
_each_row_6_2_0: _Any = None
_each_row_6_3_0: _Any = None
_each_row_7_0_0: _Any = None
_each_row_7_1_0: _Any = None
_each_row_7_2_0: _Any = None
_each_row_7_2_1: _Any = None
_each_row_8_0_0: _Any = None
_each_row_9_0_0: _Any = None
_each_row_10_0_0: _Any = None
_each_row_10_1_0: _Any = None
_each_row_11_0_0: _Any = None
_each_row_11_0_1: _Any = None
_each_row_12_0_0: _Any = None
_each_row_13_0_0: _Any = None
_each_row_14_0_0: _Any = None
_each_row_15_0_0: _Any = None
_init_0: _Any = None
_init_1: _Any = None
_init_2: _Any = None
_init_3: _Any = None

def _dispatch_0(self: Instance, a):  # ModelMachine: unloaded --load-->
    if True:  # load@unloaded
        self._state = 'validating'  # load@unloaded
        return 0
    return -1

def _fire_0(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: unloaded --load-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self._state = 'validating'  # load@unloaded
    self.last_transition = _row_0_0
    return 'validating'
    return None

def _dispatch_1(self: Instance, a):  # ModelMachine: validating --validated-->
    if True:  # validated@validating
        self._state = 'configuring'  # validated@validating
        return 0
    return -1

def _fire_1(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: validating --validated-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self._state = 'configuring'  # validated@validating
    self.last_transition = _row_1_0
    return 'configuring'
    return None

def _dispatch_2(self: Instance, a):  # ModelMachine: configuring --configured-->
    if True:  # configured@configuring
        self.buffers = True
        self._state = 'warming'  # configured@configuring
        return 0
    return -1

def _fire_2(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: configuring --configured-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self.buffers = True
    self._state = 'warming'  # configured@configuring
    self.last_transition = _row_2_0
    return 'warming'
    return None

def _dispatch_3(self: Instance, a):  # ModelMachine: warming --warmed-->
    if True:  # warmed@warming
        self._state = 'ready'  # warmed@warming
        return 0
    return -1

def _fire_3(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: warming --warmed-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self._state = 'ready'  # warmed@warming
    self.last_transition = _row_3_0
    return 'ready'
    return None

def _dispatch_4(self: Instance, a):  # ModelMachine: validating --load_failed-->
    if True:  # load_failed@validating
        self._state = 'unloaded'  # load_failed@validating
        return 0
    return -1

def _fire_4(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: validating --load_failed-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self._state = 'unloaded'  # load_failed@validating
    self.last_transition = _row_4_0
    return 'unloaded'
    return None

def _dispatch_5(self: Instance, a):  # ModelMachine: configuring --load_failed-->
    if True:  # load_failed@configuring
        self.buffers = True
        self._state = 'unloading'  # load_failed@configuring
        return 0
    return -1

def _fire_5(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: configuring --load_failed-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self.buffers = True
    self._state = 'unloading'  # load_failed@configuring
    self.last_transition = _row_5_0
    return 'unloading'
    return None

def _dispatch_6(self: Instance, a):  # ModelMachine: warming --load_failed-->
    if True:  # load_failed@warming
        self.buffers = True
        self._state = 'unloading'  # load_failed@warming
        return 0
    return -1

def _fire_6(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: warming --load_failed-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self.buffers = True
    self._state = 'unloading'  # load_failed@warming
    self.last_transition = _row_6_0
    return 'unloading'
    return None

def _dispatch_7(self: Instance, a):  # ModelMachine: ready --acquire-->
    if True:  # acquire@ready
        self.active_requests = (self.active_requests + 1)
        self._state = 'ready'  # acquire@ready
        return 0
    return -1

def _fire_7(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: ready --acquire-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self.active_requests = (self.active_requests + 1)
    self._state = 'ready'  # acquire@ready
    self.last_transition = _row_7_0
    return 'ready'
    return None

def _dispatch_8(self: Instance, a):  # ModelMachine: ready --release_request-->
    if (self.active_requests >= 1):  # release_request@ready
        self.active_requests = (self.active_requests - 1)
        self._state = 'ready'  # release_request@ready
        return 0
    return -1

def _fire_8(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: ready --release_request-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    if (self.active_requests >= 1):
        self.active_requests = (self.active_requests - 1)
        self._state = 'ready'  # release_request@ready
        self.last_transition = _row_8_0
        return 'ready'
    return None

def _dispatch_9(self: Instance, a):  # ModelMachine: draining --release_request-->
    if (self.active_requests >= 1):  # release_request@draining
        self.active_requests = (self.active_requests - 1)
        self._state = 'draining'  # release_request@draining
        return 0
    return -1

def _fire_9(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: draining --release_request-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    if (self.active_requests >= 1):
        self.active_requests = (self.active_requests - 1)
        self._state = 'draining'  # release_request@draining
        self.last_transition = _row_9_0
        return 'draining'
    return None

def _dispatch_10(self: Instance, a):  # ModelMachine: recovering --release_request-->
    if (self.active_requests >= 1):  # release_request@recovering
        self.active_requests = (self.active_requests - 1)
        self._state = 'recovering'  # release_request@recovering
        return 0
    return -1

def _fire_10(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: recovering --release_request-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    if (self.active_requests >= 1):
        self.active_requests = (self.active_requests - 1)
        self._state = 'recovering'  # release_request@recovering
        self.last_transition = _row_10_0
        return 'recovering'
    return None

def _dispatch_11(self: Instance, a):  # ModelMachine: failed --release_request-->
    if (self.active_requests >= 1):  # release_request@failed
        self.active_requests = (self.active_requests - 1)
        self._state = 'failed'  # release_request@failed
        return 0
    return -1

def _fire_11(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: failed --release_request-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    if (self.active_requests >= 1):
        self.active_requests = (self.active_requests - 1)
        self._state = 'failed'  # release_request@failed
        self.last_transition = _row_11_0
        return 'failed'
    return None

def _dispatch_12(self: Instance, a):  # ModelMachine: ready --drain-->
    if True:  # drain@ready
        self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else a['replace'])
        self._state = 'draining'  # drain@ready
        return 0
    return -1

def _fire_12(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: ready --drain-->
    if not ((_a_replace is True or _a_replace is False) and (_a_inflight.__class__ is _int and _a_inflight >= 0)):
        return None
    self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else _a_replace)
    self._state = 'draining'  # drain@ready
    self.last_transition = _row_12_0
    return 'draining'
    return None

def _dispatch_13(self: Instance, a):  # ModelMachine: recovering --drain-->
    if True:  # drain@recovering
        self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else a['replace'])
        self._state = 'recovering'  # drain@recovering
        return 0
    return -1

def _fire_13(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: recovering --drain-->
    if not ((_a_replace is True or _a_replace is False) and (_a_inflight.__class__ is _int and _a_inflight >= 0)):
        return None
    self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else _a_replace)
    self._state = 'recovering'  # drain@recovering
    self.last_transition = _row_13_0
    return 'recovering'
    return None

def _dispatch_14(self: Instance, a):  # ModelMachine: failed --drain-->
    if ((self.active_requests >= 1) or (a['inflight'] >= 1)):  # drain@failed
        self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else a['replace'])
        self._state = 'failed'  # drain@failed
        return 0
    if ((self.active_requests == 0) and (a['inflight'] == 0)):  # unload_failed
        self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else a['replace'])
        self._state = 'unloading'  # unload_failed
        return 1
    return -1

def _fire_14(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: failed --drain-->
    if not ((_a_replace is True or _a_replace is False) and (_a_inflight.__class__ is _int and _a_inflight >= 0)):
        return None
    if ((self.active_requests >= 1) or (_a_inflight >= 1)):
        self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else _a_replace)
        self._state = 'failed'  # drain@failed
        self.last_transition = _row_14_0
        return 'failed'
    if (self.active_requests == 0) and (_a_inflight == 0):
        self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else _a_replace)
        self._state = 'unloading'  # unload_failed
        self.last_transition = _row_14_1
        return 'unloading'
    return None

def _dispatch_15(self: Instance, a):  # ModelMachine: draining --drained-->
    if ((self.active_requests == 0) and (a['inflight'] == 0)):  # drained@draining
        self._state = 'unloading'  # drained@draining
        return 0
    return -1

def _fire_15(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: draining --drained-->
    if _a_replace is not _M:
        return None
    if not ((_a_inflight.__class__ is _int and _a_inflight >= 0)):
        return None
    if (self.active_requests == 0) and (_a_inflight == 0):
        self._state = 'unloading'  # drained@draining
        self.last_transition = _row_15_0
        return 'unloading'
    return None

def _dispatch_16(self: Instance, a):  # ModelMachine: draining --drain_deadline-->
    if (a['inflight'] >= 1):  # drain_deadline@draining
        self._state = 'recovering'  # drain_deadline@draining
        return 0
    return -1

def _fire_16(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: draining --drain_deadline-->
    if _a_replace is not _M:
        return None
    if not ((_a_inflight.__class__ is _int and _a_inflight >= 0)):
        return None
    if (_a_inflight >= 1):
        self._state = 'recovering'  # drain_deadline@draining
        self.last_transition = _row_16_0
        return 'recovering'
    return None

def _dispatch_17(self: Instance, a):  # ModelMachine: ready --fault-->
    if True:  # fault@ready
        self._state = 'recovering'  # fault@ready
        return 0
    return -1

def _fire_17(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: ready --fault-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self._state = 'recovering'  # fault@ready
    self.last_transition = _row_17_0
    return 'recovering'
    return None

def _dispatch_18(self: Instance, a):  # ModelMachine: draining --fault-->
    if True:  # fault@draining
        self._state = 'recovering'  # fault@draining
        return 0
    return -1

def _fire_18(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: draining --fault-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self._state = 'recovering'  # fault@draining
    self.last_transition = _row_18_0
    return 'recovering'
    return None

def _dispatch_19(self: Instance, a):  # ModelMachine: recovering --recovered-->
    if ((a['inflight'] == 0) and (not self.unload_pending)):  # recovered@recovering
        self._state = 'ready'  # recovered@recovering
        return 0
    if ((a['inflight'] == 0) and self.unload_pending):  # recovered@recovering->draining
        self._state = 'draining'  # recovered@recovering->draining
        return 1
    return -1

def _fire_19(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: recovering --recovered-->
    if _a_replace is not _M:
        return None
    if not ((_a_inflight.__class__ is _int and _a_inflight >= 0)):
        return None
    _g0 = (_a_inflight == 0)
    _g1 = self.unload_pending
    if _g0:
        if (not _g1):
            self._state = 'ready'  # recovered@recovering
            self.last_transition = _row_19_0
            return 'ready'
        if _g1:
            self._state = 'draining'  # recovered@recovering->draining
            self.last_transition = _row_19_1
            return 'draining'
    return None

def _dispatch_20(self: Instance, a):  # ModelMachine: recovering --give_up-->
    if True:  # give_up@recovering
        self._state = 'failed'  # give_up@recovering
        return 0
    return -1

def _fire_20(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: recovering --give_up-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    self._state = 'failed'  # give_up@recovering
    self.last_transition = _row_20_0
    return 'failed'
    return None

def _dispatch_21(self: Instance, a):  # ModelMachine: recovering --resume_unload-->
    if ((a['inflight'] == 0) and (self.active_requests == 0)):  # resume_unload@recovering
        self._state = 'unloading'  # resume_unload@recovering
        return 0
    return -1

def _fire_21(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: recovering --resume_unload-->
    if _a_replace is not _M:
        return None
    if not ((_a_inflight.__class__ is _int and _a_inflight >= 0)):
        return None
    if (_a_inflight == 0) and (self.active_requests == 0):
        self._state = 'unloading'  # resume_unload@recovering
        self.last_transition = _row_21_0
        return 'unloading'
    return None

def _dispatch_22(self: Instance, a):  # ModelMachine: unloading --freed-->
    if self.buffers:  # freed@unloading
        self.buffers = False
        self._state = 'unloading'  # freed@unloading
        return 0
    return -1

def _fire_22(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: unloading --freed-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    if self.buffers:
        self.buffers = False
        self._state = 'unloading'  # freed@unloading
        self.last_transition = _row_22_0
        return 'unloading'
    return None

def _dispatch_23(self: Instance, a):  # ModelMachine: unloading --verified-->
    if (not self.buffers):  # verified@unloading
        self.unload_pending, self.replacing = False, False
        self._state = 'unloaded'  # verified@unloading
        return 0
    return -1

def _fire_23(self: Instance, _a_replace, _a_inflight, _M=_M, _int=_int):  # ModelMachine: unloading --verified-->
    if _a_replace is not _M or _a_inflight is not _M:
        return None
    if (not self.buffers):
        self.unload_pending, self.replacing = False, False
        self._state = 'unloaded'  # verified@unloading
        self.last_transition = _row_23_0
        return 'unloaded'
    return None

_table: dict[str, dict[str, _Any]] = {
    'unloaded': {'load': _dispatch_0},
    'validating': {'validated': _dispatch_1, 'load_failed': _dispatch_4},
    'configuring': {'configured': _dispatch_2, 'load_failed': _dispatch_5},
    'warming': {'warmed': _dispatch_3, 'load_failed': _dispatch_6},
    'ready': {'acquire': _dispatch_7, 'release_request': _dispatch_8, 'drain': _dispatch_12, 'fault': _dispatch_17},
    'draining': {'release_request': _dispatch_9, 'drained': _dispatch_15, 'drain_deadline': _dispatch_16, 'fault': _dispatch_18},
    'recovering': {'release_request': _dispatch_10, 'drain': _dispatch_13, 'recovered': _dispatch_19, 'give_up': _dispatch_20, 'resume_unload': _dispatch_21},
    'failed': {'release_request': _dispatch_11, 'drain': _dispatch_14},
    'unloading': {'freed': _dispatch_22, 'verified': _dispatch_23},
}

_ft: dict[str, dict[str, _Any]] = {
    'unloaded': {'load': _fire_0},
    'validating': {'validated': _fire_1, 'load_failed': _fire_4},
    'configuring': {'configured': _fire_2, 'load_failed': _fire_5},
    'warming': {'warmed': _fire_3, 'load_failed': _fire_6},
    'ready': {'acquire': _fire_7, 'release_request': _fire_8, 'drain': _fire_12, 'fault': _fire_17},
    'draining': {'release_request': _fire_9, 'drained': _fire_15, 'drain_deadline': _fire_16, 'fault': _fire_18},
    'recovering': {'release_request': _fire_10, 'drain': _fire_13, 'recovered': _fire_19, 'give_up': _fire_20, 'resume_unload': _fire_21},
    'failed': {'release_request': _fire_11, 'drain': _fire_14},
    'unloading': {'freed': _fire_22, 'verified': _fire_23},
}

def _given(replace, inflight):  # ModelMachine: the arguments given, as the exact path takes them
    a = {}
    if replace is not _M:
        a['replace'] = replace
    if inflight is not _M:
        a['inflight'] = inflight
    return a

def _each_0(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --load--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'load', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'unloaded' and True:
            self._state = 'validating'  # load@unloaded
            self.last_transition = _each_row_0_0_0
            append('validating')
            continue
        append(_exact(self, 'load', {}))
    return targets

def _each_1(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --validated--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'validated', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'validating' and True:
            self._state = 'configuring'  # validated@validating
            self.last_transition = _each_row_1_0_0
            append('configuring')
            continue
        append(_exact(self, 'validated', {}))
    return targets

def _each_2(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --configured--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'configured', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'configuring' and True:
            self.buffers = True
            self._state = 'warming'  # configured@configuring
            self.last_transition = _each_row_2_0_0
            append('warming')
            continue
        append(_exact(self, 'configured', {}))
    return targets

def _each_3(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --warmed--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'warmed', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'warming' and True:
            self._state = 'ready'  # warmed@warming
            self.last_transition = _each_row_3_0_0
            append('ready')
            continue
        append(_exact(self, 'warmed', {}))
    return targets

def _each_4(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --load_failed--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'load_failed', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'validating' and True:
            self._state = 'unloaded'  # load_failed@validating
            self.last_transition = _each_row_4_0_0
            append('unloaded')
            continue
        elif state == 'configuring' and True:
            self.buffers = True
            self._state = 'unloading'  # load_failed@configuring
            self.last_transition = _each_row_4_1_0
            append('unloading')
            continue
        elif state == 'warming' and True:
            self.buffers = True
            self._state = 'unloading'  # load_failed@warming
            self.last_transition = _each_row_4_2_0
            append('unloading')
            continue
        append(_exact(self, 'load_failed', {}))
    return targets

def _each_5(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --acquire--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'acquire', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'ready' and True:
            self.active_requests = (self.active_requests + 1)
            self._state = 'ready'  # acquire@ready
            self.last_transition = _each_row_5_0_0
            append('ready')
            continue
        append(_exact(self, 'acquire', {}))
    return targets

def _each_6(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --release_request--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'release_request', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'ready' and True:
            if (self.active_requests >= 1):
                self.active_requests = (self.active_requests - 1)
                self._state = 'ready'  # release_request@ready
                self.last_transition = _each_row_6_0_0
                append('ready')
                continue
        elif state == 'draining' and True:
            if (self.active_requests >= 1):
                self.active_requests = (self.active_requests - 1)
                self._state = 'draining'  # release_request@draining
                self.last_transition = _each_row_6_1_0
                append('draining')
                continue
        elif state == 'recovering' and True:
            if (self.active_requests >= 1):
                self.active_requests = (self.active_requests - 1)
                self._state = 'recovering'  # release_request@recovering
                self.last_transition = _each_row_6_2_0
                append('recovering')
                continue
        elif state == 'failed' and True:
            if (self.active_requests >= 1):
                self.active_requests = (self.active_requests - 1)
                self._state = 'failed'  # release_request@failed
                self.last_transition = _each_row_6_3_0
                append('failed')
                continue
        append(_exact(self, 'release_request', {}))
    return targets

def _each_7(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --drain--> on each instance
    if replace is _M or inflight is _M:
        return _one_by_one(instances, 'drain', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_replace, _a_inflight in zip(instances, replace, inflight):
        state = self._state
        if state == 'ready' and (_a_replace is True or _a_replace is False) and (_a_inflight.__class__ is _int and _a_inflight >= 0):
            self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else _a_replace)
            self._state = 'draining'  # drain@ready
            self.last_transition = _each_row_7_0_0
            append('draining')
            continue
        elif state == 'recovering' and (_a_replace is True or _a_replace is False) and (_a_inflight.__class__ is _int and _a_inflight >= 0):
            self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else _a_replace)
            self._state = 'recovering'  # drain@recovering
            self.last_transition = _each_row_7_1_0
            append('recovering')
            continue
        elif state == 'failed' and (_a_replace is True or _a_replace is False) and (_a_inflight.__class__ is _int and _a_inflight >= 0):
            if ((self.active_requests >= 1) or (_a_inflight >= 1)):
                self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else _a_replace)
                self._state = 'failed'  # drain@failed
                self.last_transition = _each_row_7_2_0
                append('failed')
                continue
            if (self.active_requests == 0) and (_a_inflight == 0):
                self.unload_pending, self.replacing = True, (self.replacing if self.unload_pending else _a_replace)
                self._state = 'unloading'  # unload_failed
                self.last_transition = _each_row_7_2_1
                append('unloading')
                continue
        append(_exact(self, 'drain', {'replace': _a_replace, 'inflight': _a_inflight}))
    return targets

def _each_8(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --drained--> on each instance
    if replace is not _M or inflight is _M:
        return _one_by_one(instances, 'drained', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_inflight in zip(instances, inflight):
        state = self._state
        if state == 'draining' and (_a_inflight.__class__ is _int and _a_inflight >= 0):
            if (self.active_requests == 0) and (_a_inflight == 0):
                self._state = 'unloading'  # drained@draining
                self.last_transition = _each_row_8_0_0
                append('unloading')
                continue
        append(_exact(self, 'drained', {'inflight': _a_inflight}))
    return targets

def _each_9(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --drain_deadline--> on each instance
    if replace is not _M or inflight is _M:
        return _one_by_one(instances, 'drain_deadline', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_inflight in zip(instances, inflight):
        state = self._state
        if state == 'draining' and (_a_inflight.__class__ is _int and _a_inflight >= 0):
            if (_a_inflight >= 1):
                self._state = 'recovering'  # drain_deadline@draining
                self.last_transition = _each_row_9_0_0
                append('recovering')
                continue
        append(_exact(self, 'drain_deadline', {'inflight': _a_inflight}))
    return targets

def _each_10(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --fault--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'fault', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'ready' and True:
            self._state = 'recovering'  # fault@ready
            self.last_transition = _each_row_10_0_0
            append('recovering')
            continue
        elif state == 'draining' and True:
            self._state = 'recovering'  # fault@draining
            self.last_transition = _each_row_10_1_0
            append('recovering')
            continue
        append(_exact(self, 'fault', {}))
    return targets

def _each_11(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --recovered--> on each instance
    if replace is not _M or inflight is _M:
        return _one_by_one(instances, 'recovered', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_inflight in zip(instances, inflight):
        state = self._state
        if state == 'recovering' and (_a_inflight.__class__ is _int and _a_inflight >= 0):
            _g0 = (_a_inflight == 0)
            _g1 = self.unload_pending
            if _g0:
                if (not _g1):
                    self._state = 'ready'  # recovered@recovering
                    self.last_transition = _each_row_11_0_0
                    append('ready')
                    continue
                if _g1:
                    self._state = 'draining'  # recovered@recovering->draining
                    self.last_transition = _each_row_11_0_1
                    append('draining')
                    continue
        append(_exact(self, 'recovered', {'inflight': _a_inflight}))
    return targets

def _each_12(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --give_up--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'give_up', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'recovering' and True:
            self._state = 'failed'  # give_up@recovering
            self.last_transition = _each_row_12_0_0
            append('failed')
            continue
        append(_exact(self, 'give_up', {}))
    return targets

def _each_13(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --resume_unload--> on each instance
    if replace is not _M or inflight is _M:
        return _one_by_one(instances, 'resume_unload', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_inflight in zip(instances, inflight):
        state = self._state
        if state == 'recovering' and (_a_inflight.__class__ is _int and _a_inflight >= 0):
            if (_a_inflight == 0) and (self.active_requests == 0):
                self._state = 'unloading'  # resume_unload@recovering
                self.last_transition = _each_row_13_0_0
                append('unloading')
                continue
        append(_exact(self, 'resume_unload', {'inflight': _a_inflight}))
    return targets

def _each_14(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --freed--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'freed', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'unloading' and True:
            if self.buffers:
                self.buffers = False
                self._state = 'unloading'  # freed@unloading
                self.last_transition = _each_row_14_0_0
                append('unloading')
                continue
        append(_exact(self, 'freed', {}))
    return targets

def _each_15(instances: _Sequence[Instance], replace, inflight):  # ModelMachine: --verified--> on each instance
    if replace is not _M or inflight is not _M:
        return _one_by_one(instances, 'verified', {'replace': replace, 'inflight': inflight}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'unloading' and True:
            if (not self.buffers):
                self.unload_pending, self.replacing = False, False
                self._state = 'unloaded'  # verified@unloading
                self.last_transition = _each_row_15_0_0
                append('unloaded')
                continue
        append(_exact(self, 'verified', {}))
    return targets

_each: dict[str, _Any] = {'load': _each_0, 'validated': _each_1, 'configured': _each_2, 'warmed': _each_3, 'load_failed': _each_4, 'acquire': _each_5, 'release_request': _each_6, 'drain': _each_7, 'drained': _each_8, 'drain_deadline': _each_9, 'fault': _each_10, 'recovered': _each_11, 'give_up': _each_12, 'resume_unload': _each_13, 'freed': _each_14, 'verified': _each_15}

def fire_each_plain(instances, event, replace=_M, inflight=_M):  # ModelMachine
    n = len(instances)
    if replace is not _M and len(replace) != n:
        raise ValueError(f'fire_each: replace has {len(replace)} values for {n} instances')
    if inflight is not _M and len(inflight) != n:
        raise ValueError(f'fire_each: inflight has {len(inflight)} values for {n} instances')
    if n == 1:
        self = instances[0]
        replace = replace if replace is _M else replace[0]
        inflight = inflight if inflight is _M else inflight[0]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(replace, inflight))]
        target = fast(self, replace, inflight)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(replace, inflight))]
    run = _each.get(event)
    if run is None:
        return _one_by_one(instances, event, {'replace': replace, 'inflight': inflight}, None)
    return run(instances, replace, inflight)

def fire_each_sampled(instances, event, replace=_M, inflight=_M):  # ModelMachine
    n = len(instances)
    if replace is not _M and len(replace) != n:
        raise ValueError(f'fire_each: replace has {len(replace)} values for {n} instances')
    if inflight is not _M and len(inflight) != n:
        raise ValueError(f'fire_each: inflight has {len(inflight)} values for {n} instances')
    if n == 1:
        self = instances[0]
        replace = replace if replace is _M else replace[0]
        inflight = inflight if inflight is _M else inflight[0]
        if next(_draws):
            return [_exact(self, event, _given(replace, inflight))]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(replace, inflight))]
        target = fast(self, replace, inflight)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(replace, inflight))]
    run = _each.get(event)
    drawn = list(_islice(_draws, n))
    if run is None:
        return _one_by_one(instances, event, {'replace': replace, 'inflight': inflight}, drawn)
    if True in drawn:
        return _split(run, instances, event, {'replace': replace, 'inflight': inflight}, drawn)
    return run(instances, replace, inflight)

@_mypyc_attr(allow_interpreted_subclasses=True)
class Instance:
    """ModelMachine's instance: its state, last row, parameters and variables, typed as declared."""

    __slots__ = ('_state', 'last_transition', 'generation', 'active_requests', 'buffers', 'unload_pending', 'replacing')

    _state: str
    last_transition: _Any
    generation: int
    active_requests: int
    buffers: bool
    unload_pending: bool
    replacing: bool

    def fire_plain(self, event, replace=_M, inflight=_M) -> _Any:  # ModelMachine
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(replace, inflight))
        target = fast(self, replace, inflight)
        if target is not None:
            return target
        return _exact(self, event, _given(replace, inflight))

    def fire_sampled(self, event, replace=_M, inflight=_M) -> _Any:  # ModelMachine
        if next(_draws):
            return _exact(self, event, _given(replace, inflight))
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(replace, inflight))
        target = fast(self, replace, inflight)
        if target is not None:
            return target
        return _exact(self, event, _given(replace, inflight))

    def _check_invariants(self, pre) -> _Any:  # ModelMachine
        broken = []
        if not ((not ((self._state == 'warming') or (self._state == 'ready') or (self._state == 'draining') or (self._state == 'recovering') or (self._state == 'failed'))) or self.buffers):
            broken.append(('serving_has_resources', 'R3.3'))
        if not (((not ((self._state == 'unloaded') or (self._state == 'validating') or (self._state == 'configuring'))) or (not self.buffers)) and ((not ((self._state == 'unloaded') or (self._state == 'validating') or (self._state == 'configuring') or (self._state == 'warming'))) or (self.active_requests == 0))):
            broken.append(('unloaded_is_clean', 'R12.9'))
        if not ((not ((self._state == 'unloading'))) or (self.active_requests == 0)):
            broken.append(('unloading_is_idle', 'R12.3'))
        if not (((not self.replacing) or self.unload_pending) and ((not ((self._state == 'draining'))) or self.unload_pending) and ((not ((self._state == 'unloaded') or (self._state == 'validating') or (self._state == 'configuring') or (self._state == 'warming') or (self._state == 'ready'))) or (not self.unload_pending))):
            broken.append(('unload_is_never_undone', 'R12.2'))
        if not (self.active_requests >= 0):
            broken.append(('bounds_active_requests', 'type'))
        if pre is not None:
            if not ((not (pre.unload_pending and self.unload_pending)) or (self.replacing == pre.replacing)):
                broken.append(('drain_cause_is_fixed', 'R11.5'))
            if not ((not (self.active_requests > pre.active_requests)) or ((pre._state == 'ready'))):
                broken.append(('admission_only_when_ready', 'R12.2'))
        return broken

    def __init__(self, *, generation=_MISSING, **extra) -> None:  # ModelMachine
        if extra or not ((generation.__class__ is _int and generation >= 1)):
            return _slow_init(self, extra, generation=generation)
        self.generation = generation
        self.active_requests = _init_0
        self.buffers = _init_1
        self.unload_pending = _init_2
        self.replacing = _init_3
        self._state = 'unloaded'
        self.last_transition = None

    def snapshot(self) -> _Any:  # ModelMachine
        copy: Instance = _new(self.__class__)
        copy.generation = self.generation
        copy.active_requests = self.active_requests
        copy.buffers = self.buffers
        copy.unload_pending = self.unload_pending
        copy.replacing = self.replacing
        copy._state = self._state
        copy.last_transition = self.last_transition
        return copy

fire_plain = Instance.fire_plain
fire_sampled = Instance.fire_sampled
_check_invariants = Instance._check_invariants
__init__ = Instance.__init__
snapshot = Instance.snapshot
_new: _Any = Instance.__new__  # object's, or the compiled class's allocator (no __init__)
