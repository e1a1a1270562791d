"""The products a soak runs (§19 M0): a load-simulation policy, or B1 as the service ships it.

Why a product and not only a policy: M0 asks for "B1 stable, 24h" of *the product that exists*
(issue #13). The load-simulation policies (:mod:`calculet.loadsim.policies`) size KV lanes to
fill their batches and the original soak raises the reset budget so injected faults never
exhaust it — right for exercising every executor path, not what ships. A product names the
whole configuration a soak runs:

* ``policy`` (the default, today's soak): the engine policy given by ``SoakOptions.policy``
  (``calculet-b16-pingpong`` unless told otherwise) with the reset budget raised to
  :data:`RAISED_RESET_BUDGET` per 10 min, so the fault rate never decides the outcome;
* ``b1-shipped``: the shipped ``calculet-scheduler/v1`` configuration, ``default.yaml`` exactly
  (§15: B1 profile only, one job in flight — no ping/pong, R19.8 —, ``admission.max_sequences``
  16 KV sequences sharing the device by decode rotation, the default deadline order, and the
  spec's reset budget of 2 resets in any sliding 10 minutes), with only the workload's tenants
  added (the operator's tenant list: the simulator's requests name them). Its defaults are a
  traffic level one B1 device serves (``steady`` at load 0.2: ≈ 0.1 req/s × ≈ 150 output tokens
  keep a B1 device ≈ 62% busy on the reference cost model) and a fault rate the shipped budget
  is meant to survive (:data:`B1_SHIPPED_FAULT_RATE`; why in its docstring). A budget given to
  the soak explicitly is applied and named in the report ("changed from the shipped 2"), never
  silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calculet.config import SchedulerConfig, load_config, parse_config
from calculet.config.loading import DEFAULT_CONFIG_PATH
from calculet.errors import DefinitionError
from calculet.loadsim.policies import POLICIES
from calculet.loadsim.runner import default_options
from calculet.loadsim.workload import Workload
from calculet.runtime.engine.types import EngineOptions

__all__ = ["B1_SHIPPED_FAULT_RATE", "PRODUCTS", "RAISED_RESET_BUDGET", "SoakProduct", "SoakSetup", "soak_setup"]

RAISED_RESET_BUDGET = 50
"""Resets per 10 min the ``policy`` product allows: high enough that injected faults never exhaust it."""

B1_SHIPPED_FAULT_RATE = 2e-6
"""Faults per kind per job for ``b1-shipped`` (six kinds; three of them — Wait timeout, CCU fault,
unknown DMA — need a reset or restart). On B1 every decode job serves one sequence, so with the
device ≈ 62% busy (``steady`` at load 0.2: ≈ 52 000 jobs per hour) this is ≈ 0.6 faults per hour
and ≈ 0.3 recoveries per hour: ≈ 0.05 per 10 min, against a budget of 2. The shipped budget is
meant to stop a device that keeps failing (3 resets within 10 minutes), not occasional faults;
at this rate the expected number of 10-minute windows holding 3 resets in a day is ≈ 0.01. The
original soak's 1e-5 per kind per job is ≈ 5x more recoveries per hour on B1 (≈ 1.5, 0.26 per 10
min): 3 recoveries within 10 minutes are then expected about once a day, the shipped budget is
exhausted, the model becomes Failed (503) for good, and the soak reports it (``--fault-rate
1e-5``)."""


@dataclass(frozen=True)
class SoakProduct:
    """One product a soak can run, with the defaults its figures are quoted at."""

    name: str
    description: str
    preset: str
    load_scale: float
    fault_rate: float


PRODUCTS: dict[str, SoakProduct] = {p.name: p for p in (
    SoakProduct("policy", "a load-simulation engine policy (--policy) with the reset budget raised to "
                f"{RAISED_RESET_BUDGET} per 10 min", "steady", 1.0, 1e-5),
    SoakProduct("b1-shipped", "the shipped default.yaml: B1 only, one job in flight (no ping/pong), the "
                "shipped KV sequences sharing the device, the spec's reset budget", "steady", 0.2,
                B1_SHIPPED_FAULT_RATE),
)}


@dataclass(frozen=True)
class SoakSetup:
    """What the soak builds its engine from."""

    config: SchedulerConfig
    engine_options: EngineOptions
    prefill_chunk_tokens: int | None
    label: str
    """What ran, as the report names it (the policy, or ``b1-shipped (default.yaml)``)."""
    reset_budget: int
    budget_note: str
    """Where the budget comes from: ``shipped``, ``raised for the soak`` or ``raised from shipped N``."""


def soak_setup(product: str, policy: str, workload: Workload, max_resets_per_10min: int | None) -> SoakSetup:
    """The configuration, engine options and labels of ``product`` serving ``workload``."""
    if product == "policy":
        spec = POLICIES[policy]
        budget = RAISED_RESET_BUDGET if max_resets_per_10min is None else max_resets_per_10min
        config = spec.scheduler_config(workload, recovery={"max_resets_per_10min": budget})
        return SoakSetup(config, spec.engine_options(), spec.prefill_chunk_tokens, policy, budget,
                         "raised for the soak")
    if product == "b1-shipped":
        return _b1_shipped(workload, max_resets_per_10min)
    raise DefinitionError(f"unknown soak product {product!r}; choose from: {', '.join(PRODUCTS)}")


def _b1_shipped(workload: Workload, max_resets_per_10min: int | None) -> SoakSetup:
    """``default.yaml`` as shipped, the workload's tenants added; a given budget is applied and named."""
    shipped = load_config(DEFAULT_CONFIG_PATH)
    data: dict[str, Any] = shipped.model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["schema"] = "calculet-scheduler/v1"
    data["tenants"] = [t.model_dump(mode="json", exclude_none=True) for t in workload.tenant_configs()]
    shipped_budget = shipped.recovery.max_resets_per_10min
    note = "shipped"
    if max_resets_per_10min is not None and max_resets_per_10min != shipped_budget:
        data.setdefault("recovery", {})["max_resets_per_10min"] = max_resets_per_10min
        note = f"changed from the shipped {shipped_budget}"
    config = parse_config(data, source="soak product b1-shipped (default.yaml + the workload's tenants)")
    if config.batch.profiles != (1,) or config.executor.max_inflight != 1:
        raise DefinitionError(f"default.yaml no longer ships B1 only with one job in flight (profiles "
                              f"{config.batch.profiles}, max_inflight {config.executor.max_inflight}); "
                              "the b1-shipped soak must be reconsidered")
    return SoakSetup(config, default_options(), None, "b1-shipped (default.yaml)",
                     config.recovery.max_resets_per_10min, note)
