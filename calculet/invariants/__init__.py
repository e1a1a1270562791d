"""The proofs (DESIGN: "declare once, derive everything"): the spec's invariants checked with z3
over every declared transition, from the declarations alone.

``checks`` (one machine: induction, guard overlap, deadlock, row reachability), ``pool_checks``
(N KV lanes by induction with symmetry, BMC from the empty pool), the joint requests × lanes
system (``system_encoding``, ``system_induction``, ``system_bmc``, ``system_document``,
``system_checks``), ``mutation`` (seeded mutants the checker must reject), ``witness`` (concrete
runs that take every row), ``traceability`` and ``report`` (documents for ``specs/``).

It reads declarations from :mod:`calculet.machines` and the expression language from
:mod:`calculet.logic`; it imports nothing of the runtime, and nothing below it imports it.
"""
