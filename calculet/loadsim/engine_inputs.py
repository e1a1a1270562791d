"""What a load simulation hands the real engine: the simulated package and deterministic prompts.

Why a package of its own build: the workloads' 40K-token prompts do not fit the 256-token
default context, and the KV budget must be the §13.1 reference model's, not the tiny model's.
So the package is the simulator's ``future`` variant (B1/B4/B8/B16, ping/pong, multi-profile
residency) built with a context of ``max_seq`` tokens and the reference model's memory figures.
With a ``prefill_chunk_tokens`` its B1 profile also declares that incremental-prefill chunk (a
simulated capability, like the rest of ``future``; CalRT 0.7.6 has none, §6).

Prompts are deterministic byte strings: numerics are off, so their content only has to make
requests differ (the simulator's pseudo-token chains start from the last prompt token).
Both the virtual-time runner, the live agreement run and the soak use these, so a request index
means the same prompt everywhere.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from pathlib import Path

from calculet.adapters.sim.model import TinyConfig
from calculet.errors import DefinitionError
from calculet.loadsim.workload import SimRequest
from calculet.runtime.engine.types import GenerateRequest

__all__ = ["DEFAULT_MAX_SEQ", "generate_request", "loadsim_package_dir", "prompt_for"]

DEFAULT_MAX_SEQ = 40960
"""Context of the simulated package: the presets' ``context_limit_tokens`` (a 40K prompt + output)."""

_PROMPT_PERIOD = 251
_PROMPT_POOL: tuple[int, ...] = ()
_POOL_LOCK = threading.Lock()


def prompt_for(index: int, tokens: int) -> tuple[int, ...]:
    """Deterministic byte-token prompt ``index`` of ``tokens`` tokens.

    A slice of one cached pseudo-random byte string, offset by the index, so prompts differ
    (their pseudo-token chains differ) without building 40K-element tuples token by token.
    """
    global _PROMPT_POOL
    if tokens < 1:
        raise DefinitionError(f"a prompt needs >= 1 token, got {tokens}")
    need = tokens + _PROMPT_PERIOD
    if len(_PROMPT_POOL) < need:
        with _POOL_LOCK:
            if len(_PROMPT_POOL) < need:
                size = max(need, 2 * len(_PROMPT_POOL), DEFAULT_MAX_SEQ + _PROMPT_PERIOD)
                _PROMPT_POOL = tuple((j * 197 + (j >> 3) * 31 + 11) % 256 for j in range(size))
    offset = index % _PROMPT_PERIOD
    return _PROMPT_POOL[offset: offset + tokens]


def generate_request(index: int, req: SimRequest) -> GenerateRequest:
    """The engine request for an offered one (deterministic prompt bytes)."""
    return GenerateRequest(prompt_for(index, req.prompt_tokens), req.max_new_tokens, tenant=req.tenant,
                           deadline_ms=req.deadline_ms)


_PACKAGES: dict[tuple[int, int | None], Path] = {}
_PACKAGE_LOCK = threading.Lock()
_PACKAGE_ROOT: Path | None = None


def loadsim_package_dir(max_seq: int = DEFAULT_MAX_SEQ, prefill_chunk_tokens: int | None = None) -> Path:
    """The ``future`` sim package with a ``max_seq`` context and reference memory (built once per
    process and argument pair).

    ``prefill_chunk_tokens`` declares the B1 profile's incremental-prefill chunk (§6, simulated);
    each chunk size gets its own directory, so an unchunked run never sees a chunked package.
    Built with the adapter's own :func:`~calculet.adapters.sim.build.build_package` into a
    temporary directory removed at exit — nothing binary is committed.
    """
    global _PACKAGE_ROOT
    if max_seq < 16:
        raise DefinitionError(f"max_seq must be >= 16, got {max_seq}")
    if prefill_chunk_tokens is not None and not 1 <= prefill_chunk_tokens <= max_seq:
        raise DefinitionError(f"prefill_chunk_tokens must be in [1, max_seq={max_seq}], got {prefill_chunk_tokens}")
    from calculet.adapters.sim.build import build_package  # deferred, as presets.package_dir does

    key = (max_seq, prefill_chunk_tokens)
    with _PACKAGE_LOCK:
        path = _PACKAGES.get(key)
        if path is None:
            if _PACKAGE_ROOT is None:
                _PACKAGE_ROOT = Path(tempfile.mkdtemp(prefix="calculet-loadsim-pkg-"))
                atexit.register(shutil.rmtree, _PACKAGE_ROOT, True)
            suffix = "" if prefill_chunk_tokens is None else f"-chunk{prefill_chunk_tokens}"
            path = _PACKAGE_ROOT / f"future-{max_seq}{suffix}"
            build_package(path, variant="future", memory="reference", config=TinyConfig(max_seq=max_seq),
                          name=f"loadsim-sim-future{suffix}", prefill_chunk_tokens=prefill_chunk_tokens)
            _PACKAGES[key] = path
        return path
