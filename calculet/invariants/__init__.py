"""Invariants: expression helpers, the z3 encoder, pool properties, the checker and monitors.

Imports nothing of the runtime (DESIGN: arrows point down only).
"""
