"""The simulated NPU's numerics: a tiny deterministic decoder-only transformer in numpy.

Why real numerics instead of mocks: batching, lane masks, KV transactions and faults are then
tested on real numbers (DESIGN "The simulated NPU"). A lane decoded inside a B16 batch must give
the same logits as the same sequence decoded alone (§18 "filling lanes 1..B", R18.5), chunked
prefill must equal one-shot prefill (§6, R6.7/R6.9), and an inactive lane must write no KV
(§7.3, R18.6) — all checkable only if something is actually computed.

The model: byte-level vocabulary (256 bytes + BOS/EOS/PAD/UNK), sinusoidal absolute positions,
pre-norm (RMSNorm) multi-head attention and a GELU MLP, float64 compute. Weights are drawn from a
fixed seed and stored as float32, so a package is rebuilt bit for bit by code
(:mod:`calculet.adapters.sim.build`). Positions are the committed KV length of the sequence
(§9.2, R9.2.4): a token at position p attends to the p committed tokens before it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from calculet.errors import DefinitionError


@dataclass(frozen=True)
class TinyConfig:
    """Architecture of the tiny model (the manifest's ``architecture`` section)."""

    vocab_size: int = 260
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    max_seq: int = 256
    norm_eps: float = 1e-5
    seed: int = 20260802
    bos: int = 256
    eos: int = 257
    pad: int = 258
    unk: int = 259

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def tensor_shapes(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Every weight tensor in storage order."""
        d, f, v = self.d_model, self.d_ff, self.vocab_size
        out: list[tuple[str, tuple[int, ...]]] = [("embed", (v, d))]
        for i in range(self.n_layers):
            out += [(f"layer{i}.attn_norm", (d,)), (f"layer{i}.wq", (d, d)), (f"layer{i}.wk", (d, d)),
                    (f"layer{i}.wv", (d, d)), (f"layer{i}.wo", (d, d)), (f"layer{i}.ffn_norm", (d,)),
                    (f"layer{i}.w1", (d, f)), (f"layer{i}.w2", (f, d))]
        out += [("final_norm", (d,)), ("unembed", (d, v))]
        return tuple(out)


def init_weights(cfg: TinyConfig) -> dict[str, np.ndarray]:
    """Deterministic float32 weights from ``cfg.seed`` (scaled so logits are well spread)."""
    rng = np.random.default_rng(cfg.seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in cfg.tensor_shapes():
        if name.endswith("norm"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "embed":
            w = 0.8 * rng.standard_normal(shape)
        elif name == "unembed":
            w = 2.0 * rng.standard_normal(shape) / math.sqrt(shape[0])
        else:
            w = rng.standard_normal(shape) / math.sqrt(shape[0])
        weights[name] = w.astype(np.float32)
    return weights


def pack_weights(cfg: TinyConfig, weights: Mapping[str, np.ndarray]) -> tuple[bytes, tuple[tuple[str, tuple[int, ...], int], ...]]:
    """Concatenate weights as little-endian float32 (reproducible bytes, unlike npz zips)."""
    chunks: list[bytes] = []
    index: list[tuple[str, tuple[int, ...], int]] = []
    offset = 0
    for name, shape in cfg.tensor_shapes():
        arr = np.ascontiguousarray(weights[name], dtype="<f4")
        if arr.shape != shape:
            raise DefinitionError(f"weight {name} has shape {arr.shape}, expected {shape}")
        data = arr.tobytes()
        chunks.append(data)
        index.append((name, shape, offset))
        offset += len(data)
    return b"".join(chunks), tuple(index)


def unpack_weights(blob: bytes, index: Sequence[tuple[str, tuple[int, ...], int]]) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_weights`; raises DefinitionError on a truncated blob."""
    out: dict[str, np.ndarray] = {}
    for name, shape, offset in index:
        count = int(np.prod(shape, dtype=np.int64))
        end = offset + 4 * count
        if end > len(blob):
            raise DefinitionError(f"weights blob too short for {name}: needs {end} bytes, has {len(blob)}")
        out[name] = np.frombuffer(blob, dtype="<f4", count=count, offset=offset).reshape(shape)
    return out


def pseudo_next_token(token: int, position: int) -> int:
    """Numerics-off mode: a deterministic token from (previous token, position) only.

    It depends on nothing else, so batching, lane order and engine choice cannot change it, and
    load simulations stay reproducible without computing the model.
    """
    return (int(token) * 131 + int(position) * 71 + 17) % 256


def pseudo_continuation(prompt: Sequence[int], count: int) -> list[int]:
    """The ``count`` tokens numerics-off mode generates after ``prompt``: what a test expects."""
    out: list[int] = []
    prev, pos = int(prompt[-1]), len(prompt) - 1
    for _ in range(count):
        prev = pseudo_next_token(prev, pos)
        out.append(prev)
        pos += 1
    return out


@dataclass(frozen=True)
class ModelStatistics:
    prefill_calls: int
    prefill_tokens: int
    decode_calls: int
    decode_lanes: int


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class TinyTransformer:
    """Prefill and batched decode over caller-owned KV (the device's KvManager owns the cache).

    The model never stores KV itself: it returns the new K/V rows so that the device can make
    them visible only when the job completes OK (§9.2 transactions).
    """

    def __init__(self, cfg: TinyConfig, weights: Mapping[str, np.ndarray]) -> None:
        self.cfg = cfg
        self._w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
        missing = [n for n, _ in cfg.tensor_shapes() if n not in self._w]
        if missing:
            raise DefinitionError(f"weights missing tensors {missing}")
        self._pos = self._sinusoid(cfg.max_seq, cfg.d_model)
        self._lock = threading.Lock()
        self._prefill_calls = self._prefill_tokens = self._decode_calls = self._decode_lanes = 0

    @staticmethod
    def _sinusoid(n: int, d: int) -> np.ndarray:
        pos = np.arange(n, dtype=np.float64)[:, None]
        i = np.arange(d // 2, dtype=np.float64)[None, :]
        angle = pos / np.power(10000.0, 2.0 * i / d)
        table = np.zeros((n, d), dtype=np.float64)
        table[:, 0::2] = np.sin(angle)
        table[:, 1::2] = np.cos(angle)
        return table

    def _norm(self, x: np.ndarray, gain: str) -> np.ndarray:
        out: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg.norm_eps) * self._w[gain]
        return out

    def _embed(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        out: np.ndarray = self._w["embed"][tokens] + self._pos[positions]
        return out

    def _logits(self, x: np.ndarray) -> np.ndarray:
        out: np.ndarray = self._norm(x, "final_norm") @ self._w["unembed"]
        return out

    def prefill(self, tokens: np.ndarray, start: int, past_k: np.ndarray, past_v: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Process ``tokens`` at positions ``start..start+T-1`` after ``start`` committed tokens.

        ``past_k``/``past_v`` are ``[L, start, H, Dh]``. Returns the new K and V rows
        ``[L, T, H, Dh]`` and the logits of the last token ``[V]``. Chunked calls give the
        same rows and logits as one call over the whole prompt (§6 precondition 2).
        """
        cfg = self.cfg
        t = len(tokens)
        h, dh = cfg.n_heads, cfg.head_dim
        x = self._embed(np.asarray(tokens), np.arange(start, start + t))
        new_k = np.empty((cfg.n_layers, t, h, dh))
        new_v = np.empty((cfg.n_layers, t, h, dh))
        causal = np.arange(start + t)[None, :] > (start + np.arange(t))[:, None]  # [T, S]
        for layer in range(cfg.n_layers):
            p = f"layer{layer}."
            a = self._norm(x, p + "attn_norm")
            q = (a @ self._w[p + "wq"]).reshape(t, h, dh)
            k = (a @ self._w[p + "wk"]).reshape(t, h, dh)
            v = (a @ self._w[p + "wv"]).reshape(t, h, dh)
            new_k[layer], new_v[layer] = k, v
            keys = np.concatenate([past_k[layer], k], axis=0)
            vals = np.concatenate([past_v[layer], v], axis=0)
            scores = np.einsum("thd,shd->hts", q, keys) / math.sqrt(dh)
            scores = np.where(causal[None, :, :], -np.inf, scores)
            scores -= scores.max(axis=-1, keepdims=True)
            w = np.exp(scores)
            w /= w.sum(axis=-1, keepdims=True)
            att = np.einsum("hts,shd->thd", w, vals).reshape(t, cfg.d_model)
            x = x + att @ self._w[p + "wo"]
            m = self._norm(x, p + "ffn_norm")
            x = x + _gelu(m @ self._w[p + "w1"]) @ self._w[p + "w2"]
        logits = self._logits(x[-1:])[0]
        with self._lock:
            self._prefill_calls += 1
            self._prefill_tokens += t
        return new_k, new_v, logits

    def decode(self, tokens: np.ndarray, positions: np.ndarray,
               pasts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One decode step for ``n`` valid lanes; lane i attends only to its own KV.

        ``pasts[i]`` is ``(k, v)`` of shape ``[L, positions[i], H, Dh]``. Returns new K/V rows
        ``[n, L, H, Dh]`` and logits ``[n, V]``. The projections run batched over lanes (that is
        what makes a bigger profile cheaper per token); attention is per lane, so a lane's result
        does not depend on its neighbours.
        """
        cfg = self.cfg
        n = len(tokens)
        h, dh = cfg.n_heads, cfg.head_dim
        x = self._embed(np.asarray(tokens), np.asarray(positions))
        new_k = np.empty((n, cfg.n_layers, h, dh))
        new_v = np.empty((n, cfg.n_layers, h, dh))
        for layer in range(cfg.n_layers):
            p = f"layer{layer}."
            a = self._norm(x, p + "attn_norm")
            q = (a @ self._w[p + "wq"]).reshape(n, h, dh)
            k = (a @ self._w[p + "wk"]).reshape(n, h, dh)
            v = (a @ self._w[p + "wv"]).reshape(n, h, dh)
            new_k[:, layer], new_v[:, layer] = k, v
            att = np.empty((n, cfg.d_model))
            for i, (pk, pv) in enumerate(pasts):
                keys = np.concatenate([pk[layer], k[i][None]], axis=0)
                vals = np.concatenate([pv[layer], v[i][None]], axis=0)
                scores = np.einsum("hd,shd->hs", q[i], keys) / math.sqrt(dh)
                scores -= scores.max(axis=-1, keepdims=True)
                w = np.exp(scores)
                w /= w.sum(axis=-1, keepdims=True)
                att[i] = np.einsum("hs,shd->hd", w, vals).reshape(cfg.d_model)
            x = x + att @ self._w[p + "wo"]
            m = self._norm(x, p + "ffn_norm")
            x = x + _gelu(m @ self._w[p + "w1"]) @ self._w[p + "w2"]
        logits = self._logits(x)
        with self._lock:
            self._decode_calls += 1
            self._decode_lanes += n
        return new_k, new_v, logits

    def statistics(self) -> ModelStatistics:
        with self._lock:
            return ModelStatistics(self._prefill_calls, self._prefill_tokens, self._decode_calls, self._decode_lanes)


def greedy_generate(model: TinyTransformer, prompt: Sequence[int], n_tokens: int) -> tuple[list[int], np.ndarray]:
    """Reference host-side generation (B1 semantics) used to compute golden vectors at build time.

    Returns the greedy tokens and the prefill's last-token logits.
    """
    cfg = model.cfg
    empty = np.empty((cfg.n_layers, 0, cfg.n_heads, cfg.head_dim))
    k, v, logits = model.prefill(np.asarray(prompt), 0, empty, empty)
    first_logits = logits
    out: list[int] = []
    token = int(np.argmax(logits))
    for _ in range(n_tokens):
        out.append(token)
        pos = k.shape[1]
        nk, nv, lg = model.decode(np.array([token]), np.array([pos]), [(k, v)])
        k = np.concatenate([k, nk[0][:, None]], axis=1)
        v = np.concatenate([v, nv[0][:, None]], axis=1)
        token = int(np.argmax(lg[0]))
    return out, first_logits
