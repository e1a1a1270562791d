"""The engine core's CPU per streamed token on the null device, on one thread (issue #20: the actor's work alone).

``bench/actor_path.py`` runs the threaded engine with asyncio consumers; on this shared 2-core machine its figures
move ±15 % round to round, mostly from the threads' contention, more than a change of a few per cent. This drives
:meth:`EngineCore.turn` itself on the calling thread — the same bring-up (``calculet.run --sim-cost null``: bundled
package, §15 default config, monitors at their production default), the same turn and chaining (1 ms), no mailbox,
no snapshot publication, no consumer — and reports the thread's CPU (``time.thread_time``) and Python calls per
streamed token. With ``--against TREE`` it runs a second copy of itself on the tree ``TREE`` (a worktree of the
base commit) and alternates blocks between the two, reporting per-block ratios: the before/after figure of a change
to the actor path, measured in the same run (DESIGN principle 10); given twice or more, every tree runs in the same
rounds and each gets its ratio. Figures, not a pass/fail test.

    python bench/actor_core.py [--streams 1,16,64] [--blocks 12] [--against /tmp/base_worktree [--against ...]]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

PROMPT = "Calculet NPU benchmark prompt"


class Core:
    """A brought-up engine core on the null device, never started: its turns run on the caller's thread."""

    def __init__(self) -> None:
        from calculet.adapters.sim import CostModel, SimConfig, TimeMode
        from calculet.config import default_config
        from calculet.runtime.engine.types import EngineOptions
        from calculet.server.bringup import bring_up

        cost = CostModel.null()
        self.brought = bring_up(default_config(), sim=SimConfig(time_mode=TimeMode.REAL, cost=cost),
                                options=EngineOptions(verify_golden=cost.numerics))
        self.core = self.brought.engine._core  # noqa: SLF001 - driven here, on this thread
        # the monitors as the started engine sets them (ThreadedEngine.start): the production default, sampled
        from calculet.machines.monitor import MONITOR
        monitoring = self.core.config.monitoring
        MONITOR.configure(enabled=monitoring.invariants, mode=self.core.options.monitor_mode or "count",
                          sample_every=monitoring.sample_every)
        self.core.chain_ready_s = self.core.options.wake_coalesce_s  # as ThreadedEngine sets it
        self.tokenizer = self.brought.engine.tokenizer
        self.prompt = tuple(self.tokenizer.encode(PROMPT))
        self.calls = 0
        turn = getattr(self.core, "turn", None)
        if turn is None:  # a tree before EngineCore.turn (the base of #20's session 11): its actor's turn function
            from calculet.runtime.engine.threaded import _turn  # type: ignore[attr-defined]

            core = self.core
            turn = lambda: _turn(core)  # noqa: E731
        self.turn = turn

    def _hook(self, _frame: object, event: str, _arg: object) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1

    def block(self, streams: int, tokens: int, count_calls: bool = False) -> tuple[float, int, int]:
        """``streams`` requests of ``tokens`` tokens run to the end: (thread CPU seconds, tokens, Python calls)."""
        from calculet.runtime.engine.types import GenerateRequest
        from calculet.runtime.execution.sampler import SamplingParams
        from calculet.runtime.streams.writer import StreamWriter

        core, turn = self.core, self.turn
        writers = [StreamWriter(tokenizer=self.tokenizer) for _ in range(streams)]
        for writer in writers:
            core.submit(GenerateRequest(self.prompt, tokens, sampling=SamplingParams(ignore_eos=True)), writer)
        self.calls = 0
        if count_calls:
            sys.setprofile(self._hook)
        started = time.thread_time()
        while not core.idle():
            turn()
        took = time.thread_time() - started
        sys.setprofile(None)
        return took, sum(len(w.result(0).raw_tokens) for w in writers), self.calls


def serve() -> int:
    """``--serve``: answer ``STREAMS TOKENS REPS [c]`` lines with ``us_per_token calls_per_token`` (for --against)."""
    core = Core()
    core.block(4, 64)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        streams, tokens, reps, *calls = line.split()
        cpu = n = counted = 0
        for _ in range(int(reps)):
            took, got, c = core.block(int(streams), int(tokens), bool(calls))
            cpu, n, counted = cpu + took, n + got, counted + c
        print(f"{cpu / n * 1e6:.3f} {counted / n:.2f}", flush=True)
    return 0


def _spawn(tree: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=tree)
    # this script, importing calculet from ``tree`` (a base worktree need not have the script)
    errors = tempfile.TemporaryFile("w+")  # the child's stderr, shown if it dies before it is ready
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], cwd=tree,
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True)
    assert proc.stdout is not None
    while (line := proc.stdout.readline()).strip() != "ready":
        if not line:  # EOF: the child exited (an import error in ``tree``, a crash) and will never say ready
            proc.wait()
            errors.seek(0)
            raise SystemExit(f"actor_core: the core from {tree} exited ({proc.returncode}) before it was ready:\n"
                             + errors.read()[-4000:])
    return proc


def _ask(proc: subprocess.Popen[str], streams: int, tokens: int, reps: int, calls: bool) -> tuple[float, float]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{streams} {tokens} {reps}{' c' if calls else ''}\n")
    proc.stdin.flush()
    us, per = proc.stdout.readline().split()
    return float(us), float(per)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=12, help="alternated blocks per level and tree")
    parser.add_argument("--against", action="append", default=[],
                        help="a worktree of a base commit, run beside this tree (repeatable)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bases = {("base" if k == 0 else f"base{k + 1}"): tree for k, tree in enumerate(args.against)}
    trees = {"this": _spawn(here)} | {name: _spawn(tree) for name, tree in bases.items()}
    for name, tree in bases.items():
        print(f"{name}: {tree}")
    print(f"engine core CPU per streamed token, one thread, null device; {args.tokens}-token streams, "
          f"{args.blocks} alternated blocks (median, min; ratio: median of per-block this/base)")
    for streams in (int(s) for s in args.streams.split(",")):
        reps = max(1, 16 // streams)
        calls = {name: _ask(proc, streams, args.tokens, 1, True)[1] for name, proc in trees.items()}
        cpu: dict[str, list[float]] = {name: [] for name in trees}
        for block in range(args.blocks):
            for name in (list(trees) if block % 2 == 0 else list(reversed(trees))):
                cpu[name].append(_ask(trees[name], streams, args.tokens, reps, False)[0])
        line = " | ".join(f"{name} {statistics.median(v):.1f} us/tok (min {min(v):.1f}), {calls[name]:.1f} calls/tok"
                          for name, v in cpu.items())
        for name in bases:
            ratios = [a / b for a, b in zip(cpu["this"], cpu[name])]
            line += f" | ratio to {name} {statistics.median(ratios):.3f}"
        print(f"{streams:>3} streams: {line}", flush=True)
    for proc in trees.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
