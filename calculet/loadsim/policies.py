"""The policies a load simulation compares, and one entry point that runs any of them.

Why a fixed catalogue rather than free-form configs on the command line: a report is read as
"calculet B16 vs the serial baseline", so each name must mean one well-defined thing in every
report (and the name is what the plots and tables show). The catalogue holds:

* the two §1 baselines as they exist today, simulated on the same cost model —
  ``b1-serial-fcfs`` (the current product) and ``multi-slot-rr`` (llama.cpp-style software
  slots on the B1 graph; they improve time to first token, not throughput);
* the real engine (:mod:`calculet.loadsim.runner`) with the B1 graph only — ``calculet-b1``
  with one KV lane (one sequence at a time: strictly serial, so no §7.2 decode order can
  change anything), and ``calculet-b1-shared``, B1 as the HTTP service ships it: one job in
  flight and as many KV sequences as the shipped configuration admits (``admission.max_sequences``
  of ``default.yaml``, at most the package's ``memory.max_sequences``), so several streams share
  the one device by decode rotation and the §7.2 orders differ (issue #13) —, with B4, B8 or B16 compiled and §8 profile selection over every compiled profile up to it
  (``calculet-b4``/``-b8``/``-b16``), and with ping/pong — two jobs in flight on the future
  package's two engines (§14) — on B1 and on B16;
* ``calculet-b16-chunked``: calculet-b16 on a package whose B1 profile declares a 512-token
  incremental-prefill chunk, so long prompts are prefilled in chunks (§6). Incremental prefill
  is a *simulated* capability: CalRT 0.7.6 does not provide it, and §6 forbids chunking until
  the runtime supports it explicitly. The policy shows what chunking would buy, not what can
  be deployed.

Goodput comparisons (issue #13 item 7) run an engine policy under a named §7.2 decode order:
``calculet-b1-shared@strict`` is ``calculet-b1-shared`` with ``batch.deadline_order: strict``; any
value the configuration accepts may follow the ``@`` (the schema is the one judge, so a new order
needs no change here). ``--policies goodput`` is ``b1-serial-fcfs`` (FCFS, llama.cpp-style) plus
``calculet-b1-shared`` and ``calculet-b16`` under every order the configuration accepts, the
shipped default named plainly (:func:`deadline_orders`).

Configuration decisions, stated once here and in every report:

* **KV lanes** (``admission.max_sequences``) = largest profile × jobs in flight: exactly enough
  to fill every batch that can be on the device at once. More lanes would only admit prefills
  whose sequences then wait for a decode slot while holding KV; fewer would cap the batch.
  The one exception is ``calculet-b1-shared``, which takes the shipped service's lanes
  (:func:`shipped_kv_lanes`) because sharing one B1 device among streams is what it measures.
* Everything else is the shipped ``calculet-scheduler/v1`` default (waiting queue 128,
  WRR 8:4:2:1, §8 thresholds 12/6/3, long-prefill quota 1), with the workload's tenants
  (weights and §5.3 limits) and prompt-class thresholds — except where a policy names its
  own WRR weights (``calculet-b16-pingpong-chunked``: long weight 4, see its description).
* **Ping/pong policies disarm the P99-regression degrade trigger** (the M2 gate, +5%): the
  reference cost model lets an overlapped job progress at half speed (``pingpong_overlap``
  0.5), so the shipped gate switches ping/pong off after its first 64 latency samples and
  the policy would measure B1/B16 again. Crosstalk, counter, busy/timeout and
  uncertain-recovery triggers stay armed. What the M2 gate would decide is reported from the
  engine's degrade statistics (solo vs overlapped P99).
"""

from __future__ import annotations

import time
import typing
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, Mapping, Sequence

from pydantic import ValidationError

from calculet.adapters.sim.build import TINY_MAX_SEQUENCES
from calculet.adapters.sim.cost import CostModel
from calculet.config import SchedulerConfig, load_config, parse_config
from calculet.config.loading import DEFAULT_CONFIG_PATH
from calculet.config.execution import BatchConfig
from calculet.errors import ConfigError
from calculet.loadsim.baselines import simulate_multi_slot, simulate_serial_fcfs
from calculet.loadsim.engine_inputs import DEFAULT_MAX_SEQ
from calculet.loadsim.runner import PolicyRun, decode_work_s, default_options, run_engine
from calculet.loadsim.workload import SimRequest, Workload
from calculet.runtime.engine.types import EngineOptions

__all__ = [
    "BASELINE_NAMES", "DEFAULT_POLICIES", "GOODPUT_DEVICES", "GOODPUT_GROUP", "POLICIES", "SELECT_THRESHOLDS",
    "PolicyError", "PolicyRun", "PolicySpec", "deadline_orders", "goodput_policies", "parse_policies", "run_policy",
    "shipped_kv_lanes",
]

SELECT_THRESHOLDS: Mapping[int, int] = {16: 12, 8: 6, 4: 3}
"""§8's example thresholds (also the configuration default): B16 at ≥ 12 ready, B8 at ≥ 6, B4 at ≥ 3."""

_PINGPONG_UNGATED = 1 << 40
"""``EngineOptions.degrade_min_samples`` that the P99 gate never reaches (see the module docstring)."""


class PolicyError(ConfigError):
    """An unknown or malformed policy list (a command-line error)."""

    code = "policy_error"


@dataclass(frozen=True)
class PolicySpec:
    """One policy of the catalogue."""

    name: str
    kind: Literal["baseline", "engine"]
    description: str
    profiles: tuple[int, ...] = (1,)
    """Compiled batch profiles the engine may select among (engine policies)."""
    max_inflight: int = 1
    """Jobs in flight: 2 is ping/pong (engine policies)."""
    slots: int = 1
    """Software slots (the multi-slot baseline)."""
    prefill_chunk_tokens: int | None = None
    """Incremental-prefill chunk the package's B1 profile declares (§6; simulated), or None:
    the engine then prefills each prompt in one job, as CalRT 0.7.6 requires."""
    queue_weights: tuple[tuple[str, int], ...] = ()
    """``queues.*_weight`` overrides of the §6 WRR (R6.4: tuned by load experiments), e.g.
    ``(("long_prefill_weight", 4),)``; empty = the shipped 8:4:2:1."""
    deadline_order: str | None = None
    """``batch.deadline_order`` (§7.2) for this run; None = the shipped default."""
    kv_lanes: int | None = None
    """``admission.max_sequences`` of this policy; None = largest profile × jobs in flight."""

    @property
    def lanes(self) -> int:
        """KV lanes of an engine policy: ``kv_lanes``, else largest profile × jobs in flight (module docstring)."""
        return self.kv_lanes if self.kv_lanes is not None else max(self.profiles) * self.max_inflight

    @property
    def max_profile(self) -> int:
        return max(self.profiles)

    def scheduler_config(self, workload: Workload, **sections: Mapping[str, Any]) -> SchedulerConfig:
        """The ``calculet-scheduler/v1`` configuration this policy runs ``workload`` with.

        ``sections`` are merged into the generated sections (e.g. ``recovery={...}`` for a soak).
        """
        if self.kind != "engine":
            raise PolicyError(f"{self.name} is a baseline simulator; it has no scheduler configuration")
        classes = workload.prompt_classes
        data: dict[str, Any] = {
            "schema": "calculet-scheduler/v1",
            "admission": {"max_sequences": self.lanes},
            "queues": {"short_prefill_max_tokens": classes.short_max_tokens,
                       "medium_prefill_max_tokens": classes.medium_max_tokens, **dict(self.queue_weights)},
            "batch": {"profiles": list(self.profiles),
                      "select_thresholds": {p: SELECT_THRESHOLDS[p] for p in self.profiles if p > 1},
                      **({"deadline_order": self.deadline_order} if self.deadline_order else {})},
            "executor": {"max_inflight": self.max_inflight},
            "tenants": [t.model_dump(exclude_none=True) for t in workload.tenant_configs()],
        }
        for name, values in sections.items():
            data[name] = {**data.get(name, {}), **dict(values)}
        return parse_config(data, source=f"policy {self.name}")

    def engine_options(self, **overrides: Any) -> EngineOptions:
        """Engine options of this policy (ping/pong: the P99 degrade gate disarmed)."""
        if self.max_inflight == 2:
            overrides.setdefault("degrade_min_samples", _PINGPONG_UNGATED)
        return default_options(**overrides)


def shipped_kv_lanes() -> int:
    """KV sequences the shipped service holds: ``admission.max_sequences`` of the shipped
    ``default.yaml``, at most the simulated package's ``memory.max_sequences`` (the session plan
    refuses more, §5.1, §13.1)."""
    return min(load_config(DEFAULT_CONFIG_PATH).admission.max_sequences, TINY_MAX_SEQUENCES)


def _engine(name: str, profiles: tuple[int, ...], inflight: int, description: str, *,
            prefill_chunk_tokens: int | None = None, queue_weights: tuple[tuple[str, int], ...] = (),
            kv_lanes: int | None = None) -> PolicySpec:
    return PolicySpec(name, "engine", description, profiles=profiles, max_inflight=inflight,
                      prefill_chunk_tokens=prefill_chunk_tokens, queue_weights=queue_weights, kv_lanes=kv_lanes)


POLICIES: Mapping[str, PolicySpec] = {p.name: p for p in (
    PolicySpec("b1-serial-fcfs", "baseline", "§1 baseline: one request at a time on B1, FCFS (today's product)"),
    PolicySpec("multi-slot-rr", "baseline", "§1 baseline: 4 software slots round robin on B1 (llama.cpp-style)",
               slots=4),
    _engine("calculet-b1", (1,), 1, "calculet, B1 graph only, one job in flight, one KV lane (one sequence at a "
            "time, so the §7.2 decode orders cannot differ)"),
    _engine("calculet-b1-shared", (1,), 1, f"calculet, B1 as the service ships it: B1 graph only, one job in flight, "
            f"{shipped_kv_lanes()} KV lanes (the shipped admission.max_sequences) shared by decode rotation",
            kv_lanes=shipped_kv_lanes()),
    _engine("calculet-b4", (1, 4), 1, "calculet, B1+B4 with §8 selection, one job in flight"),
    _engine("calculet-b8", (1, 4, 8), 1, "calculet, B1+B4+B8 with §8 selection, one job in flight"),
    _engine("calculet-b16", (1, 4, 8, 16), 1, "calculet, B1+B4+B8+B16 with §8 selection, one job in flight"),
    _engine("calculet-b1-pingpong", (1,), 2, "calculet, B1, ping/pong (two jobs in flight, §14)"),
    _engine("calculet-b16-pingpong", (1, 4, 8, 16), 2,
            "calculet, B1+B4+B8+B16 with §8 selection, ping/pong (two jobs in flight, §14)"),
    _engine("calculet-b16-chunked", (1, 4, 8, 16), 1,
            "calculet-b16 with prompts prefilled in 512-token chunks (§6); incremental prefill is a simulated "
            "capability CalRT 0.7.6 does not provide, so this shows what chunking would buy, not what ships",
            prefill_chunk_tokens=512),
    _engine("calculet-b16-pingpong-chunked", (1, 4, 8, 16), 2,
            "calculet-b16-pingpong with 512-token prefill chunks and WRR 8:4:2:4 (long weight chosen with this "
            "tool on long-prefill-storm at load 1, R6.4: weight 1 left 2 of 8 long prompts past their deadline, "
            "4 and 8 finished all 8 with short P99 TTFT 1.42x and 1.48x the no-storm run). Ping/pong overlap "
            "and incremental prefill are both simulated assumptions (§14, §6)",
            prefill_chunk_tokens=512, queue_weights=(("long_prefill_weight", 4),)),
)}
"""Every policy by name, in report order."""

DEFAULT_POLICIES: tuple[str, ...] = tuple(POLICIES)
BASELINE_NAMES: tuple[str, ...] = tuple(n for n, p in POLICIES.items() if p.kind == "baseline")


GOODPUT_GROUP = "goodput"
"""``--policies goodput``: the issue #13 item 7 comparison (module docstring)."""
GOODPUT_DEVICES: tuple[str, ...] = ("calculet-b1-shared", "calculet-b16")
"""The engine policies the goodput comparison runs under every §7.2 order: B1 shared as shipped, and B16."""


def deadline_orders() -> tuple[str, tuple[str, ...]]:
    """(the shipped default, every value) of ``batch.deadline_order``, read from the configuration schema."""
    field = BatchConfig.model_fields["deadline_order"]
    values = typing.get_args(field.annotation) or (field.default,)
    return str(field.default), tuple(str(v) for v in values)


def goodput_policies() -> tuple[str, ...]:
    """FCFS on B1, then calculet-b1-shared and calculet-b16 under every §7.2 order (the default unsuffixed)."""
    default, values = deadline_orders()
    names = ["b1-serial-fcfs"]
    for base in GOODPUT_DEVICES:
        names += [f"{base}@{v}" for v in values if v != default] + [base]
    return tuple(names)


def _with_order(name: str) -> PolicySpec | None:
    """``<engine policy>@<deadline_order>`` → a spec, validated by the configuration; None if unknown."""
    base, _, order = name.partition("@")
    spec = POLICIES.get(base)
    if spec is None or spec.kind != "engine" or not order:
        return None
    try:
        BatchConfig.model_validate({"deadline_order": order})
    except ValidationError:
        raise PolicyError(f"{name!r}: batch.deadline_order {order!r} is not one the configuration accepts "
                          f"({', '.join(deadline_orders()[1])})") from None
    return replace(spec, name=name, deadline_order=order,
                   description=f"{spec.description}; batch.deadline_order: {order} (§7.2)")


def parse_policies(text: str | Sequence[str]) -> tuple[PolicySpec, ...]:
    """``"b1-serial-fcfs,calculet-b16@strict"`` (or ``all``, ``goodput``) → specs, in the order given."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    names = [n for n in names if n]
    if not names:
        raise PolicyError("no policy given; choose from: " + ", ".join(POLICIES))
    if names == ["all"]:
        names = list(POLICIES)
    elif names == [GOODPUT_GROUP]:
        names = list(goodput_policies())
    specs = {n: POLICIES.get(n) or _with_order(n) for n in names}
    unknown = [n for n, spec in specs.items() if spec is None]
    if unknown:
        raise PolicyError(f"unknown polic{'ies' if len(unknown) > 1 else 'y'} {', '.join(map(repr, unknown))}; "
                          f"choose from: {', '.join(POLICIES)} (or 'all', '{GOODPUT_GROUP}'; an engine policy "
                          "may name a decode order: calculet-b1@strict)")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PolicyError(f"policy listed twice: {', '.join(duplicates)}")
    return tuple(specs[n] for n in names)  # type: ignore[misc]


def run_policy(policy: PolicySpec, requests: Sequence[SimRequest], workload: Workload, cost: CostModel, *,
               progress: Callable[[float], None] | None = None, max_seq: int = DEFAULT_MAX_SEQ) -> PolicyRun:
    """Run ``requests`` under ``policy`` on ``cost``; baselines by simulation, the rest through the engine."""
    if policy.kind == "engine":
        return run_engine(requests, policy.scheduler_config(workload), cost=cost, policy_name=policy.name,
                          max_seq=max_seq, options=policy.engine_options(), progress=progress,
                          prefill_chunk_tokens=policy.prefill_chunk_tokens)
    start = time.perf_counter()
    base = simulate_multi_slot(requests, cost, policy.slots) if policy.slots > 1 else simulate_serial_fcfs(requests, cost)
    wall = time.perf_counter() - start
    served = [r for r in base.requests if r.service_start_s is not None]
    if progress is not None:
        progress(base.end_s)
    return PolicyRun(policy.name, base.requests, base.batches, base.end_s, wall, prefill_jobs=len(served),
                     prefill_work_s=sum(cost.prefill_s(r.prompt_tokens) for r in served),
                     decode_work_s=decode_work_s(base.batches, cost))
