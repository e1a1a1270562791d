"""How a statistics record becomes Prometheus families (§16): the bounded label sets and helpers.

Why a module of its own: every §16 row (:mod:`calculet.server.metrics_scheduling`,
:mod:`calculet.server.metrics_device`, :mod:`calculet.server.metrics_goodput`,
:mod:`calculet.server.metrics_histograms`) builds its families the same way — one sample per
member of a bounded label set, zeros included, so the set of series never depends on how many
requests were served (R16.9) — and that way is written once, here.

Naming: ``calculet_<component>_<what>_<unit>`` in base units; counters are named without
``_total`` (the exposition adds it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from calculet.adapters.calrt import ReturnCode
from calculet.machines.job import DeviceJobMachine
from calculet.machines.kv_sequence import KV_SEQUENCE_STATE
from calculet.machines.model import ModelMachine
from calculet.machines.request import FinishReason, RequestMachine
from calculet.runtime.distribution import DistributionSnapshot
from calculet.runtime.execution.recovery import FaultReason
from calculet.runtime.scheduling.admission import Decision

QUEUES = ("decode", "short", "medium", "long")
PREFILL_QUEUES = ("short", "medium", "long")
RC_NAMES = tuple(rc.name for rc in ReturnCode)
FAULT_REASONS = tuple(r.value for r in FaultReason)
DECISIONS = tuple(d.value for d in Decision)
FINISH_REASONS = tuple(r.name.lower() for r in FinishReason if r is not FinishReason.NONE)
MODEL_STATES = tuple(ModelMachine.definition.states)
MODEL_PHASES = ("load", "configure", "warmup", "drain", "unload")
"""The ModelManager's measured phases (``ModelManagerStatistics`` fields)."""
KV_STATES = KV_SEQUENCE_STATE.states
"""§9.1 KvSequenceState (Updating derived from a lane's open step, #20), as ``KvLaneStatistics.by_state``."""
REQUEST_STATES = tuple(RequestMachine.definition.states)
LIVE_REQUEST_STATES = tuple(st for st in REQUEST_STATES if st not in ("completed", "cancelled", "failed"))
WAITING_REQUEST_STATES = ("new", "waiting_model", "waiting_admission", "prefill_ready")
"""Accepted, no device work started yet (what vLLM calls waiting)."""
RUNNING_REQUEST_STATES = ("prefill_running", "decode_ready", "decode_running", "finishing")
"""Holding a KV lane with device work under way (what vLLM calls running)."""
JOB_STATES = tuple(DeviceJobMachine.definition.states)
JOB_ENDINGS = tuple(sorted({t.name for t in DeviceJobMachine.definition.transitions
                            if t.target in DeviceJobMachine.definition.terminal}))
ENGINE_STATES = ("running", "stopping", "stopped")
RECOVERY_STATES = ("healthy", "recovering", "failed")
DEVICE_STATUSES = ("ok", "poisoned", "closed")
ADMISSION_LIMITS = ("kv_lane", "max_sequences", "max_kv_tokens")
ENGINES = ("ping", "pong")

_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


def _family(kind: type[_Family], name: str, doc: str, value: float | None, labels: Sequence[str]) -> _Family:
    """A labelled family (samples added by the caller) or a single sample (``value``, 0 if None)."""
    if labels:
        return kind(name, doc, labels=list(labels))
    return kind(name, doc, value=value if value is not None else 0.0)


def gauge(name: str, doc: str, value: float | None = None, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return _family(GaugeMetricFamily, name, doc, value, labels)


def counter(name: str, doc: str, value: float | None = None, labels: Sequence[str] = ()) -> CounterMetricFamily:
    return _family(CounterMetricFamily, name, doc, value, labels)


def by(family: GaugeMetricFamily | CounterMetricFamily, values: Mapping[str, float], keys: Iterable[str],
       *prefix: str) -> GaugeMetricFamily | CounterMetricFamily:
    """One sample per bounded key (missing keys are 0; extra keys the runtime reports are kept)."""
    seen = list(keys)
    seen.extend(k for k in values if k not in seen)
    for key in seen:
        family.add_metric([*prefix, key], float(values.get(key, 0)))
    return family


def one_hot(family: GaugeMetricFamily, current: str, keys: Iterable[str], *prefix: str) -> GaugeMetricFamily:
    seen = list(keys)
    if current not in seen:
        seen.append(current)
    for key in seen:
        family.add_metric([*prefix, key], 1.0 if key == current else 0.0)
    return family


def histogram(name: str, doc: str, snapshot: DistributionSnapshot | None,
              bounds: Sequence[float]) -> HistogramMetricFamily:
    """A runtime :class:`~calculet.runtime.distribution.DistributionSnapshot` as a Prometheus histogram
    (all buckets zero before the first value, so the series exist from the start)."""
    family = HistogramMetricFamily(name, doc)
    if snapshot is None:
        buckets = [(_le(b), 0.0) for b in (*bounds, float("inf"))]
        family.add_metric([], buckets, 0.0)
        return family
    buckets = [(_le(b), float(n)) for b, n in snapshot.cumulative()]
    family.add_metric([], buckets, snapshot.sum)
    return family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


__all__ = ["ADMISSION_LIMITS", "DECISIONS", "DEVICE_STATUSES", "ENGINES", "ENGINE_STATES", "FAULT_REASONS",
           "FINISH_REASONS", "JOB_ENDINGS", "JOB_STATES", "KV_STATES", "LIVE_REQUEST_STATES", "MODEL_PHASES",
           "MODEL_STATES", "PREFILL_QUEUES", "QUEUES", "RC_NAMES", "RECOVERY_STATES", "REQUEST_STATES",
           "RUNNING_REQUEST_STATES", "WAITING_REQUEST_STATES", "by", "counter", "gauge", "histogram", "one_hot"]
