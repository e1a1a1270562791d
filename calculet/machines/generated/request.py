"""The generated hot path of RequestMachine — do not edit: regenerate with `python -m calculet.specgen`.

Printed from the z3 terms of the guards and effects declared in calculet.machines.request.RequestMachine by
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

DECLARATION = 'calculet.machines.request.RequestMachine'
SHAPE = '95c16b1233c4019e'

BINDINGS = {  # name: where the object is found in the declaration (calculet.machines.codegen_module)
    '_row_0_0': ('row', 0),
    '_row_1_0': ('row', 1),
    '_row_2_0': ('row', 2),
    '_row_3_0': ('row', 3),
    '_row_4_0': ('row', 4),
    '_enum_FinishReason': ('enum', 'var', 'finish_reason'),
    '_row_5_0': ('row', 5),
    '_row_6_0': ('row', 6),
    '_row_7_0': ('row', 7),
    '_row_8_0': ('row', 8),
    '_row_9_0': ('row', 9),
    '_row_9_1': ('row', 10),
    '_row_9_2': ('row', 11),
    '_row_9_3': ('row', 12),
    '_row_9_4': ('row', 13),
    '_row_10_0': ('row', 14),
    '_row_11_0': ('row', 15),
    '_row_11_1': ('row', 16),
    '_row_11_2': ('row', 17),
    '_row_11_3': ('row', 18),
    '_row_11_4': ('row', 19),
    '_row_12_0': ('row', 20),
    '_row_13_0': ('row', 21),
    '_row_14_0': ('row', 22),
    '_row_15_0': ('row', 23),
    '_row_16_0': ('row', 24),
    '_row_17_0': ('row', 25),
    '_row_18_0': ('row', 26),
    '_row_19_0': ('row', 27),
    '_row_20_0': ('row', 28),
    '_row_21_0': ('row', 29),
    '_row_22_0': ('row', 30),
    '_row_23_0': ('row', 31),
    '_row_24_0': ('row', 32),
    '_row_25_0': ('row', 33),
    '_row_26_0': ('row', 34),
    '_row_27_0': ('row', 35),
    '_row_28_0': ('row', 36),
    '_row_29_0': ('row', 37),
    '_row_30_0': ('row', 38),
    '_row_31_0': ('row', 39),
    '_row_32_0': ('row', 40),
    '_row_33_0': ('row', 41),
    '_each_row_0_0_0': ('row', 0),
    '_each_row_1_0_0': ('row', 1),
    '_each_row_1_1_0': ('row', 2),
    '_each_row_2_0_0': ('row', 3),
    '_each_row_3_0_0': ('row', 4),
    '_each_row_4_0_0': ('row', 5),
    '_each_row_4_1_0': ('row', 6),
    '_each_row_4_2_0': ('row', 7),
    '_each_row_5_0_0': ('row', 8),
    '_each_row_6_0_0': ('row', 9),
    '_each_row_6_0_1': ('row', 10),
    '_each_row_6_0_2': ('row', 11),
    '_each_row_6_0_3': ('row', 12),
    '_each_row_6_0_4': ('row', 13),
    '_each_row_7_0_0': ('row', 14),
    '_each_row_8_0_0': ('row', 15),
    '_each_row_8_0_1': ('row', 16),
    '_each_row_8_0_2': ('row', 17),
    '_each_row_8_0_3': ('row', 18),
    '_each_row_8_0_4': ('row', 19),
    '_each_row_9_0_0': ('row', 20),
    '_each_row_10_0_0': ('row', 21),
    '_each_row_10_1_0': ('row', 22),
    '_each_row_10_2_0': ('row', 23),
    '_each_row_10_3_0': ('row', 24),
    '_each_row_10_4_0': ('row', 25),
    '_each_row_10_5_0': ('row', 26),
    '_each_row_10_6_0': ('row', 27),
    '_each_row_10_7_0': ('row', 28),
    '_each_row_11_0_0': ('row', 29),
    '_each_row_11_1_0': ('row', 30),
    '_each_row_11_2_0': ('row', 31),
    '_each_row_11_3_0': ('row', 32),
    '_each_row_11_4_0': ('row', 33),
    '_each_row_11_5_0': ('row', 34),
    '_each_row_11_6_0': ('row', 35),
    '_each_row_12_0_0': ('row', 36),
    '_each_row_12_1_0': ('row', 37),
    '_each_row_12_2_0': ('row', 38),
    '_each_row_12_3_0': ('row', 39),
    '_each_row_12_4_0': ('row', 40),
    '_each_row_12_5_0': ('row', 41),
    '_init_0': ('init', 'generation'),
    '_init_1': ('init', 'job_id'),
    '_init_2': ('init', 'generated_tokens'),
    '_init_3': ('init', 'kv_length'),
    '_init_4': ('init', 'cancel_requested'),
    '_init_5': ('init', 'deadline_passed'),
    '_init_6': ('init', 'finish_reason'),
    '_init_7': ('init', 'closes'),
}

_row_0_0: _Any = None
_row_1_0: _Any = None
_row_2_0: _Any = None
_row_3_0: _Any = None
_row_4_0: _Any = None
_enum_FinishReason: _Any = None
_row_5_0: _Any = None
_row_6_0: _Any = None
_row_7_0: _Any = None
_row_8_0: _Any = None
_row_9_0: _Any = None
_row_9_1: _Any = None
_row_9_2: _Any = None
_row_9_3: _Any = None
_row_9_4: _Any = None
_row_10_0: _Any = None
_row_11_0: _Any = None
_row_11_1: _Any = None
_row_11_2: _Any = None
_row_11_3: _Any = None
_row_11_4: _Any = None
_row_12_0: _Any = None
_row_13_0: _Any = None
_row_14_0: _Any = None
_row_15_0: _Any = None
_row_16_0: _Any = None
_row_17_0: _Any = None
_row_18_0: _Any = None
_row_19_0: _Any = None
_row_20_0: _Any = None
_row_21_0: _Any = None
_row_22_0: _Any = None
_row_23_0: _Any = None
_row_24_0: _Any = None
_row_25_0: _Any = None
_row_26_0: _Any = None
_row_27_0: _Any = None
_row_28_0: _Any = None
_row_29_0: _Any = None
_row_30_0: _Any = None
_row_31_0: _Any = None
_row_32_0: _Any = None
_row_33_0: _Any = None
_each_row_0_0_0: _Any = None
_each_row_1_0_0: _Any = None
_each_row_1_1_0: _Any = None
_each_row_2_0_0: _Any = None
_each_row_3_0_0: _Any = None
_each_row_4_0_0: _Any = None
_each_row_4_1_0: _Any = None
_each_row_4_2_0: _Any = None
_each_row_5_0_0: _Any = None
_each_row_6_0_0: _Any = None
_each_row_6_0_1: _Any = None
_each_row_6_0_2: _Any = None
_each_row_6_0_3: _Any = None
_each_row_6_0_4: _Any = None
_each_row_7_0_0: _Any = None
_each_row_8_0_0: _Any = None
_each_row_8_0_1: _Any = None
_each_row_8_0_2: _Any = None
_each_row_8_0_3: _Any = None
_each_row_8_0_4: _Any = None
_each_row_9_0_0: _Any = None
_each_row_10_0_0: _Any = None
_each_row_10_1_0: _Any = None
_each_row_10_2_0: _Any = None
_each_row_10_3_0: _Any = None
_each_row_10_4_0: _Any = None
_each_row_10_5_0: _Any = None
_each_row_10_6_0: _Any = None
_each_row_10_7_0: _Any = None
_each_row_11_0_0: _Any = None
_each_row_11_1_0: _Any = None
_each_row_11_2_0: _Any = None
_each_row_11_3_0: _Any = None
_each_row_11_4_0: _Any = None
_each_row_11_5_0: _Any = None
_each_row_11_6_0: _Any = None
_each_row_12_0_0: _Any = None
_each_row_12_1_0: _Any = None
_each_row_12_2_0: _Any = None
_each_row_12_3_0: _Any = None
_each_row_12_4_0: _Any = None
_each_row_12_5_0: _Any = None
_init_0: _Any = None
_init_1: _Any = None
_init_2: _Any = None
_init_3: _Any = None
_init_4: _Any = None
_init_5: _Any = None
_init_6: _Any = None
_init_7: _Any = None

def _dispatch_0(self: Instance, a):  # RequestMachine: new --wait_model-->
    if True:  # wait_model@new
        self._state = 'waiting_model'  # wait_model@new
        return 0
    return -1

def _fire_0(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: new --wait_model-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self._state = 'waiting_model'  # wait_model@new
    self.last_transition = _row_0_0
    return 'waiting_model'
    return None

def _dispatch_1(self: Instance, a):  # RequestMachine: new --bind-->
    if True:  # bind@new
        self.generation = a['gen']
        self._state = 'waiting_admission'  # bind@new
        return 0
    return -1

def _fire_1(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: new --bind-->
    if _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    if not ((_a_gen.__class__ is _int and _a_gen >= 1)):
        return None
    self.generation = _a_gen
    self._state = 'waiting_admission'  # bind@new
    self.last_transition = _row_1_0
    return 'waiting_admission'
    return None

def _dispatch_2(self: Instance, a):  # RequestMachine: waiting_model --bind-->
    if True:  # bind@waiting_model
        self.generation = a['gen']
        self._state = 'waiting_admission'  # bind@waiting_model
        return 0
    return -1

def _fire_2(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_model --bind-->
    if _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    if not ((_a_gen.__class__ is _int and _a_gen >= 1)):
        return None
    self.generation = _a_gen
    self._state = 'waiting_admission'  # bind@waiting_model
    self.last_transition = _row_2_0
    return 'waiting_admission'
    return None

def _dispatch_3(self: Instance, a):  # RequestMachine: waiting_admission --admit-->
    if ((self.prompt_tokens + self.max_new_tokens) <= self.max_seq):  # admit@waiting_admission
        self._state = 'prefill_ready'  # admit@waiting_admission
        return 0
    return -1

def _fire_3(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_admission --admit-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    if ((self.prompt_tokens + self.max_new_tokens) <= self.max_seq):
        self._state = 'prefill_ready'  # admit@waiting_admission
        self.last_transition = _row_3_0
        return 'prefill_ready'
    return None

def _dispatch_4(self: Instance, a):  # RequestMachine: new --admit_now-->
    if ((self.prompt_tokens + self.max_new_tokens) <= self.max_seq):  # admit_now@new
        self.generation = a['gen']
        self._state = 'prefill_ready'  # admit_now@new
        return 0
    return -1

def _fire_4(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: new --admit_now-->
    if _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    if not ((_a_gen.__class__ is _int and _a_gen >= 1)):
        return None
    if ((self.prompt_tokens + self.max_new_tokens) <= self.max_seq):
        self.generation = _a_gen
        self._state = 'prefill_ready'  # admit_now@new
        self.last_transition = _row_4_0
        return 'prefill_ready'
    return None

def _dispatch_5(self: Instance, a):  # RequestMachine: new --reject-->
    if True:  # reject@new
        self.finish_reason, self.closes = _enum_FinishReason(6), 1
        self._state = 'failed'  # reject@new
        return 0
    return -1

def _fire_5(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: new --reject-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(6), 1
    self._state = 'failed'  # reject@new
    self.last_transition = _row_5_0
    return 'failed'
    return None

def _dispatch_6(self: Instance, a):  # RequestMachine: waiting_model --reject-->
    if True:  # reject@waiting_model
        self.finish_reason, self.closes = _enum_FinishReason(6), 1
        self._state = 'failed'  # reject@waiting_model
        return 0
    return -1

def _fire_6(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_model --reject-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(6), 1
    self._state = 'failed'  # reject@waiting_model
    self.last_transition = _row_6_0
    return 'failed'
    return None

def _dispatch_7(self: Instance, a):  # RequestMachine: waiting_admission --reject-->
    if True:  # reject@waiting_admission
        self.finish_reason, self.closes = _enum_FinishReason(6), 1
        self._state = 'failed'  # reject@waiting_admission
        return 0
    return -1

def _fire_7(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_admission --reject-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(6), 1
    self._state = 'failed'  # reject@waiting_admission
    self.last_transition = _row_7_0
    return 'failed'
    return None

def _dispatch_8(self: Instance, a):  # RequestMachine: prefill_ready --submit_prefill-->
    if True:  # submit_prefill@prefill_ready
        self.job_id = a['job']
        self._state = 'prefill_running'  # submit_prefill@prefill_ready
        return 0
    return -1

def _fire_8(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: prefill_ready --submit_prefill-->
    if _a_gen is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    if not ((_a_job.__class__ is _int and _a_job >= 1)):
        return None
    self.job_id = _a_job
    self._state = 'prefill_running'  # submit_prefill@prefill_ready
    self.last_transition = _row_8_0
    return 'prefill_running'
    return None

def _dispatch_9(self: Instance, a):  # RequestMachine: prefill_running --prefill_done-->
    if ((a['job'] == self.job_id) and self.cancel_requested):  # prefill_done_cancelled
        self.job_id, self.cancel_requested, self.deadline_passed, self.finish_reason, self.closes = 0, False, False, _enum_FinishReason(3), 1
        self._state = 'cancelled'  # prefill_done_cancelled
        return 0
    if ((a['job'] == self.job_id) and (not self.cancel_requested) and self.deadline_passed):  # prefill_done_deadline
        self.job_id, self.deadline_passed, self.finish_reason, self.closes = 0, False, _enum_FinishReason(5), 1
        self._state = 'failed'  # prefill_done_deadline
        return 1
    if ((a['job'] == self.job_id) and ((not self.cancel_requested) and (not self.deadline_passed)) and (not a['ok'])):  # prefill_done_error
        self.job_id, self.finish_reason, self.closes = 0, _enum_FinishReason(4), 1
        self._state = 'failed'  # prefill_done_error
        return 2
    if ((a['job'] == self.job_id) and ((not self.cancel_requested) and (not self.deadline_passed)) and a['ok'] and (a['stop'] or ((self.generated_tokens + 1) >= self.max_new_tokens))):  # prefill_done_finish
        self.generated_tokens, self.kv_length, self.job_id, self.finish_reason = 1, self.prompt_tokens, 0, _enum_FinishReason((1 if a['stop'] else 2))
        self._state = 'finishing'  # prefill_done_finish
        return 3
    if ((a['job'] == self.job_id) and ((not self.cancel_requested) and (not self.deadline_passed)) and a['ok'] and (not a['stop']) and (not ((self.generated_tokens + 1) >= self.max_new_tokens))):  # prefill_done_continue
        self.generated_tokens, self.kv_length, self.job_id = 1, self.prompt_tokens, 0
        self._state = 'decode_ready'  # prefill_done_continue
        return 4
    return -1

def _fire_9(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: prefill_running --prefill_done-->
    if _a_gen is not _M:
        return None
    if not ((_a_job.__class__ is _int and _a_job >= 1) and (_a_ok is True or _a_ok is False) and (_a_stop is True or _a_stop is False)):
        return None
    _g0 = (_a_job == self.job_id)
    _g1 = self.cancel_requested
    _g2 = self.deadline_passed
    _g3 = ((self.generated_tokens + 1) >= self.max_new_tokens)
    if _g0:
        if _g1:
            self.job_id, self.cancel_requested, self.deadline_passed, self.finish_reason, self.closes = 0, False, False, _enum_FinishReason(3), 1
            self._state = 'cancelled'  # prefill_done_cancelled
            self.last_transition = _row_9_0
            return 'cancelled'
        if (not _g1):
            if _g2:
                self.job_id, self.deadline_passed, self.finish_reason, self.closes = 0, False, _enum_FinishReason(5), 1
                self._state = 'failed'  # prefill_done_deadline
                self.last_transition = _row_9_1
                return 'failed'
            if (not _g2):
                if (not _a_ok):
                    self.job_id, self.finish_reason, self.closes = 0, _enum_FinishReason(4), 1
                    self._state = 'failed'  # prefill_done_error
                    self.last_transition = _row_9_2
                    return 'failed'
                if _a_ok:
                    if (_a_stop or _g3):
                        self.generated_tokens, self.kv_length, self.job_id, self.finish_reason = 1, self.prompt_tokens, 0, _enum_FinishReason((1 if _a_stop else 2))
                        self._state = 'finishing'  # prefill_done_finish
                        self.last_transition = _row_9_3
                        return 'finishing'
                    if (not _a_stop) and (not _g3):
                        self.generated_tokens, self.kv_length, self.job_id = 1, self.prompt_tokens, 0
                        self._state = 'decode_ready'  # prefill_done_continue
                        self.last_transition = _row_9_4
                        return 'decode_ready'
    return None

def _dispatch_10(self: Instance, a):  # RequestMachine: decode_ready --submit_decode-->
    if True:  # submit_decode@decode_ready
        self.job_id = a['job']
        self._state = 'decode_running'  # submit_decode@decode_ready
        return 0
    return -1

def _fire_10(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: decode_ready --submit_decode-->
    if _a_gen is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    if not ((_a_job.__class__ is _int and _a_job >= 1)):
        return None
    self.job_id = _a_job
    self._state = 'decode_running'  # submit_decode@decode_ready
    self.last_transition = _row_10_0
    return 'decode_running'
    return None

def _dispatch_11(self: Instance, a):  # RequestMachine: decode_running --decode_done-->
    if ((a['job'] == self.job_id) and self.cancel_requested):  # decode_done_cancelled
        self.job_id, self.cancel_requested, self.deadline_passed, self.finish_reason, self.closes = 0, False, False, _enum_FinishReason(3), 1
        self._state = 'cancelled'  # decode_done_cancelled
        return 0
    if ((a['job'] == self.job_id) and (not self.cancel_requested) and self.deadline_passed):  # decode_done_deadline
        self.job_id, self.deadline_passed, self.finish_reason, self.closes = 0, False, _enum_FinishReason(5), 1
        self._state = 'failed'  # decode_done_deadline
        return 1
    if ((a['job'] == self.job_id) and ((not self.cancel_requested) and (not self.deadline_passed)) and (not a['ok'])):  # decode_done_error
        self.job_id, self.finish_reason, self.closes = 0, _enum_FinishReason(4), 1
        self._state = 'failed'  # decode_done_error
        return 2
    if ((a['job'] == self.job_id) and ((not self.cancel_requested) and (not self.deadline_passed)) and a['ok'] and (a['stop'] or ((self.generated_tokens + 1) >= self.max_new_tokens))):  # decode_done_finish
        self.generated_tokens, self.kv_length, self.job_id, self.finish_reason = (self.generated_tokens + 1), (self.kv_length + 1), 0, _enum_FinishReason((1 if a['stop'] else 2))
        self._state = 'finishing'  # decode_done_finish
        return 3
    if ((a['job'] == self.job_id) and ((not self.cancel_requested) and (not self.deadline_passed)) and a['ok'] and (not a['stop']) and (not ((self.generated_tokens + 1) >= self.max_new_tokens))):  # decode_done_continue
        self.generated_tokens, self.kv_length, self.job_id = (self.generated_tokens + 1), (self.kv_length + 1), 0
        self._state = 'decode_ready'  # decode_done_continue
        return 4
    return -1

def _fire_11(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: decode_running --decode_done-->
    if _a_gen is not _M:
        return None
    if not ((_a_job.__class__ is _int and _a_job >= 1) and (_a_ok is True or _a_ok is False) and (_a_stop is True or _a_stop is False)):
        return None
    _g0 = (_a_job == self.job_id)
    _g1 = self.cancel_requested
    _g2 = self.deadline_passed
    _g3 = ((self.generated_tokens + 1) >= self.max_new_tokens)
    if _g0:
        if _g1:
            self.job_id, self.cancel_requested, self.deadline_passed, self.finish_reason, self.closes = 0, False, False, _enum_FinishReason(3), 1
            self._state = 'cancelled'  # decode_done_cancelled
            self.last_transition = _row_11_0
            return 'cancelled'
        if (not _g1):
            if _g2:
                self.job_id, self.deadline_passed, self.finish_reason, self.closes = 0, False, _enum_FinishReason(5), 1
                self._state = 'failed'  # decode_done_deadline
                self.last_transition = _row_11_1
                return 'failed'
            if (not _g2):
                if (not _a_ok):
                    self.job_id, self.finish_reason, self.closes = 0, _enum_FinishReason(4), 1
                    self._state = 'failed'  # decode_done_error
                    self.last_transition = _row_11_2
                    return 'failed'
                if _a_ok:
                    if (_a_stop or _g3):
                        self.generated_tokens, self.kv_length, self.job_id, self.finish_reason = (self.generated_tokens + 1), (self.kv_length + 1), 0, _enum_FinishReason((1 if _a_stop else 2))
                        self._state = 'finishing'  # decode_done_finish
                        self.last_transition = _row_11_3
                        return 'finishing'
                    if (not _a_stop) and (not _g3):
                        self.generated_tokens, self.kv_length, self.job_id = (self.generated_tokens + 1), (self.kv_length + 1), 0
                        self._state = 'decode_ready'  # decode_done_continue
                        self.last_transition = _row_11_4
                        return 'decode_ready'
    return None

def _dispatch_12(self: Instance, a):  # RequestMachine: finishing --close-->
    if True:  # close@finishing
        self.closes = 1
        self._state = 'completed'  # close@finishing
        return 0
    return -1

def _fire_12(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: finishing --close-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.closes = 1
    self._state = 'completed'  # close@finishing
    self.last_transition = _row_12_0
    return 'completed'
    return None

def _dispatch_13(self: Instance, a):  # RequestMachine: new --cancel-->
    if True:  # cancel@new
        self.finish_reason, self.closes = _enum_FinishReason(3), 1
        self._state = 'cancelled'  # cancel@new
        return 0
    return -1

def _fire_13(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: new --cancel-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(3), 1
    self._state = 'cancelled'  # cancel@new
    self.last_transition = _row_13_0
    return 'cancelled'
    return None

def _dispatch_14(self: Instance, a):  # RequestMachine: waiting_model --cancel-->
    if True:  # cancel@waiting_model
        self.finish_reason, self.closes = _enum_FinishReason(3), 1
        self._state = 'cancelled'  # cancel@waiting_model
        return 0
    return -1

def _fire_14(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_model --cancel-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(3), 1
    self._state = 'cancelled'  # cancel@waiting_model
    self.last_transition = _row_14_0
    return 'cancelled'
    return None

def _dispatch_15(self: Instance, a):  # RequestMachine: waiting_admission --cancel-->
    if True:  # cancel@waiting_admission
        self.finish_reason, self.closes = _enum_FinishReason(3), 1
        self._state = 'cancelled'  # cancel@waiting_admission
        return 0
    return -1

def _fire_15(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_admission --cancel-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(3), 1
    self._state = 'cancelled'  # cancel@waiting_admission
    self.last_transition = _row_15_0
    return 'cancelled'
    return None

def _dispatch_16(self: Instance, a):  # RequestMachine: prefill_ready --cancel-->
    if True:  # cancel@prefill_ready
        self.finish_reason, self.closes = _enum_FinishReason(3), 1
        self._state = 'cancelled'  # cancel@prefill_ready
        return 0
    return -1

def _fire_16(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: prefill_ready --cancel-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(3), 1
    self._state = 'cancelled'  # cancel@prefill_ready
    self.last_transition = _row_16_0
    return 'cancelled'
    return None

def _dispatch_17(self: Instance, a):  # RequestMachine: decode_ready --cancel-->
    if True:  # cancel@decode_ready
        self.finish_reason, self.closes = _enum_FinishReason(3), 1
        self._state = 'cancelled'  # cancel@decode_ready
        return 0
    return -1

def _fire_17(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: decode_ready --cancel-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(3), 1
    self._state = 'cancelled'  # cancel@decode_ready
    self.last_transition = _row_17_0
    return 'cancelled'
    return None

def _dispatch_18(self: Instance, a):  # RequestMachine: finishing --cancel-->
    if True:  # cancel@finishing
        self.finish_reason, self.closes = _enum_FinishReason(3), 1
        self._state = 'cancelled'  # cancel@finishing
        return 0
    return -1

def _fire_18(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: finishing --cancel-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(3), 1
    self._state = 'cancelled'  # cancel@finishing
    self.last_transition = _row_18_0
    return 'cancelled'
    return None

def _dispatch_19(self: Instance, a):  # RequestMachine: prefill_running --cancel-->
    if True:  # cancel@prefill_running
        self.cancel_requested = True
        self._state = 'prefill_running'  # cancel@prefill_running
        return 0
    return -1

def _fire_19(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: prefill_running --cancel-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.cancel_requested = True
    self._state = 'prefill_running'  # cancel@prefill_running
    self.last_transition = _row_19_0
    return 'prefill_running'
    return None

def _dispatch_20(self: Instance, a):  # RequestMachine: decode_running --cancel-->
    if True:  # cancel@decode_running
        self.cancel_requested = True
        self._state = 'decode_running'  # cancel@decode_running
        return 0
    return -1

def _fire_20(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: decode_running --cancel-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.cancel_requested = True
    self._state = 'decode_running'  # cancel@decode_running
    self.last_transition = _row_20_0
    return 'decode_running'
    return None

def _dispatch_21(self: Instance, a):  # RequestMachine: new --expire-->
    if True:  # expire@new
        self.finish_reason, self.closes = _enum_FinishReason(5), 1
        self._state = 'failed'  # expire@new
        return 0
    return -1

def _fire_21(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: new --expire-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(5), 1
    self._state = 'failed'  # expire@new
    self.last_transition = _row_21_0
    return 'failed'
    return None

def _dispatch_22(self: Instance, a):  # RequestMachine: waiting_model --expire-->
    if True:  # expire@waiting_model
        self.finish_reason, self.closes = _enum_FinishReason(5), 1
        self._state = 'failed'  # expire@waiting_model
        return 0
    return -1

def _fire_22(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_model --expire-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(5), 1
    self._state = 'failed'  # expire@waiting_model
    self.last_transition = _row_22_0
    return 'failed'
    return None

def _dispatch_23(self: Instance, a):  # RequestMachine: waiting_admission --expire-->
    if True:  # expire@waiting_admission
        self.finish_reason, self.closes = _enum_FinishReason(5), 1
        self._state = 'failed'  # expire@waiting_admission
        return 0
    return -1

def _fire_23(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_admission --expire-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(5), 1
    self._state = 'failed'  # expire@waiting_admission
    self.last_transition = _row_23_0
    return 'failed'
    return None

def _dispatch_24(self: Instance, a):  # RequestMachine: prefill_ready --expire-->
    if True:  # expire@prefill_ready
        self.finish_reason, self.closes = _enum_FinishReason(5), 1
        self._state = 'failed'  # expire@prefill_ready
        return 0
    return -1

def _fire_24(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: prefill_ready --expire-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(5), 1
    self._state = 'failed'  # expire@prefill_ready
    self.last_transition = _row_24_0
    return 'failed'
    return None

def _dispatch_25(self: Instance, a):  # RequestMachine: decode_ready --expire-->
    if True:  # expire@decode_ready
        self.finish_reason, self.closes = _enum_FinishReason(5), 1
        self._state = 'failed'  # expire@decode_ready
        return 0
    return -1

def _fire_25(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: decode_ready --expire-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(5), 1
    self._state = 'failed'  # expire@decode_ready
    self.last_transition = _row_25_0
    return 'failed'
    return None

def _dispatch_26(self: Instance, a):  # RequestMachine: prefill_running --expire-->
    if True:  # expire@prefill_running
        self.deadline_passed = True
        self._state = 'prefill_running'  # expire@prefill_running
        return 0
    return -1

def _fire_26(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: prefill_running --expire-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.deadline_passed = True
    self._state = 'prefill_running'  # expire@prefill_running
    self.last_transition = _row_26_0
    return 'prefill_running'
    return None

def _dispatch_27(self: Instance, a):  # RequestMachine: decode_running --expire-->
    if True:  # expire@decode_running
        self.deadline_passed = True
        self._state = 'decode_running'  # expire@decode_running
        return 0
    return -1

def _fire_27(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: decode_running --expire-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.deadline_passed = True
    self._state = 'decode_running'  # expire@decode_running
    self.last_transition = _row_27_0
    return 'decode_running'
    return None

def _dispatch_28(self: Instance, a):  # RequestMachine: new --fail-->
    if True:  # fail@new
        self.finish_reason, self.closes = _enum_FinishReason(4), 1
        self._state = 'failed'  # fail@new
        return 0
    return -1

def _fire_28(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: new --fail-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(4), 1
    self._state = 'failed'  # fail@new
    self.last_transition = _row_28_0
    return 'failed'
    return None

def _dispatch_29(self: Instance, a):  # RequestMachine: waiting_model --fail-->
    if True:  # fail@waiting_model
        self.finish_reason, self.closes = _enum_FinishReason(4), 1
        self._state = 'failed'  # fail@waiting_model
        return 0
    return -1

def _fire_29(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_model --fail-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(4), 1
    self._state = 'failed'  # fail@waiting_model
    self.last_transition = _row_29_0
    return 'failed'
    return None

def _dispatch_30(self: Instance, a):  # RequestMachine: waiting_admission --fail-->
    if True:  # fail@waiting_admission
        self.finish_reason, self.closes = _enum_FinishReason(4), 1
        self._state = 'failed'  # fail@waiting_admission
        return 0
    return -1

def _fire_30(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: waiting_admission --fail-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(4), 1
    self._state = 'failed'  # fail@waiting_admission
    self.last_transition = _row_30_0
    return 'failed'
    return None

def _dispatch_31(self: Instance, a):  # RequestMachine: prefill_ready --fail-->
    if True:  # fail@prefill_ready
        self.finish_reason, self.closes = _enum_FinishReason(4), 1
        self._state = 'failed'  # fail@prefill_ready
        return 0
    return -1

def _fire_31(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: prefill_ready --fail-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(4), 1
    self._state = 'failed'  # fail@prefill_ready
    self.last_transition = _row_31_0
    return 'failed'
    return None

def _dispatch_32(self: Instance, a):  # RequestMachine: decode_ready --fail-->
    if True:  # fail@decode_ready
        self.finish_reason, self.closes = _enum_FinishReason(4), 1
        self._state = 'failed'  # fail@decode_ready
        return 0
    return -1

def _fire_32(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: decode_ready --fail-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(4), 1
    self._state = 'failed'  # fail@decode_ready
    self.last_transition = _row_32_0
    return 'failed'
    return None

def _dispatch_33(self: Instance, a):  # RequestMachine: finishing --fail-->
    if True:  # fail@finishing
        self.finish_reason, self.closes = _enum_FinishReason(4), 1
        self._state = 'failed'  # fail@finishing
        return 0
    return -1

def _fire_33(self: Instance, _a_gen, _a_job, _a_ok, _a_stop, _M=_M, _int=_int):  # RequestMachine: finishing --fail-->
    if _a_gen is not _M or _a_job is not _M or _a_ok is not _M or _a_stop is not _M:
        return None
    self.finish_reason, self.closes = _enum_FinishReason(4), 1
    self._state = 'failed'  # fail@finishing
    self.last_transition = _row_33_0
    return 'failed'
    return None

_table: dict[str, dict[str, _Any]] = {
    'new': {'wait_model': _dispatch_0, 'bind': _dispatch_1, 'admit_now': _dispatch_4, 'reject': _dispatch_5, 'cancel': _dispatch_13, 'expire': _dispatch_21, 'fail': _dispatch_28},
    'waiting_model': {'bind': _dispatch_2, 'reject': _dispatch_6, 'cancel': _dispatch_14, 'expire': _dispatch_22, 'fail': _dispatch_29},
    'waiting_admission': {'admit': _dispatch_3, 'reject': _dispatch_7, 'cancel': _dispatch_15, 'expire': _dispatch_23, 'fail': _dispatch_30},
    'prefill_ready': {'submit_prefill': _dispatch_8, 'cancel': _dispatch_16, 'expire': _dispatch_24, 'fail': _dispatch_31},
    'prefill_running': {'prefill_done': _dispatch_9, 'cancel': _dispatch_19, 'expire': _dispatch_26},
    'decode_ready': {'submit_decode': _dispatch_10, 'cancel': _dispatch_17, 'expire': _dispatch_25, 'fail': _dispatch_32},
    'decode_running': {'decode_done': _dispatch_11, 'cancel': _dispatch_20, 'expire': _dispatch_27},
    'finishing': {'close': _dispatch_12, 'cancel': _dispatch_18, 'fail': _dispatch_33},
}

_ft: dict[str, dict[str, _Any]] = {
    'new': {'wait_model': _fire_0, 'bind': _fire_1, 'admit_now': _fire_4, 'reject': _fire_5, 'cancel': _fire_13, 'expire': _fire_21, 'fail': _fire_28},
    'waiting_model': {'bind': _fire_2, 'reject': _fire_6, 'cancel': _fire_14, 'expire': _fire_22, 'fail': _fire_29},
    'waiting_admission': {'admit': _fire_3, 'reject': _fire_7, 'cancel': _fire_15, 'expire': _fire_23, 'fail': _fire_30},
    'prefill_ready': {'submit_prefill': _fire_8, 'cancel': _fire_16, 'expire': _fire_24, 'fail': _fire_31},
    'prefill_running': {'prefill_done': _fire_9, 'cancel': _fire_19, 'expire': _fire_26},
    'decode_ready': {'submit_decode': _fire_10, 'cancel': _fire_17, 'expire': _fire_25, 'fail': _fire_32},
    'decode_running': {'decode_done': _fire_11, 'cancel': _fire_20, 'expire': _fire_27},
    'finishing': {'close': _fire_12, 'cancel': _fire_18, 'fail': _fire_33},
}

def _given(gen, job, ok, stop):  # RequestMachine: the arguments given, as the exact path takes them
    a = {}
    if gen is not _M:
        a['gen'] = gen
    if job is not _M:
        a['job'] = job
    if ok is not _M:
        a['ok'] = ok
    if stop is not _M:
        a['stop'] = stop
    return a

def _each_0(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --wait_model--> on each instance
    if gen is not _M or job is not _M or ok is not _M or stop is not _M:
        return _one_by_one(instances, 'wait_model', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'new' and True:
            self._state = 'waiting_model'  # wait_model@new
            self.last_transition = _each_row_0_0_0
            append('waiting_model')
            continue
        append(_exact(self, 'wait_model', {}))
    return targets

def _each_1(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --bind--> on each instance
    if job is not _M or ok is not _M or stop is not _M or gen is _M:
        return _one_by_one(instances, 'bind', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_gen in zip(instances, gen):
        state = self._state
        if state == 'new' and (_a_gen.__class__ is _int and _a_gen >= 1):
            self.generation = _a_gen
            self._state = 'waiting_admission'  # bind@new
            self.last_transition = _each_row_1_0_0
            append('waiting_admission')
            continue
        elif state == 'waiting_model' and (_a_gen.__class__ is _int and _a_gen >= 1):
            self.generation = _a_gen
            self._state = 'waiting_admission'  # bind@waiting_model
            self.last_transition = _each_row_1_1_0
            append('waiting_admission')
            continue
        append(_exact(self, 'bind', {'gen': _a_gen}))
    return targets

def _each_2(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --admit--> on each instance
    if gen is not _M or job is not _M or ok is not _M or stop is not _M:
        return _one_by_one(instances, 'admit', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'waiting_admission' and True:
            if ((self.prompt_tokens + self.max_new_tokens) <= self.max_seq):
                self._state = 'prefill_ready'  # admit@waiting_admission
                self.last_transition = _each_row_2_0_0
                append('prefill_ready')
                continue
        append(_exact(self, 'admit', {}))
    return targets

def _each_3(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --admit_now--> on each instance
    if job is not _M or ok is not _M or stop is not _M or gen is _M:
        return _one_by_one(instances, 'admit_now', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_gen in zip(instances, gen):
        state = self._state
        if state == 'new' and (_a_gen.__class__ is _int and _a_gen >= 1):
            if ((self.prompt_tokens + self.max_new_tokens) <= self.max_seq):
                self.generation = _a_gen
                self._state = 'prefill_ready'  # admit_now@new
                self.last_transition = _each_row_3_0_0
                append('prefill_ready')
                continue
        append(_exact(self, 'admit_now', {'gen': _a_gen}))
    return targets

def _each_4(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --reject--> on each instance
    if gen is not _M or job is not _M or ok is not _M or stop is not _M:
        return _one_by_one(instances, 'reject', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'new' and True:
            self.finish_reason, self.closes = _enum_FinishReason(6), 1
            self._state = 'failed'  # reject@new
            self.last_transition = _each_row_4_0_0
            append('failed')
            continue
        elif state == 'waiting_model' and True:
            self.finish_reason, self.closes = _enum_FinishReason(6), 1
            self._state = 'failed'  # reject@waiting_model
            self.last_transition = _each_row_4_1_0
            append('failed')
            continue
        elif state == 'waiting_admission' and True:
            self.finish_reason, self.closes = _enum_FinishReason(6), 1
            self._state = 'failed'  # reject@waiting_admission
            self.last_transition = _each_row_4_2_0
            append('failed')
            continue
        append(_exact(self, 'reject', {}))
    return targets

def _each_5(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --submit_prefill--> on each instance
    if gen is not _M or ok is not _M or stop is not _M or job is _M:
        return _one_by_one(instances, 'submit_prefill', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_job in zip(instances, job):
        state = self._state
        if state == 'prefill_ready' and (_a_job.__class__ is _int and _a_job >= 1):
            self.job_id = _a_job
            self._state = 'prefill_running'  # submit_prefill@prefill_ready
            self.last_transition = _each_row_5_0_0
            append('prefill_running')
            continue
        append(_exact(self, 'submit_prefill', {'job': _a_job}))
    return targets

def _each_6(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --prefill_done--> on each instance
    if gen is not _M or job is _M or ok is _M or stop is _M:
        return _one_by_one(instances, 'prefill_done', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_job, _a_ok, _a_stop in zip(instances, job, ok, stop):
        state = self._state
        if state == 'prefill_running' and (_a_job.__class__ is _int and _a_job >= 1) and (_a_ok is True or _a_ok is False) and (_a_stop is True or _a_stop is False):
            _g0 = (_a_job == self.job_id)
            _g1 = self.cancel_requested
            _g2 = self.deadline_passed
            _g3 = ((self.generated_tokens + 1) >= self.max_new_tokens)
            if _g0:
                if _g1:
                    self.job_id, self.cancel_requested, self.deadline_passed, self.finish_reason, self.closes = 0, False, False, _enum_FinishReason(3), 1
                    self._state = 'cancelled'  # prefill_done_cancelled
                    self.last_transition = _each_row_6_0_0
                    append('cancelled')
                    continue
                if (not _g1):
                    if _g2:
                        self.job_id, self.deadline_passed, self.finish_reason, self.closes = 0, False, _enum_FinishReason(5), 1
                        self._state = 'failed'  # prefill_done_deadline
                        self.last_transition = _each_row_6_0_1
                        append('failed')
                        continue
                    if (not _g2):
                        if (not _a_ok):
                            self.job_id, self.finish_reason, self.closes = 0, _enum_FinishReason(4), 1
                            self._state = 'failed'  # prefill_done_error
                            self.last_transition = _each_row_6_0_2
                            append('failed')
                            continue
                        if _a_ok:
                            if (_a_stop or _g3):
                                self.generated_tokens, self.kv_length, self.job_id, self.finish_reason = 1, self.prompt_tokens, 0, _enum_FinishReason((1 if _a_stop else 2))
                                self._state = 'finishing'  # prefill_done_finish
                                self.last_transition = _each_row_6_0_3
                                append('finishing')
                                continue
                            if (not _a_stop) and (not _g3):
                                self.generated_tokens, self.kv_length, self.job_id = 1, self.prompt_tokens, 0
                                self._state = 'decode_ready'  # prefill_done_continue
                                self.last_transition = _each_row_6_0_4
                                append('decode_ready')
                                continue
        append(_exact(self, 'prefill_done', {'job': _a_job, 'ok': _a_ok, 'stop': _a_stop}))
    return targets

def _each_7(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --submit_decode--> on each instance
    if gen is not _M or ok is not _M or stop is not _M or job is _M:
        return _one_by_one(instances, 'submit_decode', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_job in zip(instances, job):
        state = self._state
        if state == 'decode_ready' and (_a_job.__class__ is _int and _a_job >= 1):
            self.job_id = _a_job
            self._state = 'decode_running'  # submit_decode@decode_ready
            self.last_transition = _each_row_7_0_0
            append('decode_running')
            continue
        append(_exact(self, 'submit_decode', {'job': _a_job}))
    return targets

def _each_8(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --decode_done--> on each instance
    if gen is not _M or job is _M or ok is _M or stop is _M:
        return _one_by_one(instances, 'decode_done', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self, _a_job, _a_ok, _a_stop in zip(instances, job, ok, stop):
        state = self._state
        if state == 'decode_running' and (_a_job.__class__ is _int and _a_job >= 1) and (_a_ok is True or _a_ok is False) and (_a_stop is True or _a_stop is False):
            _g0 = (_a_job == self.job_id)
            _g1 = self.cancel_requested
            _g2 = self.deadline_passed
            _g3 = ((self.generated_tokens + 1) >= self.max_new_tokens)
            if _g0:
                if _g1:
                    self.job_id, self.cancel_requested, self.deadline_passed, self.finish_reason, self.closes = 0, False, False, _enum_FinishReason(3), 1
                    self._state = 'cancelled'  # decode_done_cancelled
                    self.last_transition = _each_row_8_0_0
                    append('cancelled')
                    continue
                if (not _g1):
                    if _g2:
                        self.job_id, self.deadline_passed, self.finish_reason, self.closes = 0, False, _enum_FinishReason(5), 1
                        self._state = 'failed'  # decode_done_deadline
                        self.last_transition = _each_row_8_0_1
                        append('failed')
                        continue
                    if (not _g2):
                        if (not _a_ok):
                            self.job_id, self.finish_reason, self.closes = 0, _enum_FinishReason(4), 1
                            self._state = 'failed'  # decode_done_error
                            self.last_transition = _each_row_8_0_2
                            append('failed')
                            continue
                        if _a_ok:
                            if (_a_stop or _g3):
                                self.generated_tokens, self.kv_length, self.job_id, self.finish_reason = (self.generated_tokens + 1), (self.kv_length + 1), 0, _enum_FinishReason((1 if _a_stop else 2))
                                self._state = 'finishing'  # decode_done_finish
                                self.last_transition = _each_row_8_0_3
                                append('finishing')
                                continue
                            if (not _a_stop) and (not _g3):
                                self.generated_tokens, self.kv_length, self.job_id = (self.generated_tokens + 1), (self.kv_length + 1), 0
                                self._state = 'decode_ready'  # decode_done_continue
                                self.last_transition = _each_row_8_0_4
                                append('decode_ready')
                                continue
        append(_exact(self, 'decode_done', {'job': _a_job, 'ok': _a_ok, 'stop': _a_stop}))
    return targets

def _each_9(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --close--> on each instance
    if gen is not _M or job is not _M or ok is not _M or stop is not _M:
        return _one_by_one(instances, 'close', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'finishing' and True:
            self.closes = 1
            self._state = 'completed'  # close@finishing
            self.last_transition = _each_row_9_0_0
            append('completed')
            continue
        append(_exact(self, 'close', {}))
    return targets

def _each_10(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --cancel--> on each instance
    if gen is not _M or job is not _M or ok is not _M or stop is not _M:
        return _one_by_one(instances, 'cancel', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'new' and True:
            self.finish_reason, self.closes = _enum_FinishReason(3), 1
            self._state = 'cancelled'  # cancel@new
            self.last_transition = _each_row_10_0_0
            append('cancelled')
            continue
        elif state == 'waiting_model' and True:
            self.finish_reason, self.closes = _enum_FinishReason(3), 1
            self._state = 'cancelled'  # cancel@waiting_model
            self.last_transition = _each_row_10_1_0
            append('cancelled')
            continue
        elif state == 'waiting_admission' and True:
            self.finish_reason, self.closes = _enum_FinishReason(3), 1
            self._state = 'cancelled'  # cancel@waiting_admission
            self.last_transition = _each_row_10_2_0
            append('cancelled')
            continue
        elif state == 'prefill_ready' and True:
            self.finish_reason, self.closes = _enum_FinishReason(3), 1
            self._state = 'cancelled'  # cancel@prefill_ready
            self.last_transition = _each_row_10_3_0
            append('cancelled')
            continue
        elif state == 'decode_ready' and True:
            self.finish_reason, self.closes = _enum_FinishReason(3), 1
            self._state = 'cancelled'  # cancel@decode_ready
            self.last_transition = _each_row_10_4_0
            append('cancelled')
            continue
        elif state == 'finishing' and True:
            self.finish_reason, self.closes = _enum_FinishReason(3), 1
            self._state = 'cancelled'  # cancel@finishing
            self.last_transition = _each_row_10_5_0
            append('cancelled')
            continue
        elif state == 'prefill_running' and True:
            self.cancel_requested = True
            self._state = 'prefill_running'  # cancel@prefill_running
            self.last_transition = _each_row_10_6_0
            append('prefill_running')
            continue
        elif state == 'decode_running' and True:
            self.cancel_requested = True
            self._state = 'decode_running'  # cancel@decode_running
            self.last_transition = _each_row_10_7_0
            append('decode_running')
            continue
        append(_exact(self, 'cancel', {}))
    return targets

def _each_11(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --expire--> on each instance
    if gen is not _M or job is not _M or ok is not _M or stop is not _M:
        return _one_by_one(instances, 'expire', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'new' and True:
            self.finish_reason, self.closes = _enum_FinishReason(5), 1
            self._state = 'failed'  # expire@new
            self.last_transition = _each_row_11_0_0
            append('failed')
            continue
        elif state == 'waiting_model' and True:
            self.finish_reason, self.closes = _enum_FinishReason(5), 1
            self._state = 'failed'  # expire@waiting_model
            self.last_transition = _each_row_11_1_0
            append('failed')
            continue
        elif state == 'waiting_admission' and True:
            self.finish_reason, self.closes = _enum_FinishReason(5), 1
            self._state = 'failed'  # expire@waiting_admission
            self.last_transition = _each_row_11_2_0
            append('failed')
            continue
        elif state == 'prefill_ready' and True:
            self.finish_reason, self.closes = _enum_FinishReason(5), 1
            self._state = 'failed'  # expire@prefill_ready
            self.last_transition = _each_row_11_3_0
            append('failed')
            continue
        elif state == 'decode_ready' and True:
            self.finish_reason, self.closes = _enum_FinishReason(5), 1
            self._state = 'failed'  # expire@decode_ready
            self.last_transition = _each_row_11_4_0
            append('failed')
            continue
        elif state == 'prefill_running' and True:
            self.deadline_passed = True
            self._state = 'prefill_running'  # expire@prefill_running
            self.last_transition = _each_row_11_5_0
            append('prefill_running')
            continue
        elif state == 'decode_running' and True:
            self.deadline_passed = True
            self._state = 'decode_running'  # expire@decode_running
            self.last_transition = _each_row_11_6_0
            append('decode_running')
            continue
        append(_exact(self, 'expire', {}))
    return targets

def _each_12(instances: _Sequence[Instance], gen, job, ok, stop):  # RequestMachine: --fail--> on each instance
    if gen is not _M or job is not _M or ok is not _M or stop is not _M:
        return _one_by_one(instances, 'fail', {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    targets: list[_Any] = []
    append = targets.append
    for self in instances:
        state = self._state
        if state == 'new' and True:
            self.finish_reason, self.closes = _enum_FinishReason(4), 1
            self._state = 'failed'  # fail@new
            self.last_transition = _each_row_12_0_0
            append('failed')
            continue
        elif state == 'waiting_model' and True:
            self.finish_reason, self.closes = _enum_FinishReason(4), 1
            self._state = 'failed'  # fail@waiting_model
            self.last_transition = _each_row_12_1_0
            append('failed')
            continue
        elif state == 'waiting_admission' and True:
            self.finish_reason, self.closes = _enum_FinishReason(4), 1
            self._state = 'failed'  # fail@waiting_admission
            self.last_transition = _each_row_12_2_0
            append('failed')
            continue
        elif state == 'prefill_ready' and True:
            self.finish_reason, self.closes = _enum_FinishReason(4), 1
            self._state = 'failed'  # fail@prefill_ready
            self.last_transition = _each_row_12_3_0
            append('failed')
            continue
        elif state == 'decode_ready' and True:
            self.finish_reason, self.closes = _enum_FinishReason(4), 1
            self._state = 'failed'  # fail@decode_ready
            self.last_transition = _each_row_12_4_0
            append('failed')
            continue
        elif state == 'finishing' and True:
            self.finish_reason, self.closes = _enum_FinishReason(4), 1
            self._state = 'failed'  # fail@finishing
            self.last_transition = _each_row_12_5_0
            append('failed')
            continue
        append(_exact(self, 'fail', {}))
    return targets

_each: dict[str, _Any] = {'wait_model': _each_0, 'bind': _each_1, 'admit': _each_2, 'admit_now': _each_3, 'reject': _each_4, 'submit_prefill': _each_5, 'prefill_done': _each_6, 'submit_decode': _each_7, 'decode_done': _each_8, 'close': _each_9, 'cancel': _each_10, 'expire': _each_11, 'fail': _each_12}

def fire_each_plain(instances, event, gen=_M, job=_M, ok=_M, stop=_M):  # RequestMachine
    n = len(instances)
    if gen is not _M and len(gen) != n:
        raise ValueError(f'fire_each: gen has {len(gen)} values for {n} instances')
    if job is not _M and len(job) != n:
        raise ValueError(f'fire_each: job has {len(job)} values for {n} instances')
    if ok is not _M and len(ok) != n:
        raise ValueError(f'fire_each: ok has {len(ok)} values for {n} instances')
    if stop is not _M and len(stop) != n:
        raise ValueError(f'fire_each: stop has {len(stop)} values for {n} instances')
    if n == 1:
        self = instances[0]
        gen = gen if gen is _M else gen[0]
        job = job if job is _M else job[0]
        ok = ok if ok is _M else ok[0]
        stop = stop if stop is _M else stop[0]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(gen, job, ok, stop))]
        target = fast(self, gen, job, ok, stop)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(gen, job, ok, stop))]
    run = _each.get(event)
    if run is None:
        return _one_by_one(instances, event, {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, None)
    return run(instances, gen, job, ok, stop)

def fire_each_sampled(instances, event, gen=_M, job=_M, ok=_M, stop=_M):  # RequestMachine
    n = len(instances)
    if gen is not _M and len(gen) != n:
        raise ValueError(f'fire_each: gen has {len(gen)} values for {n} instances')
    if job is not _M and len(job) != n:
        raise ValueError(f'fire_each: job has {len(job)} values for {n} instances')
    if ok is not _M and len(ok) != n:
        raise ValueError(f'fire_each: ok has {len(ok)} values for {n} instances')
    if stop is not _M and len(stop) != n:
        raise ValueError(f'fire_each: stop has {len(stop)} values for {n} instances')
    if n == 1:
        self = instances[0]
        gen = gen if gen is _M else gen[0]
        job = job if job is _M else job[0]
        ok = ok if ok is _M else ok[0]
        stop = stop if stop is _M else stop[0]
        if next(_draws):
            return [_exact(self, event, _given(gen, job, ok, stop))]
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return [_exact(self, event, _given(gen, job, ok, stop))]
        target = fast(self, gen, job, ok, stop)
        if target is not None:
            return [target]
        return [_exact(self, event, _given(gen, job, ok, stop))]
    run = _each.get(event)
    drawn = list(_islice(_draws, n))
    if run is None:
        return _one_by_one(instances, event, {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, drawn)
    if True in drawn:
        return _split(run, instances, event, {'gen': gen, 'job': job, 'ok': ok, 'stop': stop}, drawn)
    return run(instances, gen, job, ok, stop)

@_mypyc_attr(allow_interpreted_subclasses=True)
class Instance:
    """RequestMachine's instance: its state, last row, parameters and variables, typed as declared."""

    __slots__ = ('_state', 'last_transition', 'prompt_tokens', 'max_new_tokens', 'max_seq', 'generation', 'job_id', 'generated_tokens', 'kv_length', 'cancel_requested', 'deadline_passed', 'finish_reason', 'closes')

    _state: str
    last_transition: _Any
    prompt_tokens: int
    max_new_tokens: int
    max_seq: int
    generation: int
    job_id: int
    generated_tokens: int
    kv_length: int
    cancel_requested: bool
    deadline_passed: bool
    finish_reason: _Any
    closes: int

    def fire_plain(self, event, gen=_M, job=_M, ok=_M, stop=_M) -> _Any:  # RequestMachine
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(gen, job, ok, stop))
        target = fast(self, gen, job, ok, stop)
        if target is not None:
            return target
        return _exact(self, event, _given(gen, job, ok, stop))

    def fire_sampled(self, event, gen=_M, job=_M, ok=_M, stop=_M) -> _Any:  # RequestMachine
        if next(_draws):
            return _exact(self, event, _given(gen, job, ok, stop))
        try:
            fast = _ft[self._state][event]
        except KeyError:
            return _exact(self, event, _given(gen, job, ok, stop))
        target = fast(self, gen, job, ok, stop)
        if target is not None:
            return target
        return _exact(self, event, _given(gen, job, ok, stop))

    def _check_invariants(self, pre) -> _Any:  # RequestMachine
        broken = []
        if not (self.closes == (1 if ((self._state == 'completed') or (self._state == 'cancelled') or (self._state == 'failed')) else 0)):
            broken.append(('terminal_closed_once', 'R4.6'))
        if not (((not (((self._state == 'new') or (self._state == 'waiting_model') or (self._state == 'waiting_admission')) or ((self._state == 'prefill_ready') or (self._state == 'decode_ready')) or ((self._state == 'prefill_running') or (self._state == 'decode_running')))) or (self.finish_reason == 0)) and ((not ((self._state == 'finishing') or (self._state == 'completed'))) or ((self.finish_reason == 1) or (self.finish_reason == 2))) and ((not ((self._state == 'cancelled'))) or (self.finish_reason == 3)) and ((not ((self._state == 'failed'))) or ((self.finish_reason == 4) or (self.finish_reason == 5) or (self.finish_reason == 6)))):
            broken.append(('finish_reason_matches_state', 'R2.3'))
        if not ((self.job_id >= 1) == ((self._state == 'prefill_running') or (self._state == 'decode_running'))):
            broken.append(('job_only_while_running', 'R4.8'))
        if not ((not (self.cancel_requested or self.deadline_passed)) or ((self._state == 'prefill_running') or (self._state == 'decode_running'))):
            broken.append(('flags_only_while_running', 'R4.5'))
        if not (((not (((self._state == 'prefill_ready') or (self._state == 'prefill_running') or (self._state == 'decode_ready') or (self._state == 'decode_running') or (self._state == 'finishing') or (self._state == 'completed')) or ((self._state == 'waiting_admission')))) or (self.generation >= 1)) and ((not ((self._state == 'new') or (self._state == 'waiting_model'))) or (self.generation == 0))):
            broken.append(('pinned_exactly_after_bind', 'R10.3'))
        if not ((not ((self._state == 'prefill_ready') or (self._state == 'prefill_running') or (self._state == 'decode_ready') or (self._state == 'decode_running') or (self._state == 'finishing') or (self._state == 'completed'))) or ((self.prompt_tokens + self.max_new_tokens) <= self.max_seq)):
            broken.append(('admitted_fits_context', 'R5.1.4'))
        if not (((not ((self._state == 'decode_ready') or (self._state == 'decode_running') or (self._state == 'finishing') or (self._state == 'completed'))) or ((self.generated_tokens >= 1) and ((self.kv_length + 1) == (self.prompt_tokens + self.generated_tokens)))) and ((not (((self._state == 'new') or (self._state == 'waiting_model') or (self._state == 'waiting_admission')) or ((self._state == 'prefill_ready') or (self._state == 'prefill_running')))) or ((self.generated_tokens == 0) and (self.kv_length == 0))) and (self.generated_tokens <= self.max_new_tokens)):
            broken.append(('kv_length_tracks_tokens', 'R9.2.4'))
        if not ((not ((self._state == 'decode_ready') or (self._state == 'decode_running'))) or ((self.generated_tokens < self.max_new_tokens) and ((self.kv_length + 1) <= self.max_seq))):
            broken.append(('decoding_has_budget', 'R5.1.4'))
        if not (self.generation >= 0):
            broken.append(('bounds_generation', 'type'))
        if not (self.job_id >= 0):
            broken.append(('bounds_job_id', 'type'))
        if not (self.generated_tokens >= 0):
            broken.append(('bounds_generated_tokens', 'type'))
        if not (self.kv_length >= 0):
            broken.append(('bounds_kv_length', 'type'))
        if not ((self.finish_reason == 0) or (self.finish_reason == 1) or (self.finish_reason == 2) or (self.finish_reason == 3) or (self.finish_reason == 4) or (self.finish_reason == 5) or (self.finish_reason == 6)):
            broken.append(('bounds_finish_reason', 'type'))
        if not ((self.closes >= 0) and (self.closes <= 1)):
            broken.append(('bounds_closes', 'type'))
        if pre is not None:
            if not ((not (pre.generation >= 1)) or (self.generation == pre.generation)):
                broken.append(('generation_fixed', 'R10.3'))
            if not (((not ((pre._state == 'cancelled'))) or ((self._state == 'cancelled'))) and ((not ((pre._state == 'completed'))) or ((self._state == 'completed'))) and ((not ((pre._state == 'failed'))) or ((self._state == 'failed')))):
                broken.append(('terminal_is_final', 'R4.6'))
        return broken

    def __init__(self, *, prompt_tokens=_MISSING, max_new_tokens=_MISSING, max_seq=_MISSING, **extra) -> None:  # RequestMachine
        if extra or not ((prompt_tokens.__class__ is _int and prompt_tokens >= 1) and (max_new_tokens.__class__ is _int and max_new_tokens >= 1) and (max_seq.__class__ is _int and max_seq >= 1)):
            return _slow_init(self, extra, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, max_seq=max_seq)
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.max_seq = max_seq
        self.generation = _init_0
        self.job_id = _init_1
        self.generated_tokens = _init_2
        self.kv_length = _init_3
        self.cancel_requested = _init_4
        self.deadline_passed = _init_5
        self.finish_reason = _init_6
        self.closes = _init_7
        self._state = 'new'
        self.last_transition = None

    def snapshot(self) -> _Any:  # RequestMachine
        copy: Instance = _new(self.__class__)
        copy.prompt_tokens = self.prompt_tokens
        copy.max_new_tokens = self.max_new_tokens
        copy.max_seq = self.max_seq
        copy.generation = self.generation
        copy.job_id = self.job_id
        copy.generated_tokens = self.generated_tokens
        copy.kv_length = self.kv_length
        copy.cancel_requested = self.cancel_requested
        copy.deadline_passed = self.deadline_passed
        copy.finish_reason = self.finish_reason
        copy.closes = self.closes
        copy._state = self._state
        copy.last_transition = self.last_transition
        return copy

fire_plain = Instance.fire_plain
fire_sampled = Instance.fire_sampled
_check_invariants = Instance._check_invariants
__init__ = Instance.__init__
snapshot = Instance.snapshot
_new: _Any = Instance.__new__  # object's, or the compiled class's allocator (no __init__)
