"""The sampling parameters of a request, kept per distinct value set (issue #13: request_parsing._sampling_params).

Catches a memo keyed on less than every parameter (a stale instance for a request that differs in one field only),
one that keeps ``1`` and ``1.0`` together, and one that keeps a refusal (an invalid set answered once, then not)."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.errors import BadRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.server.request_parsing import _sampling_params, parse_body, sampling
from calculet.server.schemas import CompletionRequest

BASE = {"model": "m", "prompt": "x", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": 7,
        "stop": ["a"], "ignore_eos": False}
CHANGES = [{}, {"temperature": 0.7}, {"top_p": 0.8}, {"top_k": 4}, {"seed": 8}, {"seed": None}, {"stop": ["b"]},
           {"stop": ["a", "b"]}, {"ignore_eos": True}, {"temperature": 0}]


def _body(**changes: object) -> CompletionRequest:
    import json

    return parse_body(CompletionRequest, json.dumps({**BASE, **changes}).encode())


def _direct(body: CompletionRequest) -> SamplingParams:
    temperature = float(body.temperature if body.temperature is not None else 1.0)
    return SamplingParams(temperature=0.0 if temperature < 1e-5 else temperature, top_p=float(body.top_p or 1.0),
                          top_k=body.top_k or 0, seed=body.seed, stop_text=tuple(body.stop_strings()),
                          ignore_eos=body.ignore_eos)


def test_each_request_gets_the_parameters_of_its_own_fields() -> None:
    # mutant: a memo keyed without one field (seed, stop, ...) hands the previous request's parameters on
    for _ in range(2):  # the second pass reads every set back from the memo
        for changes in CHANGES:
            body = _body(**changes)
            got = sampling(body)
            assert dataclasses.astuple(got) == dataclasses.astuple(_direct(body)), changes
    assert sampling(_body()) is sampling(_body())  # kept: one instance per distinct set


def test_int_and_float_are_kept_apart() -> None:
    # mutant: typed=False returns the SamplingParams built for 1 (int) to a caller asking for 1.0 (float)
    _sampling_params.cache_clear()
    first = _sampling_params(1, 1.0, 0, None, (), False)
    second = _sampling_params(1.0, 1.0, 0, None, (), False)
    assert type(first.temperature) is int and type(second.temperature) is float


def test_an_invalid_set_is_refused_every_time() -> None:
    # mutant: a memo that kept a failure as an answer (or the check skipped on a hit)
    for _ in range(2):
        with pytest.raises(BadRequest):
            _sampling_params(0.5, 1.5, 0, None, (), False)  # top_p beyond 1: SamplingParams' own check
