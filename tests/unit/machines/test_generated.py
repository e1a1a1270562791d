"""The machines' hot path written out as source (issue #20): current, imported, and refused when stale.

``python -m calculet.specgen`` writes one module per shipped declaration under ``calculet/machines/generated/``
(:mod:`calculet.machines.codegen_module`); the runtime imports it instead of generating the code at each start
(:mod:`calculet.machines.compiled`). These tests hold the written files to the declarations, check that the shipped
machines — hence the conformance tests against the reference class (tests/property/test_conformance.py) and every
runtime test — run the written modules, and that a module left behind by a changed declaration is not used.
"""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path

import pytest

from calculet import specgen
from calculet.invariants.mutation import derive, replace_row
from calculet.machines import ALL_MACHINES, KvSequenceMachine
from calculet.machines.compiled import written_module
from calculet.machines.errors import InvariantViolation, TransitionNotAllowed
from calculet.machines.written import module_name

REGENERATE = "run `python -m calculet.specgen`"


@pytest.fixture(scope="module")
def code() -> dict[str, str]:
    return specgen.render_code()


def test_the_written_modules_are_what_the_declarations_produce(code):
    """Every shipped declaration's module under calculet/machines/generated/ is byte for byte what
    ``codegen_module.module_source`` (the machines), ``joint_codegen.module_source`` (the RequestLaneSystem's part
    checks), ``kv_guard.module_source`` (the KvLanePool's reduced guard, session 24) or
    ``codegen_composite.composite_source`` (the B1 decode step's composite, session 26) prints from it now, and no
    other module is there. Mutant caught (applied
    once): a guard edited by hand in generated/kv_sequence.py (``tokens <= self.max_seq`` to ``< ``) — the file
    differs from the declaration's."""
    problems = specgen.check_code(specgen.CODE_DIR, code)
    assert problems == [], f"calculet/machines/generated/ is stale; {REGENERATE}:\n" + "\n".join(problems)
    machines = [f"{name.rsplit('.', 1)[1]}.py" for name in (module_name(m) for m in ALL_MACHINES) if name]
    assert sorted(code) == sorted([*machines, "request_lane_system_parts.py", "kv_lane_pool.py", "decode_step.py",
                                    "decode_submit.py"])


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_shipped_machines_run_their_written_modules(machine):
    """``Machine.create`` (what the runtime and the conformance tests use) gives instances whose ``__init__``,
    ``fire``, ``fire_each``, dispatch tables and invariant check are the written module's functions, bound to
    this declaration's rows. Mutant caught (applied once): ``compile_instance_type`` ignoring the declaration's
    written module (the code generated and exec'd at import, as before) — the functions' globals are not the
    module's."""
    name = module_name(machine)
    assert name is not None
    module = sys.modules[name]
    instance = machine.create(**machine.definition.examples[0])
    cls = type(instance)
    functions = [cls.__init__, cls.fire, cls._fire_plain, cls.fire_each, cls.snapshot, cls._check_invariants,
                 *(f for events in cls._table.values() for f in events.values()),
                 *(f for events in cls._fire_table.values() for f in events.values())]
    assert all(f.__globals__ is module.__dict__ for f in functions)
    assert module.DECLARATION == f"{machine.__module__}.{machine.__qualname__}"
    rows = {name: value for name, value in vars(module).items() if name.startswith(("_row_", "_each_row_"))}
    assert rows and all(any(value is t for t in machine.definition.transitions) for value in rows.values())
    assert cls.fire.__qualname__ == f"{machine.definition.name}.fire"


def test_a_written_module_of_another_shape_is_not_bound():
    """A declaration whose shape no longer matches its written module (here the KV reserve row's guard dropped,
    without running specgen) does not get that module: ``written_module`` warns, naming the command, and the
    machine's code is generated from the declaration at import. Mutant caught (applied once): the SHAPE
    comparison removed from ``written_module`` — the stale module is returned."""
    mutant = derive(KvSequenceMachine, "KvSequenceMachine", lambda rows, d: replace_row(rows, "reserve@free", guard=None))
    with pytest.warns(UserWarning, match=r"stale .*python -m calculet.specgen"):
        assert written_module(mutant.definition, KvSequenceMachine) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert written_module(KvSequenceMachine.definition, KvSequenceMachine) is sys.modules[
            "calculet.machines.generated.kv_sequence"]
    # a mutant (declared outside calculet.machines) runs its own generated code: the guard is gone, so the
    # reserve is taken (and the monitor, on in tests, finds the broken invariant) where the written code refuses
    lane = mutant.create(**KvSequenceMachine.definition.examples[0])
    with pytest.raises(InvariantViolation, match="reserve@free"):
        lane.fire("reserve", seq=1, gen=1, tokens=lane.max_seq + 1)
    shipped = KvSequenceMachine.create(**KvSequenceMachine.definition.examples[0])
    with pytest.raises(TransitionNotAllowed):
        shipped.fire("reserve", seq=1, gen=1, tokens=shipped.max_seq + 1)
    assert type(lane).__init__.__globals__["__name__"].startswith("<calculet generated")


def test_specgen_check_names_a_stale_generated_module_and_the_command(tmp_path, capsys, code):
    """``python -m calculet.specgen --check`` exits 1 on a generated module edited by hand or one no declaration
    produces, naming each and the command that regenerates them; writing makes the folder current again.
    Mutant caught (applied once): ``main`` not checking the generated modules (exit 0 on the stale folder)."""
    specs = tmp_path / "specs"
    shutil.copytree(specgen.SPECS_DIR, specs)
    target = tmp_path / "generated"
    shutil.copytree(specgen.CODE_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    kv = target / "kv_sequence.py"
    text = kv.read_text()
    assert "(_a_tokens <= self.max_seq)" in text
    kv.write_text(text.replace("(_a_tokens <= self.max_seq)", "(_a_tokens < self.max_seq)"))
    (target / "stray.py").write_text("x = 1\n")

    assert specgen.main(["--check", "--out", str(specs), "--code-out", str(target)]) == 1
    out = capsys.readouterr().out
    assert "calculet/machines/generated/ is stale (2 module(s)); run `python -m calculet.specgen`" in out
    assert "kv_sequence.py: 4 line(s) differ" in out and "stray.py: not generated" in out
    assert "request.py" not in out

    (target / "stray.py").unlink()
    assert specgen.main(["--out", str(specs), "--code-out", str(target)]) == 0
    assert kv.read_text() == code["kv_sequence.py"]
    assert specgen.main(["--check", "--out", str(specs), "--code-out", str(target)]) == 0
    assert (target / "__init__.py").read_text() == (specgen.CODE_DIR / "__init__.py").read_text()


def test_the_generated_package_imports_no_z3_and_no_code_generator():
    """A written module needs neither z3 nor the code generator to be imported (only the sentinel of
    :mod:`calculet.machines.written`), so the runtime can load its machines without printing anything. Mutant
    caught (applied once): the prelude importing ``MISSING`` from :mod:`calculet.machines.codegen`."""
    for path in sorted(Path(specgen.CODE_DIR).glob("*.py")):
        imports = [line for line in path.read_text().splitlines() if line.startswith(("import ", "from "))]
        assert all(not line.startswith(("import z3", "from z3", "from calculet.machines.codegen")) for line in imports)
        assert all(line in ("from __future__ import annotations",
                            "from itertools import islice as _islice",
                            "from typing import Any as _Any, Sequence as _Sequence",
                            "from typing import Any as _Any",
                            "from calculet.machines.written import MISSING as _M") for line in imports), imports


def test_the_joint_monitor_runs_the_written_part_checks():
    """The RequestLaneSystem's checks on a part of at most one request and one lane come from the written
    ``generated/request_lane_system_parts.py`` (which tests/unit/runtime/scheduling/test_joint_checks.py holds to
    the declared predicates on random parts); a derived (mutant) system's are generated from it at import. Mutant
    caught (applied once): ``joint_codegen._written`` returning None (the checks generated and exec'd at start)."""
    from calculet.machines.request_lanes import RequestLaneSystem
    from calculet.runtime.scheduling import joint_checks, joint_codegen

    module = sys.modules[joint_codegen.WRITTEN]
    for shape_ in joint_codegen.SHAPES:
        check = joint_codegen.compile_part_check(RequestLaneSystem.definition, *shape_)
        assert check is not None and check.__globals__ is module.__dict__
        assert joint_checks._PART_CHECKS[shape_] is check
    mutant = RequestLaneSystem.derive("RequestLaneSystem")
    other = joint_codegen.compile_part_check(mutant.definition, 1, 1)
    assert other is not None and other.__globals__ is not module.__dict__


def test_the_part_checks_print_the_same_whatever_z3_made_before():
    """``z3.simplify`` orders the operands of a conjunction by term id, which depends on every term the process
    made before; the written part checks must not (``specgen --check`` in CI runs in another process than the one
    that wrote them). Terms that take low ids in an order unlike the generator's are made first, then the module is
    printed again and compared with the file on disk. Mutant caught (applied once): ``_PartPrinter`` printing the
    operands in z3's order instead of sorted."""
    import z3

    from calculet.machines.request_lanes import RequestLaneSystem
    from calculet.runtime.scheduling import joint_codegen

    made_first = [z3.Int(f"g22_{i}") <= z3.Int("s0") for i in range(300)]
    made_first += [z3.Int("b0") == -1, z3.Int("b0") == 0, z3.Int("s0") + 1]
    text = joint_codegen.module_source(RequestLaneSystem.definition, joint_codegen.RequestLaneSystem.__module__ +
                                       ".RequestLaneSystem")
    assert text == (specgen.CODE_DIR / "request_lane_system_parts.py").read_text(), "run `python -m calculet.specgen`"


def test_the_kv_lane_manager_runs_the_written_pool_functions(monkeypatch):
    """The KvLanePool's reduced reserve guard, measures, moves and one-lane invariants come from the written
    ``generated/kv_lane_pool.py`` (session 24; tests/unit/runtime/scheduling/test_kv_guard.py proves the reduction and
    seeds the faults); a pool that is not the shipped declaration (a weakened copy) has its own generated and
    ``exec``'d, and a written module of another shape is not used (a warning names the command). Mutants caught
    (applied once): ``kv_guard._written`` returning None (the functions exec'd at start); the SHAPE comparison
    removed (the stale module returned)."""
    import dataclasses
    import inspect

    from calculet.machines.kv_pool import KvLanePool
    from calculet.runtime.scheduling import kv, kv_checks, kv_guard

    module = sys.modules[kv_guard.WRITTEN]
    pool = KvLanePool.definition
    for compile_function in (kv_guard.compile_reserve_guard, kv_guard.compile_measures, kv_guard.compile_moves,
                             kv_guard.compile_one_lane_invariants):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            function, source = compile_function(pool)
        assert function.__globals__ is module.__dict__ and source.startswith(f"def {function.__name__}(")
    assert kv._RESERVE_GUARD is module.reserve_guard and kv._MEASURES is module.measures
    assert kv._MOVES is module.moves and kv_checks._MEASURES is module.measures
    copy = dataclasses.replace(pool)
    guard, source = kv_guard.compile_reserve_guard(copy)
    assert guard.__globals__ is not module.__dict__ and source == inspect.getsource(module.reserve_guard)
    renamed = dataclasses.replace(pool, invariants=pool.invariants[:-1])
    assert kv_guard.pool_shape(renamed) != module.SHAPE
    assert kv_guard._written(renamed) is None  # not the shipped declaration
    monkeypatch.setattr(KvLanePool, "definition", renamed)  # the declaration lost an invariant, specgen not run
    with pytest.warns(UserWarning, match=r"stale.*python -m calculet.specgen"):
        assert kv_guard._written(renamed) is None


def test_the_pool_functions_print_the_same_whatever_z3_made_before():
    """As the part checks (above): the written KV pool functions do not depend on the order z3 made terms in before
    they were printed (the reserve guard's conjunction is printed in text order). Mutant caught (applied once):
    ``kv_guard._ReducedPrinter`` printing the operands in z3's order instead of sorted."""
    import z3

    from calculet.machines.kv_pool import KvLanePool
    from calculet.runtime.scheduling import kv_guard

    names = ["state_l1", "generation_l1", "seq_id_l1", "gen", "seq", "tokens", "reserved_len_l1", "max_sequences"]
    made_first = [z3.Int(f"g24_{i}") <= z3.Int("tokens") for i in range(300)]
    made_first += [z3.Not(z3.Int(a) == z3.Int(b)) for a in names for b in names]
    made_first += [z3.Int("seq_id_l1") == z3.Int("seq"), z3.Int("generation_l1") == z3.Int("gen")]
    text = kv_guard.module_source(KvLanePool.definition, "calculet.machines.kv_pool.KvLanePool")
    assert text == (specgen.CODE_DIR / "kv_lane_pool.py").read_text(), "run `python -m calculet.specgen`"


def test_the_runtime_binds_the_written_composite():
    """The B1 decode step's composite (``generated/decode_step.py``, :mod:`calculet.machines.codegen_composite`) is
    the one the completion path runs, bound to the shipped declarations' rows; a composite printed for other shapes
    is not bound (the events are then fired one by one). Mutant caught (applied once): ``bind_composite`` not
    comparing the shapes — the stale module is bound."""
    from calculet.machines import DeviceJobMachine, RequestMachine
    from calculet.runtime.scheduling import step_done

    module = step_done.COMPOSITE
    assert module is sys.modules["calculet.machines.generated.decode_step"]
    rows = [value for name, value in vars(module).items() if name.startswith("_p") and "_row_" in name]
    shipped = [*DeviceJobMachine.definition.transitions, *KvSequenceMachine.definition.transitions,
               *RequestMachine.definition.transitions]
    assert rows and all(any(value is t for t in shipped) for value in rows)
    saved = module.SHAPES
    try:
        module.SHAPES = ("stale", *saved[1:])
        assert step_done.bind_composite("decode_step") is None
    finally:
        module.SHAPES = saved
    assert step_done.bind_composite("decode_step") is module
