"""The expression language the machines are written in (DESIGN: declare once, derive everything).

Guards, effects and invariants are Python expressions that evaluate on plain values on the hot
path and on z3 terms in the proofs. This package holds what makes that possible — the
``And``/``Or``/``If``/``In`` helpers (:mod:`.expr`), the bounded variable types (:mod:`.types`)
and the symbolic namespace a declaration is read through (:mod:`.symbolic`) — and nothing that
knows a particular machine. It sits below ``machines`` and ``invariants``, which both stand on it.
"""
