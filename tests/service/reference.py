"""What the engine generates for a prompt, computed in virtual time without the HTTP layer.

The service tests compare what a client receives over HTTP with this: the HTTP layer must not
add, drop, reorder or re-encode a token. Generation is greedy with ``ignore_eos`` on the same
bundled package (:func:`calculet.adapters.sim.bundled.build_bundled`: its build, BPE training
included, is byte-identical for the same arguments), tokenised with that package's own tokenizer.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from calculet.adapters.sim import SimCalRT, SimConfig
from calculet.adapters.sim.bundled import build_bundled
from calculet.config import parse_config
from calculet.clock import FakeClock
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.writer import StreamWriter
from calculet.runtime.streams.package_tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class Expected:
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    text: str


@functools.lru_cache(maxsize=1)
def bundled_package() -> Path:
    """The bundled package, built once for the test process."""
    root = Path(tempfile.mkdtemp(prefix="calculet-reference-"))
    atexit.register(shutil.rmtree, root, True)
    build_bundled(root / "bundled")
    return root / "bundled"


def tokenizer() -> Tokenizer:
    """The bundled package's own tokenizer and chat template."""
    manifest = (bundled_package() / "manifest.json").read_bytes()
    return load_tokenizer(bundled_package(), manifest, hashlib.sha256(manifest).hexdigest())


def generate(requests: Sequence[tuple[tuple[int, ...], int]]) -> list[Expected]:
    """Greedy, ``ignore_eos`` generations of (prompt ids, max tokens), in one virtual-time run."""
    clock = FakeClock()
    driver = EngineDriver(parse_config({"schema": "calculet-scheduler/v1"}), SimCalRT(SimConfig(clock=clock)),
                          bundled_package(), clock=clock, options=EngineOptions(monitor_mode=None))
    streams = []
    for prompt, n in requests:
        stream = StreamWriter(tokenizer=driver.tokenizer)
        submission = driver.submit(GenerateRequest(prompt, n, sampling=SamplingParams(ignore_eos=True)), stream)
        assert not submission.outcome.rejected, submission
        streams.append(stream)
    driver.run_until_idle()
    driver.stop()
    out = []
    for (prompt, _), stream in zip(requests, streams):
        result = stream.result(0)
        out.append(Expected(prompt, result.raw_tokens, result.text))
    return out


def for_text(prompts: Sequence[tuple[str, int]]) -> list[Expected]:
    tok = tokenizer()
    return generate([(tuple(tok.encode(text)), n) for text, n in prompts])
