"""The tokenizer and chat template a package carries, loaded and checked at model load (§11, #18).

Why: the model's vocabulary and its chat template are part of the signed package (their files are
listed in ``files``, so step 2 already verified their hashes); the runtime must use exactly those,
and must refuse a package whose tokenizer cannot drive its model. At load (§11 step 3, in
:meth:`calculet.runtime.models.prepare.Preparer.prepare`) :func:`load_tokenizer` reads them and
checks them against the manifest:

* ``tokenizer.json`` parses with Hugging Face ``tokenizers`` and its vocabulary (added tokens
  included) is exactly the model's logits width (``architecture.vocab_size``): an id the tokenizer
  cannot decode, or one the model cannot score, is refused;
* every special id of the manifest (bos, eos, pad, unk) is a special token of the tokenizer, and
  the config's ``bos_token`` / ``eos_token`` name the manifest's ids;
* the config's ``chat_template`` compiles (Jinja2, sandboxed as Hugging Face renders it) and
  renders a probe conversation.

A byte-level manifest needs no file (:class:`~calculet.runtime.streams.tokenizer.ByteTokenizer`).
The engine picks the loaded tokenizer up by the package's manifest sha256 (:func:`loaded_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HfBackend

from calculet.errors import BadRequest, PackageError
from calculet.packages.manifest import CalbinManifest
from calculet.runtime.streams.tokenizer import ByteTokenizer, TokenizerStatistics

_PROBE = (("system", "probe"), ("user", "probe"), ("assistant", "probe"), ("user", "probe"))


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


class ChatTemplate:
    """A Hugging Face ``chat_template``: Jinja2 over ``messages``, rendered in a sandbox."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
        env.globals["raise_exception"] = _raise
        self.source = source
        self._template = env.from_string(source)
        self._bos, self._eos = bos_token, eos_token

    def render(self, messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool = True) -> str:
        return self._template.render(messages=[{"role": r, "content": c} for r, c in messages],
                                     bos_token=self._bos, eos_token=self._eos,
                                     add_generation_prompt=add_generation_prompt)


class HfTokenizer:
    """A package's ``tokenizer.json`` and chat template, with the engine's tokenizer interface."""

    def __init__(self, backend: HfBackend, template: ChatTemplate, *, vocab_size: int, bos: int, eos: int,
                 specials: Iterable[int], identity: str = "", byte_table: tuple[bytes, ...] | None = None,
                 pieces: PieceCache | None = None) -> None:
        self._backend = backend
        self.pieces = pieces
        """Each pre-token's ids, when the tokenizer splits a text as GPT-2's byte-level BPE (:class:`PieceCache`);
        None: every text goes to the backend whole."""
        self.byte_table = byte_table
        """Each id's bytes when the tokenizer is byte-level BPE (:func:`byte_level_table`): streams decode by it."""
        self.piece_text = _piece_texts(byte_table) if byte_table is not None else None
        """With the byte table, each id's text when its bytes are whole characters on their own (None where they
        end in an incomplete or invalid one): what a stream shows for that id when nothing is held before it."""
        self.identity = identity or f"hf/{vocab_size}/{bos}/{eos}"
        """What a replacement package must keep: the sha256 of its tokenizer files."""
        self.template = template
        self.vocab_size = vocab_size
        self.bos = bos
        self.eos = eos
        self._specials = frozenset(specials)

    def is_special(self, token: int) -> bool:
        return token in self._specials

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        pieces = self.pieces
        ids: list[int] | None = None if pieces is None else pieces.encode(text)
        if ids is None:
            ids = self._backend.encode(text, add_special_tokens=False).ids
        return [self.bos, *ids] if add_bos else ids

    def chat_text(self, messages: Sequence[tuple[str, str]]) -> str:
        """The conversation rendered with the package's chat template (BOS as the template writes it)."""
        try:
            return self.template.render(messages)
        except jinja2.TemplateError as exc:
            raise BadRequest(f"the model's chat template refused the messages: {exc}", field="messages") from exc

    def encode_chat(self, text: str) -> list[int]:
        """A rendered conversation as ids; special tokens written in the text become their ids."""
        ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
        return ids

    def validate(self, tokens: Iterable[int]) -> tuple[int, ...]:
        return ByteTokenizer.check_ids(tokens, self.vocab_size)

    def decode(self, tokens: Iterable[int]) -> str:
        text: str = self._backend.decode([t for t in tokens if 0 <= t < self.vocab_size], skip_special_tokens=True)
        return text

    def detokenizer(self) -> HfDetokenizer:
        return HfDetokenizer(self)

    def statistics(self) -> TokenizerStatistics:
        pieces = self.pieces
        counts = (0, 0, 0) if pieces is None else (len(pieces), pieces.hits, pieces.misses)
        return TokenizerStatistics(self.vocab_size, self.bos, self.eos, tuple(sorted(self._specials)), *counts)


class HfDetokenizer:
    """Incremental decoding that holds back an incomplete UTF-8 character (U+FFFD at the end).

    Each push decodes the window of ids since the last text it returned, twice — without and with the new
    ids — and returns the difference (the window is what keeps a tokenizer whose pieces depend on their
    neighbours, such as SentencePiece's leading space, exact). A byte-level BPE tokenizer's pieces do not:
    its text is the UTF-8 of its tokens' bytes laid end to end (:func:`byte_level_table`), so the window is
    kept as bytes and decoded by Python's own codec, at a tenth of a call into the Rust backend with its
    list copy (issue #20: the actor decoded every streamed token twice through it). Same text, same holds.

    With the byte table only the bytes not yet shown are kept: UTF-8 resynchronises at a character boundary, so
    the window's text is the text already shown followed by the decoding of the bytes after it, and the
    difference the backend path computes is that decoding alone (a text that ends in U+FFFD is held, so what was
    shown always ends on a whole character). Nothing held, an id whose bytes are whole characters returns its
    precomputed text (:attr:`HfTokenizer.piece_text`) without decoding anything: the common token (issue #20).
    """

    def __init__(self, tokenizer: HfTokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        # what push checks every token against, read once (a stream's every token comes here, issue #20)
        self._specials = tokenizer._specials
        self._vocab_size = tokenizer.vocab_size
        self._backend_decode = tokenizer._backend.decode
        self._table = tokenizer.byte_table
        self._pieces = tokenizer.piece_text
        self._bytes = bytearray()
        """The bytes not yet shown (with the byte table): an incomplete character, or what was pushed with it."""

    def push(self, token: int) -> str:
        if token in self._specials or not 0 <= token < self._vocab_size:
            return ""
        table = self._table
        if table is not None:
            held = self._bytes
            if not held:
                text = self._pieces[token]  # type: ignore[index]  # set with the table
                if text is not None:
                    return text
            held += table[token]
            return self._emit_bytes(final=False)
        self._ids.append(token)
        return self._emit(final=False)

    def flush(self) -> str:
        return self._emit(final=True) if self._table is None else self._emit_bytes(final=True)

    def _emit(self, *, final: bool) -> str:
        # the ids held here are in the vocabulary (push drops the others), so they go to the backend as they are:
        # HfTokenizer.decode's filter would copy them for nothing, twice a token
        decode = self._backend_decode
        before: str = decode(self._ids[self._prefix:self._read], skip_special_tokens=True)
        text: str = decode(self._ids[self._prefix:], skip_special_tokens=True)
        if len(text) <= len(before) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before):]

    def _emit_bytes(self, *, final: bool) -> str:
        """:meth:`_emit` over the bytes not yet shown (a byte-level tokenizer): the same rule, see the class."""
        held = self._bytes
        text = held.decode("utf-8", "replace")
        if not text or (not final and text[-1] == "\ufffd"):
            return ""
        held.clear()
        return text


def _piece_texts(table: tuple[bytes, ...]) -> tuple[str | None, ...]:
    """Each id's text where its bytes decode to whole characters (not empty, not ending in U+FFFD), else None:
    the text :meth:`HfDetokenizer.push` returns for it when no bytes are held before it."""
    texts = (piece.decode("utf-8", "replace") for piece in table)
    return tuple(text if text and text[-1] != "\ufffd" else None for text in texts)


def _byte_level_chars() -> dict[str, int]:
    """The byte-level pre-tokenizer's alphabet (GPT-2's ``bytes_to_unicode``), inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def byte_level_table(backend: HfBackend, tokenizer_json: dict[str, Any], vocab_size: int,
                     specials: Iterable[int]) -> tuple[bytes, ...] | None:
    """Each id's bytes, when the tokenizer's decoder is byte-level and nothing else: decoding ids is then the
    UTF-8 (invalid bytes as U+FFFD) of their bytes laid end to end — the ``ByteLevel`` decoder maps each
    character of a token back to its byte (a token with a character outside the alphabet, an added token,
    stands for its own UTF-8), and special tokens are skipped. None for any other decoder. Checked against
    the backend for every id before it is used: a table that disagrees on any one is not used."""
    decoder = tokenizer_json.get("decoder")
    if not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel":
        return None
    chars = _byte_level_chars()
    skip = set(specials)
    table: list[bytes] = []
    for i in range(vocab_size):
        piece = backend.id_to_token(i)
        if i in skip or piece is None:
            table.append(b"")
            continue
        if all(c in chars for c in piece):
            table.append(bytes(chars[c] for c in piece))
        else:
            table.append(piece.encode("utf-8"))
        if table[i].decode("utf-8", "replace") != backend.decode([i], skip_special_tokens=True):
            return None
    return tuple(table)


_GPT2_ASCII = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\t\n\r A-Za-z0-9]+|[\t\n\r ]+(?![^\t\n\r ])"
                         r"|[\t\n\r ]+")
"""The ``ByteLevel`` pre-tokenizer's split (GPT-2's ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|
\\s+(?!\\S)|\\s+``) on texts without a :data:`_NOT_PLAIN` character, where ``\\p{L}`` is ``[A-Za-z]``, ``\\p{N}`` is
``[0-9]`` and ``\\s`` is ``[\\t\\n\\r ]``: the same leftmost-first alternatives, so the same pieces."""

_NOT_PLAIN = re.compile(r"[^\t\n\r -~]")
"""A character outside printable ASCII and the three whitespace controls a prompt has: :data:`_GPT2_ASCII` splits
the texts without one as the backend does (no Unicode class, nor a control character whose class the two regex
engines might read apart)."""

PIECES_KEPT = 16384
"""Pre-tokens whose ids :class:`PieceCache` keeps at most (emptied when full): a few MB for words, ~20 MB at worst
(every piece :data:`PIECE_CHARS` long, a token per character)."""
PIECE_CHARS = 32
"""The longest pre-token kept (a longer one, rare in text, is asked of the backend each time)."""


class PieceCache:
    """A text's ids as the concatenation of its pre-tokens' ids, each pre-token's ids kept (issue #13: tokenising a
    completion's prompt was ~15 us of the event loop's CPU per refused request, about an eighth of it, for a
    ~40-character prompt: the backend's own split of the text, its regex, is most of that, and is paid again for
    every word it has seen).

    Why exact: with no normalizer and the ``ByteLevel`` pre-tokenizer splitting by GPT-2's regex (``use_regex``,
    no prefix space), the backend applies BPE to each pre-token alone (the BPE model sees one split at a time), so
    a text's ids are its pre-tokens' ids laid end to end, and a pre-token's ids are what the backend gives it alone
    (split alone, it is one pre-token: each alternative of the regex that failed at its start in the text fails on
    it too, and the one that matched matches all of it). The split is done here by :data:`_GPT2_ASCII`, which is the
    backend's regex on texts without a :data:`_NOT_PLAIN` character; any other text, a text holding an added token's
    content (the backend cuts those out first), and a tokenizer configured otherwise (:meth:`of`) go to the backend
    whole. ``tests/unit/runtime/streams/test_package_tokenizer_pieces.py`` compares the two on random texts."""

    def __init__(self, backend: HfBackend, added: Iterable[str]) -> None:
        self._backend = backend
        contents = sorted({text for text in added if text}, key=len, reverse=True)
        self._added = re.compile("|".join(map(re.escape, contents))) if contents else None
        self._kept: dict[str, tuple[int, ...]] = {}
        self.hits = 0
        self.misses = 0

    @classmethod
    def of(cls, backend: HfBackend, tokenizer_json: dict[str, Any]) -> PieceCache | None:
        """The cache for a tokenizer whose ids are its pre-tokens' (see the class), or None."""
        pre = tokenizer_json.get("pre_tokenizer")
        model = tokenizer_json.get("model")
        if tokenizer_json.get("normalizer") is not None or not isinstance(pre, dict) or not isinstance(model, dict):
            return None
        if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space", True) or not pre.get("use_regex", True):
            return None
        if model.get("type") != "BPE" or model.get("dropout") not in (None, 0, 0.0):
            return None
        added = [str(token.get("content", "")) for token in tokenizer_json.get("added_tokens") or ()]
        return cls(backend, added)

    def encode(self, text: str) -> list[int] | None:
        """``text``'s ids as the backend gives them (no special tokens added), or None: ask the backend."""
        if _NOT_PLAIN.search(text) is not None or self._added is not None and self._added.search(text) is not None:
            return None
        kept = self._kept
        ids: list[int] = []
        for piece in _GPT2_ASCII.findall(text):
            found = kept.get(piece)
            if found is None:
                self.misses += 1
                found = tuple(self._backend.encode(piece, add_special_tokens=False).ids)
                if len(piece) <= PIECE_CHARS:
                    if len(kept) >= PIECES_KEPT:
                        kept.clear()  # one call, safe beside another thread's reads
                    kept[piece] = found
            else:
                self.hits += 1
            ids += found
        return ids

    def __len__(self) -> int:
        return len(self._kept)


def _refuse(manifest: CalbinManifest, detail: str) -> PackageError:
    return PackageError(f"package {manifest.name!r}: {detail} (§11 step 3)", reason="tokenizer",
                        package=manifest.name)


def _read(package_dir: Path, manifest: CalbinManifest, rel: str) -> str:
    try:
        return (package_dir / rel).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _refuse(manifest, f"cannot read {rel}: {exc}") from exc


def hf_tokenizer(package_dir: Path, manifest: CalbinManifest) -> HfTokenizer:
    """Load the package's ``tokenizer.json`` and chat template and check them against the manifest."""
    arch = manifest.architecture
    assert arch.tokenizer_file is not None and arch.tokenizer_config_file is not None
    tokenizer_text = _read(package_dir, manifest, arch.tokenizer_file)
    config_text = _read(package_dir, manifest, arch.tokenizer_config_file)
    identity = "hf/" + hashlib.sha256(tokenizer_text.encode() + b"\0" + config_text.encode()).hexdigest()
    try:
        backend = HfBackend.from_str(tokenizer_text)
    except Exception as exc:  # noqa: BLE001 - the Rust parser raises plain Exceptions
        raise _refuse(manifest, f"{arch.tokenizer_file} is not a Hugging Face tokenizer: {exc}") from exc
    try:
        config: dict[str, Any] = json.loads(config_text)
    except ValueError as exc:
        raise _refuse(manifest, f"{arch.tokenizer_config_file} is not JSON: {exc}") from exc
    size = backend.get_vocab_size(with_added_tokens=True)
    if size != arch.vocab_size:
        raise _refuse(manifest, f"the tokenizer's vocabulary has {size} tokens but the model's logits are "
                                f"{arch.vocab_size} wide; they must be the same vocabulary")
    added = {int(i): t for i, t in backend.get_added_tokens_decoder().items() if t.special}
    for name, tok in arch.special_tokens.model_dump().items():
        if tok not in added:
            raise _refuse(manifest, f"special token {name}={tok} of the manifest is not a special token of "
                                    f"{arch.tokenizer_file} (it is {backend.id_to_token(tok)!r})")
    for name in ("bos", "eos"):
        text = config.get(f"{name}_token")
        text = text.get("content") if isinstance(text, dict) else text
        if backend.token_to_id(str(text)) != getattr(arch.special_tokens, name):
            raise _refuse(manifest, f"{arch.tokenizer_config_file} {name}_token {text!r} is not the manifest's "
                                    f"{name} id {getattr(arch.special_tokens, name)}")
    source = config.get("chat_template")
    if not isinstance(source, str):
        raise _refuse(manifest, f"{arch.tokenizer_config_file} has no chat_template string")
    try:
        template = ChatTemplate(source, bos_token=str(config["bos_token"]), eos_token=str(config["eos_token"]))
        template.render(_PROBE)
    except jinja2.TemplateError as exc:
        raise _refuse(manifest, f"the chat template does not render: {exc}") from exc
    document = json.loads(tokenizer_text)
    try:
        table = byte_level_table(backend, document, size, added)
    except ValueError:
        table = None
    return HfTokenizer(backend, template, vocab_size=size, bos=arch.special_tokens.bos,
                       eos=arch.special_tokens.eos, specials=added, identity=identity, byte_table=table,
                       pieces=PieceCache.of(backend, document))


Tokenizer = ByteTokenizer | HfTokenizer

_LOADED: OrderedDict[str, Tokenizer] = OrderedDict()
_LOCK = threading.Lock()
_KEEP = 16


def load_tokenizer(package_dir: Path, manifest_bytes: bytes, sha256: str) -> Tokenizer:
    """The package's tokenizer, checked against its manifest; remembered under the manifest sha256."""
    manifest = CalbinManifest.parse(manifest_bytes)
    arch = manifest.architecture
    if arch.tokenizer == "byte-level":
        tok: Tokenizer = ByteTokenizer(arch.vocab_size, bos=arch.special_tokens.bos, eos=arch.special_tokens.eos)
    else:
        tok = hf_tokenizer(package_dir, manifest)
    with _LOCK:
        _LOADED[sha256] = tok
        _LOADED.move_to_end(sha256)
        while len(_LOADED) > _KEEP:
            _LOADED.popitem(last=False)
    return tok


def loaded_tokenizer(sha256: str, vocab_size: int, *, bos: int, eos: int) -> Tokenizer:
    """The tokenizer :func:`load_tokenizer` loaded for this package (a byte-level one when none was)."""
    with _LOCK:
        tok = _LOADED.get(sha256)
    return tok if tok is not None else ByteTokenizer(vocab_size, bos=bos, eos=eos)


__all__ = ["ChatTemplate", "HfDetokenizer", "HfTokenizer", "PIECES_KEPT", "PieceCache", "Tokenizer",
           "byte_level_table", "hf_tokenizer", "load_tokenizer", "loaded_tokenizer"]
