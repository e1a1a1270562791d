"""The generated composite "decode_step" — do not edit: regenerate with `python -m calculet.specgen`.

A B1 decode step done: the job completes, its lane commits, its request takes the token. Printed by calculet.machines.codegen_composite (issue #20) from the z3 terms
of the guards and effects declared in
calculet.machines.job.DeviceJobMachine (complete)
calculet.machines.kv_sequence.KvSequenceMachine (commit)
calculet.machines.request.RequestMachine (decode_done)
— the events fired in sequence, in one function. `python -m calculet.specgen --check` fails when this file
is not what the declarations produce; the runtime binds it (calculet.runtime.scheduling.completion).
"""

from __future__ import annotations

from typing import Any as _Any

_int = int
_exact: _Any = None  # the runtime's exact path: set when bound

MACHINES = ('calculet.machines.job.DeviceJobMachine', 'calculet.machines.kv_sequence.KvSequenceMachine', 'calculet.machines.request.RequestMachine')
SHAPES = ('47dccf48f60bd6f8', '4825e9d6298fa508', '95c16b1233c4019e')

BINDINGS = {  # name: ('row', part, row index in its declaration) or ('enum', class)
    '_p0_row_2': ('row', 0, 2),
    '_p0_row_3': ('row', 0, 3),
    '_p1_row_1': ('row', 1, 1),
    '_p1_row_2': ('row', 1, 2),
    '_p2_row_15': ('row', 2, 15),
    '_p2_row_16': ('row', 2, 16),
    '_p2_row_17': ('row', 2, 17),
    '_p2_row_18': ('row', 2, 18),
    '_p2_row_19': ('row', 2, 19),
    '_enum_FinishReason': ('enum', 'calculet.machines.request.FinishReason'),
}

_p0_row_2: _Any = None
_p0_row_3: _Any = None
_p1_row_1: _Any = None
_p1_row_2: _Any = None
_p2_row_15: _Any = None
_p2_row_16: _Any = None
_p2_row_17: _Any = None
_p2_row_18: _Any = None
_p2_row_19: _Any = None
_enum_FinishReason: _Any = None

def fire_plain(job, lane, request, tokens, job_id, stop):  # decode_step
    """A B1 decode step done: the job completes, its lane commits, its request takes the token: the events fired in sequence; returns each part's target."""
    # DeviceJobMachine: --complete--> on job
    self = job
    _a_ok = True
    _t0 = None
    if True:
        state = self._state
        if state == 'submitted':
            while True:  # one pass: the row taken leaves it
                if _a_ok:
                    self.delivered, self.buffers_held = (self.delivered + 1), False
                    self._state = 'completed'  # complete_ok
                    self.last_transition = _p0_row_2
                    _t0 = 'completed'
                    break
                if (not _a_ok):
                    self.buffers_held = False
                    self._state = 'failed'  # complete_error
                    self.last_transition = _p0_row_3
                    _t0 = 'failed'
                    break
                break
    if _t0 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t0 = _exact(self, 'complete', {'ok': _a_ok})
    # KvSequenceMachine: --commit--> on lane
    self = lane
    _a_tokens = tokens
    _t1 = None
    if (_a_tokens.__class__ is _int and _a_tokens >= 1):
        state = self._state
        if state == 'reserved':
            while True:  # one pass: the row taken leaves it
                if ((self.committed_len + _a_tokens) <= self.reserved_len):
                    self.committed_len = (self.committed_len + _a_tokens)
                    self._state = 'active'  # commit@reserved
                    self.last_transition = _p1_row_1
                    _t1 = 'active'
                    break
                break
        elif state == 'active':
            while True:  # one pass: the row taken leaves it
                if ((self.committed_len + _a_tokens) <= self.reserved_len):
                    self.committed_len = (self.committed_len + _a_tokens)
                    self._state = 'active'  # commit@active
                    self.last_transition = _p1_row_2
                    _t1 = 'active'
                    break
                break
    if _t1 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t1 = _exact(self, 'commit', {'tokens': _a_tokens})
    # RequestMachine: --decode_done--> on request
    self = request
    _a_job = job_id
    _a_ok = True
    _a_stop = stop
    _t2 = None
    if (_a_job.__class__ is _int and _a_job >= 1) and (_a_stop is True or _a_stop is False):
        state = self._state
        if state == 'decode_running':
            while True:  # one pass: the row taken leaves it
                _g0 = (_a_job == self.job_id)
                _g1 = self.cancel_requested
                _g2 = self.deadline_passed
                _g3 = ((self.generated_tokens + 1) >= self.max_new_tokens)
                if _g0:
                    if _g1:
                        self.job_id, self.cancel_requested, self.deadline_passed, self.finish_reason, self.closes = 0, False, False, _enum_FinishReason(3), 1
                        self._state = 'cancelled'  # decode_done_cancelled
                        self.last_transition = _p2_row_15
                        _t2 = 'cancelled'
                        break
                    if (not _g1):
                        if _g2:
                            self.job_id, self.deadline_passed, self.finish_reason, self.closes = 0, False, _enum_FinishReason(5), 1
                            self._state = 'failed'  # decode_done_deadline
                            self.last_transition = _p2_row_16
                            _t2 = 'failed'
                            break
                        if (not _g2):
                            if (not _a_ok):
                                self.job_id, self.finish_reason, self.closes = 0, _enum_FinishReason(4), 1
                                self._state = 'failed'  # decode_done_error
                                self.last_transition = _p2_row_17
                                _t2 = 'failed'
                                break
                            if _a_ok:
                                if (_a_stop or _g3):
                                    self.generated_tokens, self.kv_length, self.job_id, self.finish_reason = (self.generated_tokens + 1), (self.kv_length + 1), 0, _enum_FinishReason((1 if _a_stop else 2))
                                    self._state = 'finishing'  # decode_done_finish
                                    self.last_transition = _p2_row_18
                                    _t2 = 'finishing'
                                    break
                                if (not _a_stop) and (not _g3):
                                    self.generated_tokens, self.kv_length, self.job_id = (self.generated_tokens + 1), (self.kv_length + 1), 0
                                    self._state = 'decode_ready'  # decode_done_continue
                                    self.last_transition = _p2_row_19
                                    _t2 = 'decode_ready'
                                    break
                break
    if _t2 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t2 = _exact(self, 'decode_done', {'job': _a_job, 'ok': _a_ok, 'stop': _a_stop})
    return _t0, _t1, _t2

def fire_sampled(job, lane, request, tokens, job_id, stop, draws):  # decode_step
    """A B1 decode step done: the job completes, its lane commits, its request takes the token: the events fired in sequence; returns each part's target."""
    # DeviceJobMachine: --complete--> on job
    self = job
    _a_ok = True
    _t0 = None
    if not next(draws):
        state = self._state
        if state == 'submitted':
            while True:  # one pass: the row taken leaves it
                if _a_ok:
                    self.delivered, self.buffers_held = (self.delivered + 1), False
                    self._state = 'completed'  # complete_ok
                    self.last_transition = _p0_row_2
                    _t0 = 'completed'
                    break
                if (not _a_ok):
                    self.buffers_held = False
                    self._state = 'failed'  # complete_error
                    self.last_transition = _p0_row_3
                    _t0 = 'failed'
                    break
                break
    if _t0 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t0 = _exact(self, 'complete', {'ok': _a_ok})
    # KvSequenceMachine: --commit--> on lane
    self = lane
    _a_tokens = tokens
    _t1 = None
    if not next(draws) and (_a_tokens.__class__ is _int and _a_tokens >= 1):
        state = self._state
        if state == 'reserved':
            while True:  # one pass: the row taken leaves it
                if ((self.committed_len + _a_tokens) <= self.reserved_len):
                    self.committed_len = (self.committed_len + _a_tokens)
                    self._state = 'active'  # commit@reserved
                    self.last_transition = _p1_row_1
                    _t1 = 'active'
                    break
                break
        elif state == 'active':
            while True:  # one pass: the row taken leaves it
                if ((self.committed_len + _a_tokens) <= self.reserved_len):
                    self.committed_len = (self.committed_len + _a_tokens)
                    self._state = 'active'  # commit@active
                    self.last_transition = _p1_row_2
                    _t1 = 'active'
                    break
                break
    if _t1 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t1 = _exact(self, 'commit', {'tokens': _a_tokens})
    # RequestMachine: --decode_done--> on request
    self = request
    _a_job = job_id
    _a_ok = True
    _a_stop = stop
    _t2 = None
    if not next(draws) and (_a_job.__class__ is _int and _a_job >= 1) and (_a_stop is True or _a_stop is False):
        state = self._state
        if state == 'decode_running':
            while True:  # one pass: the row taken leaves it
                _g0 = (_a_job == self.job_id)
                _g1 = self.cancel_requested
                _g2 = self.deadline_passed
                _g3 = ((self.generated_tokens + 1) >= self.max_new_tokens)
                if _g0:
                    if _g1:
                        self.job_id, self.cancel_requested, self.deadline_passed, self.finish_reason, self.closes = 0, False, False, _enum_FinishReason(3), 1
                        self._state = 'cancelled'  # decode_done_cancelled
                        self.last_transition = _p2_row_15
                        _t2 = 'cancelled'
                        break
                    if (not _g1):
                        if _g2:
                            self.job_id, self.deadline_passed, self.finish_reason, self.closes = 0, False, _enum_FinishReason(5), 1
                            self._state = 'failed'  # decode_done_deadline
                            self.last_transition = _p2_row_16
                            _t2 = 'failed'
                            break
                        if (not _g2):
                            if (not _a_ok):
                                self.job_id, self.finish_reason, self.closes = 0, _enum_FinishReason(4), 1
                                self._state = 'failed'  # decode_done_error
                                self.last_transition = _p2_row_17
                                _t2 = 'failed'
                                break
                            if _a_ok:
                                if (_a_stop or _g3):
                                    self.generated_tokens, self.kv_length, self.job_id, self.finish_reason = (self.generated_tokens + 1), (self.kv_length + 1), 0, _enum_FinishReason((1 if _a_stop else 2))
                                    self._state = 'finishing'  # decode_done_finish
                                    self.last_transition = _p2_row_18
                                    _t2 = 'finishing'
                                    break
                                if (not _a_stop) and (not _g3):
                                    self.generated_tokens, self.kv_length, self.job_id = (self.generated_tokens + 1), (self.kv_length + 1), 0
                                    self._state = 'decode_ready'  # decode_done_continue
                                    self.last_transition = _p2_row_19
                                    _t2 = 'decode_ready'
                                    break
                break
    if _t2 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t2 = _exact(self, 'decode_done', {'job': _a_job, 'ok': _a_ok, 'stop': _a_stop})
    return _t0, _t1, _t2
