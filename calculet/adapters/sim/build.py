"""Build a simulated calbin package reproducibly (tests, benchmarks; the documented path for people
is ``python -m calculet.package tiny OUT``, :mod:`calculet.adapters.sim.bundled`).

``python -m calculet.adapters.sim.build OUTDIR`` writes a complete, unsigned package directory;
``python -m calculet.package sign OUTDIR --key K`` signs it in place (or ``package build OUTDIR
NEW`` re-lays it out, reading the fields of its ``manifest.json``).

Two variants, because the software must be tested against both the product that exists and the
one the spec designs for:

* ``current`` — the current product (§1, §15): only the B1 profile, and the capability contract
  exactly as the spec states it for CalRT 0.7.6 (nothing unproven enabled).
* ``future`` — B1/B4/B8/B16 with a valid-mask tensor, ping/pong with two jobs in flight,
  incremental prefill and multi-profile residency switched on *as simulated capabilities*
  (source ``simulated``, tiers as the spec rates them: C3, C1/C2), lane-level failure isolation
  off. It exists so the software paths can be tested; it proves nothing about hardware (§20).

The weights are generated from a fixed seed and written as raw little-endian float32 (no zip
timestamps), golden vectors are computed with the same numpy model, and ``manifest.json`` is
written canonically — so two builds with the same arguments are byte-identical and the package
can be signed by ``calculet.packages.build.sign_package``.

``--prefill-chunk-tokens N`` (``future`` only) declares an N-token incremental-prefill chunk on
the B1 profile, so the scheduler runs §6 chunked prefill end to end. Like every ``future``
capability it is simulated: CalRT 0.7.6 offers no incremental prefill (§6). Without it the
manifest has no such key, so the default builds keep their exact bytes.

``--memory reference`` swaps the memory figures for the spec's reference model (16.938 GiB
parameters, 3.750 GiB BF16 KV, 28.150 GiB reserved, §13.1) while keeping the tiny numerics, so a
capacity test can load "two large models" on the reference board preset.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from calculet.adapters.calrt import (
    Capability,
    ContextOps,
    DeviceCapabilities,
    EvidenceSource,
    MaskContract,
    PrimitiveType,
    ResetDomain,
)
from calculet.packages.manifest import MANIFEST_FILE, CalbinManifest, CapabilitiesModel
from calculet.packages.tokenizer_files import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TokenizerFiles
from calculet.adapters.sim.memory import (
    MIB,
    REFERENCE_KV_BYTES,
    REFERENCE_PARAMETER_BYTES,
    REFERENCE_RESERVED_BYTES,
)
from calculet.adapters.sim.model import TinyConfig, TinyTransformer, greedy_generate, init_weights, pack_weights

Variant = Literal["current", "future"]
MemoryKind = Literal["tiny", "reference"]

WEIGHTS_FILE = "weights.bin"
EXACT_SUBMODEL = "calculet-sim/tiny-byte-lm-2x64/dual-chiplet"
FILL_TOKEN = -1
"""Inactive lanes carry -1: out of vocabulary, so any accidental use is caught (§7.3)."""
GOLDEN_PROMPTS: tuple[tuple[str, bytes], ...] = (("calculet", b"Calculet NPU"), ("hello", b"hello, world"))
GOLDEN_TOKENS = 8
TINY_MAX_SEQUENCES = 64


def capabilities_for(variant: Variant) -> DeviceCapabilities:
    """The capability contract of a variant (see the module docstring)."""
    current = DeviceCapabilities.calrt_076_current()
    if variant == "current":
        return current
    sim = EvidenceSource.SIMULATED
    return DeviceCapabilities(
        incremental_prefill=Capability.rated("incremental_prefill", True, sim),
        lane_failure_isolation=current.lane_failure_isolation,
        max_inflight_jobs=Capability.rated("max_inflight_jobs", 2, sim),
        ping_pong=Capability.rated("ping_pong", True, sim),
        ping_pong_overlap=Capability.rated("ping_pong_overlap", True, sim),
        multi_profile_residency=Capability.rated("multi_profile_residency", True, sim),
        model_coresidency=current.model_coresidency,
        configure_device_global=current.configure_device_global,
        reset_domain=Capability.rated("reset_domain", ResetDomain.DEVICE),
        reset_configuration_verified=Capability.rated("reset_configuration_verified", True, sim),
        chiplet_scoped_models=current.chiplet_scoped_models,
        physical_devices_per_process=current.physical_devices_per_process,
        context_ops=ContextOps.calrt_076(),
    )


def _profile(cfg: TinyConfig, batch: int, mask: MaskContract, prefill_chunk_tokens: int | None = None
             ) -> dict[str, Any]:
    """One profile's manifest entry; a chunk size is written on B1 only (prefill is B1-shaped, §6)."""
    tensors: list[dict[str, Any]] = [
        {"name": "token_ids", "shape": [batch], "dtype": "int32", "role": "input"},
        {"name": "positions", "shape": [batch], "dtype": "int32", "role": "input"},
        {"name": "seq_ids", "shape": [batch], "dtype": "int32", "role": "input"},
    ]
    if mask is MaskContract.TENSOR:
        tensors.append({"name": "lane_valid", "shape": [batch], "dtype": "uint8", "role": "input"})
    tensors.append({"name": "logits", "shape": [batch, cfg.vocab_size], "dtype": "fp64", "role": "output"})
    if batch == 1:
        tensors += [{"name": "prefill_tokens", "shape": [cfg.max_seq], "dtype": "int32", "role": "input"},
                    {"name": "prefill_logits", "shape": [1, cfg.vocab_size], "dtype": "fp64", "role": "output"}]
    out: dict[str, Any] = {
        "exact_submodel": EXACT_SUBMODEL,
        "compiled_batch": batch,
        "max_seq": cfg.max_seq,
        "token_dtype": PrimitiveType.INT32.value,
        "logit_dtype": PrimitiveType.FP64.value,
        "inactive_policy": {
            "mask": mask.value,
            "kv_manager_mode": "per_sequence",
            "inactive_writes_kv": False,
            "inactive_logits_returned": False,
            "fill_token": FILL_TOKEN,
        },
        "kv_layout": {"n_layers": cfg.n_layers, "n_kv_heads": cfg.n_heads, "head_dim": cfg.head_dim,
                      "dtype": "fp64", "block_tokens": 16, "order": "layer,token,head,dim"},
        "tensors": tensors,
    }
    if batch == 1 and prefill_chunk_tokens is not None:
        out["prefill_chunk_tokens"] = prefill_chunk_tokens
    return out


def _golden(cfg: TinyConfig, model: TinyTransformer, tokenizer: TokenizerFiles | None = None
            ) -> list[dict[str, Any]]:
    out = []
    for name, text in GOLDEN_PROMPTS:
        prompt = [cfg.bos, *(tokenizer.encode(text.decode()) if tokenizer is not None else text)]
        tokens, logits = greedy_generate(model, prompt, GOLDEN_TOKENS)
        out.append({"name": name, "prompt": prompt, "expected_tokens": tokens,
                    "logits_sum": round(float(np.sum(logits)), 9),
                    "logits_l2": round(float(np.sqrt(np.sum(logits * logits))), 9), "atol": 1e-6})
    return out


def build_manifest_dict(cfg: TinyConfig, weights_blob: bytes, index: Sequence[tuple[str, tuple[int, ...], int]],
                        *, name: str, variant: Variant, profiles: Sequence[int], memory: MemoryKind,
                        batched_mask: MaskContract, golden: list[dict[str, Any]],
                        prefill_chunk_tokens: int | None = None,
                        tokenizer: TokenizerFiles | None = None) -> dict[str, Any]:
    """The manifest content for a build (exposed so tests can derive malformed variants).

    ``tokenizer``: the package carries these Hugging Face tokenizer files (listed in ``files``,
    so signed with the weights); without it the vocabulary is byte-level."""
    kv_bytes_per_token = 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * 8
    if memory == "reference":
        mem = {"parameter_bytes": REFERENCE_PARAMETER_BYTES, "kv_bytes": REFERENCE_KV_BYTES,
               "reserved_bytes": REFERENCE_RESERVED_BYTES, "kv_dtype": "bf16", "chiplets": [0, 1],
               "max_sequences": TINY_MAX_SEQUENCES}
    else:
        kv_bytes = TINY_MAX_SEQUENCES * cfg.max_seq * kv_bytes_per_token
        mem = {"parameter_bytes": len(weights_blob), "kv_bytes": kv_bytes,
               "reserved_bytes": len(weights_blob) + kv_bytes + 4 * MIB, "kv_dtype": "fp64",
               "chiplets": [0, 1], "max_sequences": TINY_MAX_SEQUENCES}
    caps = CapabilitiesModel.from_contract(capabilities_for(variant)).model_dump(mode="json", exclude_none=True)
    files = {WEIGHTS_FILE: {"sha256": hashlib.sha256(weights_blob).hexdigest(), "size": len(weights_blob)}}
    tokenizer_fields: dict[str, Any] = {"tokenizer": "byte-level"}
    if tokenizer is not None:
        tokenizer_fields = {"tokenizer": "hf-tokenizers", "tokenizer_file": TOKENIZER_FILE,
                            "tokenizer_config_file": TOKENIZER_CONFIG_FILE}
        for rel, text in ((TOKENIZER_FILE, tokenizer.tokenizer_json), (TOKENIZER_CONFIG_FILE, tokenizer.config_json)):
            blob = text.encode("utf-8")
            files[rel] = {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
    return {
        "format": "calbin-package/v1",
        "name": name,
        "exact_submodel": EXACT_SUBMODEL,
        "calrt_version": "0.7.6",
        "architecture": {
            "family": "tiny-numpy-transformer", "vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
            "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "d_ff": cfg.d_ff, "max_seq": cfg.max_seq,
            "norm_eps": cfg.norm_eps, **tokenizer_fields,
            "special_tokens": {"bos": cfg.bos, "eos": cfg.eos, "pad": cfg.pad, "unk": cfg.unk},
            "position_semantics": "committed-kv-length", "seed": cfg.seed, "weights_file": WEIGHTS_FILE,
            "weights_dtype": "float32",
            "tensors": [{"name": n, "shape": list(s), "offset": o} for n, s, o in index],
        },
        "profiles": [_profile(cfg, b, MaskContract.NONE if b == 1 else batched_mask, prefill_chunk_tokens)
                     for b in sorted(profiles)],
        "capabilities": caps,
        "golden": golden,
        "memory": mem,
        "files": files,
    }


def build_package(outdir: str | Path, *, variant: Variant = "current", profiles: Sequence[int] | None = None,
                  memory: MemoryKind = "tiny", name: str | None = None, config: TinyConfig | None = None,
                  batched_mask: MaskContract = MaskContract.TENSOR,
                  prefill_chunk_tokens: int | None = None,
                  tokenizer: TokenizerFiles | None = None) -> CalbinManifest:
    """Write ``weights.bin`` and ``manifest.json`` into ``outdir``; return the validated manifest.

    ``profiles`` defaults to [1] for ``current`` and [1, 4, 8, 16] for ``future``.
    ``prefill_chunk_tokens`` declares the B1 profile's incremental-prefill chunk (§6); the
    manifest refuses it on ``current``, which does not declare incremental prefill. ``None``
    (the default) writes nothing, so existing builds are byte-identical. ``tokenizer`` writes its
    ``tokenizer.json``/``tokenizer_config.json`` into the package and sizes the model's vocabulary
    and special ids from it (unless ``config`` is given).
    """
    cfg = config or (TinyConfig() if tokenizer is None else TinyConfig(
        vocab_size=tokenizer.vocab_size, bos=tokenizer.special_ids["bos"], eos=tokenizer.special_ids["eos"],
        pad=tokenizer.special_ids["pad"], unk=tokenizer.special_ids["unk"]))
    chosen = tuple(profiles) if profiles is not None else ((1,) if variant == "current" else (1, 4, 8, 16))
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    weights = init_weights(cfg)
    blob, index = pack_weights(cfg, weights)
    model = TinyTransformer(cfg, weights)
    data = build_manifest_dict(cfg, blob, index, name=name or f"tiny-sim-{variant}", variant=variant,
                               profiles=chosen, memory=memory, batched_mask=batched_mask,
                               golden=_golden(cfg, model, tokenizer), prefill_chunk_tokens=prefill_chunk_tokens,
                               tokenizer=tokenizer)
    manifest = CalbinManifest.parse(data)
    (out / WEIGHTS_FILE).write_bytes(blob)
    if tokenizer is not None:
        tokenizer.write(out)
    (out / MANIFEST_FILE).write_bytes(manifest.to_json_bytes())
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calculet.adapters.sim.build",
                                     description="Build a simulated calbin package (tiny numpy transformer).")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--variant", choices=("current", "future"), default="current")
    parser.add_argument("--profiles", default=None, help="comma-separated compiled batches, e.g. 1 or 1,4,8,16")
    parser.add_argument("--memory", choices=("tiny", "reference"), default="tiny")
    parser.add_argument("--name", default=None)
    parser.add_argument("--seed", type=int, default=TinyConfig().seed)
    parser.add_argument("--max-seq", type=int, default=TinyConfig().max_seq, help="context of the tiny model")
    parser.add_argument("--prefill-chunk-tokens", type=int, default=None,
                        help="B1 incremental-prefill chunk size (future variant only; simulated, §6)")
    args = parser.parse_args(argv)
    profiles = None if args.profiles is None else [int(p) for p in args.profiles.split(",") if p.strip()]
    manifest = build_package(args.outdir, variant=args.variant, profiles=profiles, memory=args.memory,
                             name=args.name, config=TinyConfig(seed=args.seed, max_seq=args.max_seq),
                             prefill_chunk_tokens=args.prefill_chunk_tokens)
    print(f"built {manifest.name} ({args.variant}, profiles {list(manifest.profile_batches())}, memory "
          f"{args.memory}) in {args.outdir} (unsigned: python -m calculet.package sign {args.outdir} --key KEY, or "
          f"package build {args.outdir} NEW --key KEY)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
