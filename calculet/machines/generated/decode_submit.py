"""The generated composite "decode_submit" — do not edit: regenerate with `python -m calculet.specgen`.

A B1 decode step submitted: the job goes on the device, its request's lane into the batch. Printed by calculet.machines.codegen_composite (issue #20) from the z3 terms
of the guards and effects declared in
calculet.machines.job.DeviceJobMachine (submit)
calculet.machines.request.RequestMachine (submit_decode)
— the events fired in sequence, in one function. `python -m calculet.specgen --check` fails when this file
is not what the declarations produce; the runtime binds it (calculet.runtime.scheduling.completion).
"""

from __future__ import annotations

from typing import Any as _Any

_int = int
_exact: _Any = None  # the runtime's exact path: set when bound

MACHINES = ('calculet.machines.job.DeviceJobMachine', 'calculet.machines.request.RequestMachine')
SHAPES = ('47dccf48f60bd6f8', '95c16b1233c4019e')

BINDINGS = {  # name: ('row', part, row index in its declaration) or ('enum', class)
    '_p0_row_0': ('row', 0, 0),
    '_p1_row_14': ('row', 1, 14),
}

_p0_row_0: _Any = None
_p1_row_14: _Any = None

def fire_plain(job, request, job_id):  # decode_submit
    """A B1 decode step submitted: the job goes on the device, its request's lane into the batch: the events fired in sequence; returns each part's target."""
    # DeviceJobMachine: --submit--> on job
    self = job
    _t0 = None
    if True:
        state = self._state
        if state == 'prepared':
            while True:  # one pass: the row taken leaves it
                self._state = 'submitted'  # submit@prepared
                self.last_transition = _p0_row_0
                _t0 = 'submitted'
                break
                break
    if _t0 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t0 = _exact(self, 'submit', {})
    # RequestMachine: --submit_decode--> on request
    self = request
    _a_job = job_id
    _t1 = None
    if (_a_job.__class__ is _int and _a_job >= 1):
        state = self._state
        if state == 'decode_ready':
            while True:  # one pass: the row taken leaves it
                self.job_id = _a_job
                self._state = 'decode_running'  # submit_decode@decode_ready
                self.last_transition = _p1_row_14
                _t1 = 'decode_running'
                break
                break
    if _t1 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t1 = _exact(self, 'submit_decode', {'job': _a_job})
    return _t0, _t1

def fire_sampled(job, request, job_id, draws):  # decode_submit
    """A B1 decode step submitted: the job goes on the device, its request's lane into the batch: the events fired in sequence; returns each part's target."""
    # DeviceJobMachine: --submit--> on job
    self = job
    _t0 = None
    if not next(draws):
        state = self._state
        if state == 'prepared':
            while True:  # one pass: the row taken leaves it
                self._state = 'submitted'  # submit@prepared
                self.last_transition = _p0_row_0
                _t0 = 'submitted'
                break
                break
    if _t0 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t0 = _exact(self, 'submit', {})
    # RequestMachine: --submit_decode--> on request
    self = request
    _a_job = job_id
    _t1 = None
    if not next(draws) and (_a_job.__class__ is _int and _a_job >= 1):
        state = self._state
        if state == 'decode_ready':
            while True:  # one pass: the row taken leaves it
                self.job_id = _a_job
                self._state = 'decode_running'  # submit_decode@decode_ready
                self.last_transition = _p1_row_14
                _t1 = 'decode_running'
                break
                break
    if _t1 is None:  # drawn, refused or of another type: the exact path, as fire sends it
        _t1 = _exact(self, 'submit_decode', {'job': _a_job})
    return _t0, _t1
