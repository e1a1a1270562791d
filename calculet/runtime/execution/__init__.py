"""Executing the scheduler's plans on a device (§3, §7.4, §11, §12, §14).

The session of one model generation (``session``; what a package states, ``model_facts``; what a
generation configures, ``session_plan``; the step 9 proofs, ``golden``), the executor that submits
and tracks jobs (``executor``, ``inflight``), the checks of each result (``verification``), the
ping/pong degrade (``degrade``), per-lane sampling into the scheduler's completions
(``dispatch``, ``sampler``) and fault recovery (``recovery``)."""
