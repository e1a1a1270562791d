"""The declared machines' hot paths, written out as source (issue #20) — every module here but this one is generated.

One module per shipped declaration (``request.py`` for ``RequestMachine``, named as its document in ``specs/``),
printed by :func:`calculet.machines.codegen_module.module_source` from the z3 terms of the declared guards and
effects and written by ``python -m calculet.specgen``; ``--check`` (CI) and ``tests/unit/machines/test_generated.py``
fail when one is not what its declaration produces. :func:`calculet.machines.compiled.compile_instance_type`
imports them instead of generating and ``exec``'ing the code at each start. Two more are printed from declarations
the same way: ``request_lane_system_parts.py`` (the RequestLaneSystem's part checks,
:mod:`calculet.runtime.scheduling.joint_codegen`) and ``kv_lane_pool.py`` (the KvLanePool's reduced reserve guard,
measures and one-lane invariants, :mod:`calculet.runtime.scheduling.kv_guard`), and the composites ``decode_step.py``
and ``decode_submit.py`` print several machines' events of one B1 decode step as one function
(:mod:`calculet.machines.codegen_composite`). Do not edit them by hand.
"""
