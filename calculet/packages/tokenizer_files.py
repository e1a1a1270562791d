"""A package's tokenizer files: a Hugging Face ``tokenizer.json`` and its ``tokenizer_config.json``
(with the Jinja2 ``chat_template``), and the byte-level BPE the bundled tiny model trains (#18).

Why in the package: the tokenizer and the chat template are part of the model — a prompt
rendered with another template, or tokenised with another vocabulary, is another input — so they
travel inside the signed package, listed in ``files`` like the weights (§11 step 2) and loaded
with the model (§11, :mod:`calculet.runtime.streams.package_tokenizer`). The files have exactly the
form Hugging Face publishes for a model, so a real model's own files can be dropped in.

The bundled tiny model's tokenizer is trained when the package is built, from text calculet ships
(``calculet/data/tokenizer/corpus.txt``): a byte-level BPE (any UTF-8 text encodes; nothing is
unknown) with the special tokens of :data:`SPECIAL_TOKENS` first, so their ids are 0..6. Training
is deterministic, so two builds are byte-identical.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
BOS, EOS, PAD, UNK = "<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, PAD, UNK, *ROLE_TOKENS)
BUNDLED_VOCAB_SIZE = 512

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""The bundled model's chat template, in the Hugging Face ``chat_template`` form (Jinja2 over
``messages``, ``bos_token``, ``eos_token``, ``add_generation_prompt``, ``raise_exception``)."""


@dataclass(frozen=True)
class TokenizerFiles:
    """The two files' contents, ready to be written into a package source directory."""

    tokenizer_json: str
    config_json: str
    vocab_size: int
    special_ids: dict[str, int]

    def write(self, directory: str | Path) -> None:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / TOKENIZER_FILE).write_text(self.tokenizer_json, encoding="utf-8")
        (out / TOKENIZER_CONFIG_FILE).write_text(self.config_json, encoding="utf-8")

    def encode(self, text: str) -> list[int]:
        """``text`` as token ids (no special token added): for golden prompts at build time."""
        ids: list[int] = Tokenizer.from_str(self.tokenizer_json).encode(text, add_special_tokens=False).ids
        return ids


def corpus_text() -> str:
    """The training text calculet ships (comment lines starting with ``#`` at the top included)."""
    return resources.files("calculet.data").joinpath("tokenizer/corpus.txt").read_text(encoding="utf-8")


def train_bpe(text: str, vocab_size: int = BUNDLED_VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE trained on ``text`` with :data:`SPECIAL_TOKENS` at ids 0.."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def tokenizer_config(chat_template: str = CHAT_TEMPLATE) -> dict[str, Any]:
    """A ``tokenizer_config.json`` in the Hugging Face form (only the keys calculet reads)."""
    return {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK, "chat_template": chat_template,
            "add_bos_token": False, "model_max_length": None}


def files_for(tokenizer: Tokenizer, chat_template: str = CHAT_TEMPLATE) -> TokenizerFiles:
    ids = {name: tokenizer.token_to_id(tok) for name, tok in (("bos", BOS), ("eos", EOS), ("pad", PAD), ("unk", UNK))}
    return TokenizerFiles(tokenizer.to_str(pretty=True) + "\n",
                          json.dumps(tokenizer_config(chat_template), indent=2, sort_keys=True) + "\n",
                          tokenizer.get_vocab_size(with_added_tokens=True), ids)


def bundled_tokenizer_files(chat_template: str = CHAT_TEMPLATE) -> TokenizerFiles:
    """The bundled tiny model's tokenizer, trained now from the shipped corpus."""
    return files_for(train_bpe(corpus_text()), chat_template)


__all__ = ["BUNDLED_VOCAB_SIZE", "CHAT_TEMPLATE", "SPECIAL_TOKENS", "TOKENIZER_CONFIG_FILE", "TOKENIZER_FILE",
           "TokenizerFiles", "bundled_tokenizer_files", "corpus_text", "files_for", "tokenizer_config", "train_bpe"]
