"""Calculet: LLM inference scheduling for the Calculet NPU (CalRT 0.7.6).

Every lifecycle is declared once in :mod:`calculet.machines`; the runtime's dispatch tables, the
z3 proofs, the documents in ``specs/`` and the Hypothesis fuzzing are all derived from it.
"""

__version__ = "0.1.0"
