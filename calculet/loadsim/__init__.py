"""Load simulation: seeded workloads, baseline policies, run analysis and reports.

The pieces that do not need the engine live here, so the scheduler can be measured against
the §1 baselines the moment the engine drives it in virtual time:

* :mod:`.workload` — ``calculet-loadsim/v1`` YAML workloads (presets in ``presets/``) and the
  seeded generator of :class:`SimRequest` lists; :mod:`.distributions` — the length, deadline
  and delay distributions a workload draws from;
* :mod:`.arrivals` — Poisson and on/off arrival processes;
* :mod:`.analysis` — the record types every policy emits and the figures computed from them
  (fairness, starvation, the workload limit);
* :mod:`.baselines` — B1 serial FCFS and software multi-slot round robin on the sim cost model;
* :mod:`.report` — Markdown + PNG report of a sweep (matplotlib imported only when plotting).

The pieces that drive the engine are imported on demand, not from here (importing this package
must not bring up the runtime): :mod:`.runner` (a workload through ``EngineDriver`` in virtual
time; :class:`~.runner.PolicyRun`, the one result record of a baseline or engine run) with
:mod:`.engine_inputs` (the simulated package, prompts) and :mod:`.tracking` (sinks and transitions
into records), :mod:`.live` (the same workload on the live ``Engine``, for agreement checks),
:mod:`.policies` (the compared policies by name) and :mod:`.soak` (the §19 M0 analogue, with
:mod:`.soak_report` and :mod:`.soak_checks`); ``python -m calculet.bench`` is the CLI.
"""

from __future__ import annotations

from calculet.loadsim.analysis import (LatencyStats, RunSummary, ServiceTimeline, SimBatchRecord,
                                       SimRequestRecord, StarvationEvent, fairness_index, jain_index,
                                       service_timeline, starvation_events, summarize, weighted_max_min_fair,
                                       workload_limit)
from calculet.loadsim.baselines import (BaselineRun, device_bound_limit, simulate_multi_slot,
                                        simulate_serial_fcfs)
from calculet.loadsim.report import PolicyResult, ReportFiles, write_report
from calculet.loadsim.workload import (OfferedLoad, SimRequest, Workload, WorkloadError, generate_requests,
                                       load_preset, load_workload, offered_load, parse_workload,
                                       preset_names, prompt_class)

__all__ = [
    "BaselineRun", "LatencyStats", "OfferedLoad", "PolicyResult", "ReportFiles", "RunSummary",
    "ServiceTimeline", "SimBatchRecord", "SimRequest", "SimRequestRecord", "StarvationEvent",
    "Workload", "WorkloadError", "device_bound_limit", "fairness_index", "generate_requests", "jain_index",
    "load_preset", "load_workload", "offered_load", "parse_workload", "preset_names",
    "prompt_class", "service_timeline", "simulate_multi_slot", "simulate_serial_fcfs",
    "starvation_events", "summarize", "weighted_max_min_fair", "workload_limit", "write_report",
]
