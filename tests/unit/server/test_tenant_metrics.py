"""A tenant's metric series resolved once (issue #20: ``labels()`` per observation was eight lookups under a lock
per request on the actor thread): each field of ``ServiceMetrics.of(tenant)`` is that family's own child for the
tenant, for a configured tenant and for one first seen later."""

from __future__ import annotations

from calculet.server.request_metrics import ServiceMetrics, TenantMetrics, make_registry


def test_each_field_is_its_familys_child_for_the_tenant() -> None:
    """Catches: two fields swapped in the tuple (a TTFT observed into the e2e histogram), a child of another
    tenant, a new child per call."""
    metrics = ServiceMetrics(make_registry(), ["alpha"])
    for tenant in ("alpha", "later"):
        children = metrics.of(tenant)
        assert metrics.of(tenant) is children
        for field in TenantMetrics._fields:
            assert getattr(children, field) is getattr(metrics, field).labels(tenant), field
