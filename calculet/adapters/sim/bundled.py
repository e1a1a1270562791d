"""The bundled tiny model: what ``python -m calculet.run`` serves when no model is configured, and what
``python -m calculet.package tiny OUT`` builds (#18).

Why it says what it is: the weights are random (seeded), so its completions are random tokens — an
honest alias (:data:`BUNDLED_ALIAS`) and package name say so, instead of a real model's name. What
is real is the path a real model takes: a byte-level BPE tokenizer trained at build time from text
calculet ships and a Jinja2 chat template, both carried in the package (``tokenizer.json``,
``tokenizer_config.json``), listed in ``files`` and so covered by the signature, loaded and checked
against the manifest at model load (§11). The package is the simulator's ``current`` variant: B1
only, the capability contract as the spec states it for CalRT 0.7.6.
"""

from __future__ import annotations

from pathlib import Path

from calculet.adapters.sim.build import build_package
from calculet.packages.manifest import CalbinManifest
from calculet.packages.tokenizer_files import bundled_tokenizer_files

BUNDLED_ALIAS = "tiny-random"
"""The alias the bundled model is served under when the configuration names none of its own."""
BUNDLED_NAME = "tiny-random-bpe"
"""The package's name: a tiny transformer with random weights and a trained BPE vocabulary."""


def build_bundled(outdir: str | Path) -> CalbinManifest:
    """Write the bundled model's package (unsigned) into ``outdir``: weights, tokenizer, manifest."""
    return build_package(outdir, variant="current", name=BUNDLED_NAME, tokenizer=bundled_tokenizer_files())
