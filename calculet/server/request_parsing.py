"""From request bytes to what the engine is asked to generate, off the event loop (issue #14, §5.2).

Why apart from the routes: parsing, validating and tokenising a body of several megabytes took
the event loop for about a second per body, stalling every other client (``/health/live``
included). The routes hand the bytes the body gate (:mod:`calculet.server.body_gate`) has
already read and bounded to :func:`prepare_completion` / :func:`prepare_chat` on a worker
thread. Each step is bounded too: the JSON is validated by pydantic-core straight from bytes
(no intermediate Python objects), and a prompt certainly longer than the context is refused
before it is tokenised whole (:func:`_bounded_encode`).

Every client error becomes a 400 in the OpenAI error shape whose ``param`` is the request field
the client wrote (``messages.0.content``), never pydantic's internal union tags
(``stop.constrained-str``); a lone UTF-16 surrogate (``"\\ud800"``) is named by its field too.
"""

from __future__ import annotations

import functools
import json
import logging
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from calculet.errors import BadRequest
from calculet.records import quick_init
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.tokenizer import ByteTokenizer
from calculet.server.errors import APIError, from_calculet, invalid, unsupported
from calculet.server.schemas import REFUSED, ChatCompletionRequest, ChatMessage, CompletionRequest, LoadRequest

log = logging.getLogger("calculet.server.inference")

Kind = Literal["completion", "chat"]
M = TypeVar("M", bound=BaseModel)

GREEDY_BELOW = 1e-5
"""A temperature below this samples greedily (vLLM's ``_SAMPLING_EPS``): dividing logits by 1e-308
overflowed to no usable token (a 500, issue #14)."""


# ---------------------------------------------------------------------------------------------
# validation errors → 400 naming the field the client wrote
# ---------------------------------------------------------------------------------------------


def _field_names(models: Sequence[type[BaseModel]]) -> frozenset[str]:
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()

    def visit(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in seen:
                seen.add(annotation)
                for name, info in annotation.model_fields.items():
                    names.add(name)
                    visit(info.annotation)
            return
        for arg in typing.get_args(annotation):
            visit(arg)

    for model in models:
        visit(model)
    return frozenset(names)


FIELD_NAMES = _field_names((CompletionRequest, ChatCompletionRequest, LoadRequest)) | frozenset(REFUSED)


def field_path(loc: Sequence[int | str]) -> str | None:
    """``loc`` as the client wrote it: field names and list indices, without pydantic's union tags."""
    parts = [str(p) for p in loc if isinstance(p, int) or p in FIELD_NAMES]
    return ".".join(parts) or None


_MISMATCH = ("_type", "literal_error", "union_tag_invalid", "none_required")


def _most_telling(errors: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """Of a union's errors (one per member), the one of the member the input matched in kind: a value error
    if there is one, else the deepest mismatch (``stop: [5]`` is ``stop.0``, not ``stop``)."""
    for error in errors:
        if not str(error.get("type", "")).endswith(_MISMATCH):
            return error
    return max(errors, key=lambda e: len(e.get("loc", ())))


def from_validation(errors: Sequence[Mapping[str, Any]], *, body_loc: bool = False) -> APIError:
    """The 400 for pydantic ``errors`` (``body_loc``: FastAPI's locations start with ``body``)."""
    if not errors:
        return APIError(400, "invalid request", code="invalid_request")
    first = _most_telling(errors)
    loc = list(first.get("loc", ()))
    if body_loc and loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    param = field_path(loc)
    kind = str(first.get("type", ""))
    top = str(loc[0]) if loc else ""
    if kind in ("json_invalid", "json_type", "model_attributes_type", "model_type") or (kind == "missing" and not loc):
        return APIError(400, f"the body must be a JSON object: {first.get('msg', '')}", code="invalid_json")
    if kind == "extra_forbidden":
        reason = REFUSED.get(top) if len(loc) == 1 else None
        return unsupported(param or top, reason or f"unknown field {param!r}: this service refuses fields it does not "
                                                   "know rather than ignore them")
    if top in REFUSED and not kind.endswith("_type"):
        return unsupported(top, REFUSED[top])
    if top == "prompt" and kind == "too_long" and len(loc) <= 2:
        return unsupported("prompt", "several prompts in one request are not supported; send one prompt per request")
    where = param or "body"
    return APIError(400, f"{where}: {first.get('msg', 'invalid')}", code="invalid_value", param=param)


def _surrogate_path(value: Any, path: tuple[int | str, ...] = ()) -> Iterator[tuple[int | str, ...]]:
    if isinstance(value, str):
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            if any("\ud800" <= ch <= "\udfff" for ch in key):
                yield (*path, key)
            yield from _surrogate_path(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _surrogate_path(item, (*path, i))


def _lone_surrogate(raw: bytes | bytearray) -> APIError | None:
    """The 400 naming the field of a lone UTF-16 surrogate escape, if that is what made ``raw`` invalid."""
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    for path in _surrogate_path(document):
        param = ".".join(str(p) for p in path) or None
        return APIError(400, f"{param or 'body'}: contains a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is "
                             "not a Unicode character", code="invalid_unicode", param=param)
    return None


COMMAS_BEYOND_CONTEXT = 8192
"""Commas a generation body may hold beyond what its context allows (see :func:`_too_many_commas`): messages,
their fields, stop strings, metadata, the ignored fields' text."""


def _too_many_commas(raw: bytes | bytearray, max_seq: int) -> APIError | None:
    """The 400 ``context_length_exceeded`` for a body with more commas than any request that fits the context,
    before it is parsed.

    Why: the parser builds every value before validation can refuse any — an 8 MiB body of token ids (4 million
    of them) took 1 s of CPU holding the interpreter lock (the event loop stalled with it) and 190 MB of memory,
    only to be refused for a context of a few thousand tokens. Each token id but the first follows a comma, and
    a text within the context has at most :data:`PREFIX_CHARS_PER_TOKEN` characters a token (the assumption
    :func:`_bounded_encode` makes too), so a body that fits holds at most ``max_seq`` commas between token ids
    plus ``PREFIX_CHARS_PER_TOKEN x max_seq`` inside its text, plus :data:`COMMAS_BEYOND_CONTEXT` for the rest.
    Counting them is one pass in C (a few ms for 8 MiB)."""
    limit = (PREFIX_CHARS_PER_TOKEN + 1) * max_seq + COMMAS_BEYOND_CONTEXT
    commas = raw.count(b",")
    if commas <= limit:
        return None
    return APIError(400, f"the body holds {commas} commas: more token ids or text than a context of {max_seq} tokens "
                         f"can take (at most {limit} commas fit it)", code="context_length_exceeded")


def parse_body(model: type[M], raw: bytes | bytearray) -> M:
    """``raw`` validated as ``model`` (strict, straight from the JSON bytes); :class:`APIError` 400 otherwise."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False)
        if errors and errors[0].get("type") == "json_invalid":
            surrogate = _lone_surrogate(raw)
            if surrogate is not None:
                raise surrogate from None
        raise from_validation(errors) from None


# ---------------------------------------------------------------------------------------------
# prompts and sampling
# ---------------------------------------------------------------------------------------------


@quick_init  # one per generation request, refused ones included (issue #13): its nine fields written directly
@dataclass(frozen=True)
class ApiGeneration:
    """One OpenAI completion or chat request, parsed and checked at the edge: what the engine is
    asked to generate and how the answer is shaped (stream, usage)."""

    kind: Kind
    model: str
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    stop_strings: tuple[str, ...] = ()
    continuous_usage: bool = False


def _too_long(param: str, length: int, max_seq: int) -> APIError:
    return APIError(400, f"the prompt has at least {length} tokens; the context is {max_seq}",
                    code="context_length_exceeded", param=param)


PREFIX_CHARS_PER_TOKEN = 32
"""A text longer than ``context × 32`` characters is first tokenised on its prefix of that length only."""
CUT_MARGIN = 64
"""Tokens the cut of a prefix may add at its end (the word it splits); past ``context + 64`` the whole is too long."""


def _bounded_encode(encode: Callable[[str], list[int]], tokenizer: ByteTokenizer, text: str, max_seq: int,
                    param: str) -> tuple[int, ...]:
    """``encode(text)``, refused with 400 ``context_length_exceeded`` without tokenising the whole of a text that
    is certainly too long: with the byte-level vocabulary every character is at least one token, so the length
    decides; with a package's own tokenizer (#18, several characters per token) a long text's prefix of
    ``context × 32`` characters is tokenised first, and more than ``context + 64`` tokens there decide it (a
    7.5 MB prompt used to be tokenised whole, holding the interpreter for seconds)."""
    if type(tokenizer) is ByteTokenizer:
        if len(text) + 1 > max_seq:
            raise _too_long(param, len(text) + 1, max_seq)
    elif len(text) > max_seq * PREFIX_CHARS_PER_TOKEN:
        head = len(encode(text[: max_seq * PREFIX_CHARS_PER_TOKEN]))
        if head > max_seq + CUT_MARGIN:
            raise _too_long(param, head - CUT_MARGIN, max_seq)
    ids = tuple(encode(text))
    if len(ids) > max_seq:
        raise _too_long(param, len(ids), max_seq)
    return ids


def chat_prompt(tokenizer: ByteTokenizer, messages: list[ChatMessage], max_seq: int) -> tuple[int, ...]:
    """The served package's chat template (its ``tokenizer_config.json``, or the byte-level default), tokenised (#18)."""
    text = tokenizer.chat_text([(m.role, m.text()) for m in messages])
    return _bounded_encode(tokenizer.encode_chat, tokenizer, text, max_seq, "messages")


def completion_prompt(tokenizer: ByteTokenizer, prompt: Any, max_seq: int) -> tuple[int, ...]:
    """A string (BOS + UTF-8 bytes) or token ids used as given (one prompt per request)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a list of exactly one prompt (the schema allows no more)
    if isinstance(prompt, str):
        return _bounded_encode(lambda text: tokenizer.encode(text, add_bos=True), tokenizer, prompt, max_seq, "prompt")
    if len(prompt) > max_seq:
        raise _too_long("prompt", len(prompt), max_seq)
    for i, tok in enumerate(prompt):
        if not 0 <= tok < tokenizer.vocab_size:
            raise invalid(f"prompt token {i} is {tok}; token ids must be in [0, {tokenizer.vocab_size})",
                          param="prompt")
    return tuple(prompt)


SAMPLINGS_KEPT = 256
"""Distinct sampling parameters whose :class:`SamplingParams` is kept (:func:`_sampling_params`)."""


@functools.lru_cache(maxsize=SAMPLINGS_KEPT, typed=True)
def _sampling_params(temperature: float, top_p: float, top_k: int, seed: int | None, stop_text: tuple[str, ...],
                     ignore_eos: bool) -> SamplingParams:
    """``SamplingParams(...)`` of these values, the same (immutable) instance for the same values.

    Why kept (issue #13): a burst's clients send the same few parameter sets, and building and validating a frozen
    dataclass was ~5 % of the event loop's CPU per refusal (a py-spy sample of ``bench/loop_profile.py``'s pinned
    refusals); a lookup keyed by the values is a fraction of it. ``typed``: ``1`` and ``1.0`` (and ``True``) hash
    alike but are kept apart, so the instance holds exactly the values asked for; an invalid set raises each time
    (nothing is kept for it)."""
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop_text=stop_text,
                          ignore_eos=ignore_eos)


def sampling(body: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
    # stop strings are matched on the decoded text (issue #14), never tokenised: a stop string the model
    # writes across other token boundaries, or inside one longer token, must stop it too (OpenAI, vLLM)
    stops = body.stop_strings()
    if any(not text for text in stops):
        raise invalid("a stop string must not be empty", param="stop")
    temperature = float(body.temperature if body.temperature is not None else 1.0)
    try:
        return _sampling_params(0.0 if temperature < GREEDY_BELOW else temperature,
                                float(body.top_p if body.top_p is not None else 1.0), body.top_k or 0, body.seed,
                                tuple(stops), body.ignore_eos)
    except BadRequest as exc:
        raise from_calculet(exc) from None


class Served(typing.Protocol):
    """What preparing a request needs of the service."""

    tokenizer: ByteTokenizer

    def check_model(self, model: str) -> None: ...

    @property
    def max_seq(self) -> int: ...


def _ignored(body: CompletionRequest | ChatCompletionRequest) -> None:
    if not log.isEnabledFor(logging.DEBUG):  # the fields' set and sort only for a line that is written (issue #13)
        return
    ignored = body.ignored()
    if ignored:
        log.debug("ignored request fields", extra={"fields": ignored})


def prepare_completion(service: Served, raw: bytes | bytearray) -> ApiGeneration:
    """POST /v1/completions: bytes → :class:`ApiGeneration` (blocking; run it on a worker thread)."""
    crowded = _too_many_commas(raw, service.max_seq)
    if crowded is not None:
        raise crowded
    body = parse_body(CompletionRequest, raw)
    _ignored(body)
    service.check_model(body.model)
    tokenizer = service.tokenizer
    prompt = completion_prompt(tokenizer, body.prompt, service.max_seq)
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    return ApiGeneration("completion", body.model, prompt, max_tokens, sampling(body), bool(body.stream),
                         body.include_usage, body.stop_strings(), body.continuous_usage)


def prepare_chat(service: Served, raw: bytes | bytearray) -> ApiGeneration:
    """POST /v1/chat/completions: bytes → :class:`ApiGeneration` (blocking; run it on a worker thread)."""
    crowded = _too_many_commas(raw, service.max_seq)
    if crowded is not None:
        raise crowded
    body = parse_body(ChatCompletionRequest, raw)
    _ignored(body)
    service.check_model(body.model)
    tokenizer = service.tokenizer
    prompt = chat_prompt(tokenizer, body.messages, service.max_seq)
    max_tokens = body.requested_max_tokens
    if max_tokens is None:
        max_tokens = max(1, service.max_seq - len(prompt))
    return ApiGeneration("chat", body.model, prompt, max_tokens, sampling(body), bool(body.stream),
                         body.include_usage, body.stop_strings(), body.continuous_usage)


def stop_reason(matched: str | None, finished_by_stop: bool) -> str | None:
    """vLLM's ``stop_reason``: the stop string whose text ended the output (the stream's match), else None
    (EOS or length)."""
    return matched if finished_by_stop else None


__all__ = ["ApiGeneration", "FIELD_NAMES", "GREEDY_BELOW", "COMMAS_BEYOND_CONTEXT", "Kind", "chat_prompt", "completion_prompt", "field_path",
           "from_validation", "parse_body", "prepare_chat", "prepare_completion", "sampling", "stop_reason"]
