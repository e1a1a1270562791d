"""The load simulator's numbers come from the real runtime: virtual time and real time agree.

For a small, fast version of each preset, the same requests are served twice by the same
engine code — once by :class:`EngineDriver` in virtual time (the load simulator's path, with
the recording wrappers), once by the live :class:`Engine` (actor and completion threads, the
simulated NPU's worker thread, the monotonic clock). Outcomes that do not depend on timing
must be identical: which requests completed and which were rejected, and every delivered
token. So the workload is made timing-independent: deadlines and client cancels are dropped,
tenant rate and waiting-token limits removed, prompts shortened (the storm's long prompts stay
long: > 4096 tokens), outputs capped; and two requests are made invalid (an unknown tenant,
a prompt + output beyond the context) so that rejections are compared as well.

Invariant monitors raise throughout (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from calculet.adapters.sim import CostModel
from calculet.loadsim.policies import POLICIES
from calculet.loadsim.engine_inputs import DEFAULT_MAX_SEQ
from calculet.loadsim.live import run_live
from calculet.loadsim.runner import run_engine
from calculet.loadsim.workload import SimRequest, Workload, generate_requests, load_preset, preset_names

COST = CostModel.tiny()
MAX_PROMPT = 6000          # still "long" (> 4096) for the storm prompts, cheap enough in real time
MAX_NEW = 12


def timing_free(workload: Workload) -> Workload:
    """The workload's tenants without the §5.3 limits whose outcome depends on timing (QPS, waiting tokens)."""
    tenants = tuple(t.model_copy(update={"qps": None, "max_waiting_tokens": None}) for t in workload.tenants)
    return workload.model_copy(update={"tenants": tenants})


def small_requests(workload: Workload) -> list[SimRequest]:
    """~20 requests of the preset (its storms included when they fall in the window), made timing-free."""
    duration = 70.0 if workload.storms else 30.0
    load = 2.0 if workload.name != "long-prefill-storm" else 0.5
    reqs = [dataclasses.replace(r, prompt_tokens=min(r.prompt_tokens, MAX_PROMPT),
                                max_new_tokens=min(r.max_new_tokens, MAX_NEW), deadline_ms=None, cancel_after_s=None)
            for r in generate_requests(workload, duration, load)][:24]
    assert len(reqs) >= 8
    last = reqs[-1].arrival_s
    reqs.append(SimRequest(last, "no-such-tenant", 16, 4, None, None, "short"))
    reqs.append(SimRequest(last, workload.tenants[0].name, 4096, DEFAULT_MAX_SEQ, None, None, "medium"))
    return reqs


@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("policy", ["calculet-b16", "calculet-b16-pingpong"])
def test_virtual_and_live_engines_agree(preset: str, policy: str) -> None:
    workload = timing_free(load_preset(preset))
    requests = small_requests(workload)
    spec = POLICIES[policy]
    config = spec.scheduler_config(workload)

    virtual = run_engine(requests, config, cost=COST, options=spec.engine_options(), keep_tokens=True)
    live = run_live(requests, config, cost=COST, options=spec.engine_options())

    assert virtual.duplicate_closes == 0 and virtual.late_tokens == 0
    assert all(o.closes == 1 for o in live)
    v_outcomes = [r.finish_reason for r in virtual.requests]
    l_outcomes = [o.finish_reason for o in live]
    assert v_outcomes == l_outcomes
    assert [t for t in virtual.token_ids] == [o.tokens for o in live]
    # the workload exercised both paths: completions with every token, and the two rejections
    completed = [i for i, r in enumerate(virtual.requests) if r.finish_reason == "length"]
    assert len(completed) == len(requests) - 2
    assert all(len(virtual.token_ids[i]) == requests[i].max_new_tokens for i in completed)
    rejected = {r.request_id: r.rejection_reason for r in virtual.requests if not r.admitted}
    assert rejected == {len(requests) - 2: "reject_invalid:unknown_tenant",
                        len(requests) - 1: "reject_invalid:too_long"}
    assert [o.http_status for o in live[-2:]] == [400, 400]
    if workload.storms:
        assert any(r.prompt_tokens > 4096 for r in requests[:-2])   # a storm prompt was served in both
