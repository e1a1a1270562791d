"""``calculet-b16-chunked``: §6 chunked prefill in a load simulation.

The policy runs the real engine on the ``future`` package whose B1 profile declares a 512-token
incremental-prefill chunk (simulated; CalRT 0.7.6 has no incremental prefill). Checked: the
catalogue entry and its package, and on a small storm-like workload that long prompts are
submitted as chunks (device jobs = the scheduler's count), every one completes, and short
prompts no longer wait behind a whole long prefill.
"""

from __future__ import annotations

import json
import math

import pytest

from calculet.packages.manifest import MANIFEST_FILE
from calculet.adapters.sim import CostModel
from calculet.errors import DefinitionError
from calculet.loadsim.policies import POLICIES, run_policy
from calculet.loadsim.engine_inputs import DEFAULT_MAX_SEQ, loadsim_package_dir
from calculet.loadsim.workload import generate_requests, parse_workload

COST = CostModel.reference()
LONG = 6000
"""Storm prompt length: long class (> 4096), 12 chunks of 512 (11 full + 368)."""


def storm_workload():  # noqa: ANN201 - a Workload
    return parse_workload({
        "schema": "calculet-loadsim/v1", "name": "mini-storm", "seed": 11, "duration_s": 30,
        "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
        "prompt_tokens": {"kind": "empirical", "values": [64, 128, 256]},
        "max_new_tokens": {"kind": "lognormal", "median": 8, "sigma": 0.3, "min": 2, "max": 16},
        "tenants": [{"name": "interactive", "weight": 2}, {"name": "docs"}],
        "storms": [{"start_s": 5, "count": 3, "spread_s": 1, "prompt_tokens": LONG, "max_new_tokens": 8,
                    "tenant": "docs"}],
    })


def test_the_chunked_policy_is_b16_with_a_512_token_chunk_after_pingpong() -> None:
    names = list(POLICIES)
    assert names.index("calculet-b16-chunked") == names.index("calculet-b16-pingpong") + 1
    spec = POLICIES["calculet-b16-chunked"]
    b16 = POLICIES["calculet-b16"]
    assert (spec.kind, spec.profiles, spec.max_inflight, spec.prefill_chunk_tokens) == ("engine", b16.profiles, 1, 512)
    assert "CalRT 0.7.6" in spec.description and "simulated" in spec.description and "§6" in spec.description
    chunked_names = {"calculet-b16-chunked", "calculet-b16-pingpong-chunked"}
    assert all(p.prefill_chunk_tokens is None for n, p in POLICIES.items() if n not in chunked_names)
    w = storm_workload()
    assert spec.scheduler_config(w) == b16.scheduler_config(w), "only the package differs"


def test_the_pingpong_chunked_policy_carries_its_own_wrr_weights() -> None:
    spec, pingpong = POLICIES["calculet-b16-pingpong-chunked"], POLICIES["calculet-b16-pingpong"]
    assert (spec.max_inflight, spec.prefill_chunk_tokens) == (2, 512)
    w = storm_workload()
    weights = spec.scheduler_config(w).queues.wrr_weights()
    assert weights == {**pingpong.scheduler_config(w).queues.wrr_weights(), "long": 4}
    assert "R6.4" in spec.description and "simulated" in spec.description


def test_each_chunk_size_gets_its_own_package() -> None:
    plain, chunked = loadsim_package_dir(), loadsim_package_dir(DEFAULT_MAX_SEQ, 512)
    assert plain != chunked and loadsim_package_dir(DEFAULT_MAX_SEQ, 512) == chunked
    b1 = {p["compiled_batch"]: p for p in json.loads((chunked / MANIFEST_FILE).read_bytes())["profiles"]}[1]
    assert b1["prefill_chunk_tokens"] == 512
    assert b"prefill_chunk_tokens" not in (plain / MANIFEST_FILE).read_bytes()
    for bad in (0, DEFAULT_MAX_SEQ + 1):
        with pytest.raises(DefinitionError, match="prefill_chunk_tokens"):
            loadsim_package_dir(DEFAULT_MAX_SEQ, bad)


@pytest.mark.req("R6.5")
def test_a_storm_under_the_chunked_policy_is_prefilled_in_chunks_and_completes() -> None:
    w = storm_workload()
    requests = generate_requests(w)
    longs = [i for i, r in enumerate(requests) if r.prompt_tokens == LONG]
    assert len(longs) == 3 and len(requests) > 20
    plain = run_policy(POLICIES["calculet-b16"], requests, w, COST)
    chunked = run_policy(POLICIES["calculet-b16-chunked"], requests, w, COST)
    for run in (plain, chunked):
        assert run.duplicate_closes == 0 and run.late_tokens == 0
        assert all(r.finish_reason == "length" for r in run.requests), "every request completes"
    # §6: without a declared chunk one job per prompt; with it, ceil(p / 512) jobs per prompt.
    assert plain.prefill_jobs == len(requests) and plain.statistics.scheduler.prefill.chunked_jobs == 0
    jobs = sum(math.ceil(r.prompt_tokens / 512) for r in requests)
    assert chunked.prefill_jobs == jobs
    assert chunked.statistics.scheduler.prefill.chunked_jobs == 3 * math.ceil(LONG / 512)
    # every chunk pays the fixed prefill cost: more device work, but short prompts stop waiting
    # behind a whole 6000-token prefill.
    assert chunked.prefill_work_s > plain.prefill_work_s
    short = [i for i, r in enumerate(requests) if r.prompt_tokens <= 512]

    def worst_short_ttft(run) -> float:  # noqa: ANN001
        return max(run.requests[i].first_token_s - run.requests[i].arrival_s for i in short)

    assert worst_short_ttft(chunked) < worst_short_ttft(plain)
