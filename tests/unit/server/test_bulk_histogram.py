"""BulkHistogram.observe_many (issue #20: a finished request's inter-token gaps observed in one call) exposes what
``observe`` of each sample exposes: the same buckets and count per label, and the same sum up to the order of the
float additions (exactly the same where every partial sum is exact)."""

from __future__ import annotations

import random

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from calculet.server.request_metrics import ITL_BUCKETS, BulkHistogram, make_registry


def exposition(samples_by_tenant: dict[str, list[list[float]]], bulk: bool) -> bytes:
    registry = make_registry()
    histogram = BulkHistogram("t_seconds", "test", ["tenant"], buckets=ITL_BUCKETS, registry=registry)
    for tenant, requests in samples_by_tenant.items():
        child = histogram.labels(tenant)
        for samples in requests:
            if bulk:
                child.observe_many(samples)
            else:
                for sample in samples:
                    child.observe(sample)
    return generate_latest(registry)


def samples(exposed: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(exposed.decode()) for sample in family.samples}


def data(rng: random.Random, values: list[float]) -> dict[str, list[list[float]]]:
    out = {tenant: [[rng.choice(values) for _ in range(rng.randrange(0, 80))] for _ in range(12)] for tenant in "ab"}
    out["a"].append([])  # a request with one token: no gap
    return out


def test_observe_many_exposes_what_observe_of_each_sample_does() -> None:
    """Mutants caught: the bucket found with ``bisect_right`` (a sample equal to an upper bound one bucket too
    high), the sum left out, a bucket's count incremented by one whatever its samples."""
    rng = random.Random(20)
    exact = [n / 4096 for n in range(0, 3 * 4096, 7)] + [0.0, 0.25, 0.5, 1.0, 2.5, 10.0]  # bounds among them
    given = data(rng, exact)  # multiples of 2**-12: every partial sum exact, the sums equal bit for bit
    assert exposition(given, True) == exposition(given, False)
    on_bounds = data(rng, list(ITL_BUCKETS) + [1e-4, 0.0011, 0.019, 3.0, 60.0])  # every bound, inexact sums
    bulk, each = samples(exposition(on_bounds, True)), samples(exposition(on_bounds, False))
    assert bulk.keys() == each.keys() and any(name.endswith("_bucket") for name, _ in bulk)
    for key, value in each.items():
        if key[0].endswith("_sum"):
            assert abs(bulk[key] - value) <= 1e-12 * max(1.0, abs(value)), key
        else:
            assert bulk[key] == value, key


def test_observe_http_exposes_what_inc_and_observe_expose() -> None:
    """Catches: ServiceMetrics.observe_http's direct increments (issue #20) counting another bucket, series or sum than
    the library's ``labels().inc()`` and ``labels().observe()`` of the same requests."""
    from calculet.server.request_metrics import HTTP_BUCKETS, ServiceMetrics

    requests = [("/v1/completions", "POST", 200, 0.0), ("/v1/completions", "POST", 429, 0.25), ("/health", "GET", 200,
                HTTP_BUCKETS[3]), ("/v1/completions", "POST", 200, 1e9), ("/v1/completions", "POST", 200, 0.5)]
    registries = make_registry(), make_registry()
    fast, slow = ServiceMetrics(registries[0], ["default"]), ServiceMetrics(registries[1], ["default"])
    for route, method, status, took in requests:
        fast.observe_http(route, method, status, took)
        slow.http_requests.labels(route, method, str(status)).inc()
        slow.http_duration.labels(route).observe(took)
    assert samples(generate_latest(registries[0])) == samples(generate_latest(registries[1]))
