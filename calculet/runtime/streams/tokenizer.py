"""The byte-level tokenizer of the simulated model, and an incremental detokenizer for streams.

The simulated calbin's vocabulary (``adapters/sim/model.py``, manifest ``architecture``) is
the 256 byte values followed by four special tokens: BOS 256, EOS 257, PAD 258, UNK 259. Text
is encoded as its UTF-8 bytes (one token per byte), optionally after BOS; decoding drops the
special tokens. A stream decodes incrementally (:class:`Detokenizer`): a multi-byte UTF-8
character split over several tokens is held back until it is complete, so a client never
sees half a character (§3 StreamWriter).

The ids are read from the calbin's manifest (:meth:`ByteTokenizer.for_calbin`), never
assumed, so a package with another special-token layout is served correctly or refused. A package
that carries its own ``tokenizer.json`` and chat template is served by
:class:`~calculet.runtime.streams.package_tokenizer.HfTokenizer` instead (#18); both offer the same
interface, chat rendering included (:meth:`ByteTokenizer.chat_text` is the fixed template of a
byte-level package, which has none of its own).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Iterable, Protocol

from calculet.errors import BadRequest, DefinitionError

BYTE_TOKENS = 256


class _CalbinTokens(Protocol):
    @property
    def vocab_size(self) -> int: ...
    @property
    def bos_token(self) -> int: ...
    @property
    def eos_token(self) -> int: ...


@dataclass(frozen=True)
class TokenizerStatistics:
    """The tokenizer's identity, and its pre-token cache's counts where it keeps one (a byte-level BPE package's
    :class:`~calculet.runtime.streams.package_tokenizer.PieceCache`; zero otherwise): whether the cache pays on this
    traffic (hits against misses) and how full it is."""

    vocab_size: int
    bos: int
    eos: int
    specials: tuple[int, ...]
    pieces_kept: int = 0
    piece_hits: int = 0
    piece_misses: int = 0


class ByteTokenizer:
    """Bytes 0..255 are themselves; every id from 256 up to ``vocab_size`` is a special token."""

    def __init__(self, vocab_size: int = 260, *, bos: int = 256, eos: int = 257) -> None:
        if vocab_size < BYTE_TOKENS + 2:
            raise DefinitionError(f"a byte-level vocabulary needs >= {BYTE_TOKENS + 2} ids, got {vocab_size}")
        for name, tok in (("bos", bos), ("eos", eos)):
            if not BYTE_TOKENS <= tok < vocab_size:
                raise DefinitionError(f"{name} token {tok} is not a special id in [{BYTE_TOKENS}, {vocab_size})")
        self.vocab_size = vocab_size
        self.bos = bos
        self.eos = eos
        self.identity = f"byte-level/{vocab_size}/{bos}/{eos}"
        """What a replacement package must keep (the same vocabulary and special ids)."""

    @classmethod
    def for_calbin(cls, calbin: _CalbinTokens) -> ByteTokenizer:
        """The tokenizer matching a created calbin's manifest."""
        return cls(calbin.vocab_size, bos=calbin.bos_token, eos=calbin.eos_token)

    def is_special(self, token: int) -> bool:
        return token >= BYTE_TOKENS

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        """UTF-8 bytes of ``text``, after BOS unless ``add_bos`` is false."""
        ids = list(text.encode("utf-8"))
        return [self.bos, *ids] if add_bos else ids

    def chat_text(self, messages: Sequence[tuple[str, str]]) -> str:
        """The fixed template of a byte-level package: ``<|role|>\\ncontent\\n`` per message, then
        ``<|assistant|>\\n`` (BOS is added by :meth:`encode_chat`)."""
        return "".join(f"<|{role}|>\n{content}\n" for role, content in messages) + "<|assistant|>\n"

    def encode_chat(self, text: str) -> list[int]:
        """A rendered conversation as ids, after BOS."""
        return self.encode(text, add_bos=True)

    def validate(self, tokens: Iterable[int]) -> tuple[int, ...]:
        """The tokens as a tuple of ints in the vocabulary; ``BadRequest`` (400) otherwise (R7.4.4)."""
        return self.check_ids(tokens, self.vocab_size)

    @staticmethod
    def check_ids(tokens: Iterable[int], vocab_size: int) -> tuple[int, ...]:
        """Token ids as a tuple of ints in ``[0, vocab_size)``; ``BadRequest`` (400) otherwise (R7.4.4)."""
        out = []
        for i, tok in enumerate(tokens):
            if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab_size:
                raise BadRequest(f"prompt token {i} is {tok!r}; tokens must be integers in [0, {vocab_size})",
                                 field="prompt")
            out.append(tok)
        return tuple(out)

    def decode(self, tokens: Iterable[int]) -> str:
        """Text of ``tokens``; special tokens produce nothing, invalid UTF-8 becomes U+FFFD."""
        data = bytes(t for t in tokens if 0 <= t < BYTE_TOKENS)
        return data.decode("utf-8", errors="replace")

    def detokenizer(self) -> Detokenizer:
        return Detokenizer(self)

    def statistics(self) -> TokenizerStatistics:
        return TokenizerStatistics(self.vocab_size, self.bos, self.eos,
                                   tuple(range(BYTE_TOKENS, self.vocab_size)))


class Detokenizer:
    """Incremental decoding: ``push`` returns the text completed by one more token."""

    def __init__(self, tokenizer: ByteTokenizer) -> None:
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        if self._tokenizer.is_special(token) or token < 0:
            return ""
        text: str = self._decoder.decode(bytes((token,)))
        return text

    def flush(self) -> str:
        """Whatever is held back (an incomplete character becomes U+FFFD)."""
        text: str = self._decoder.decode(b"", final=True)
        return text
