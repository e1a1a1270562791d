"""Request and response bodies of the HTTP service: the OpenAI-compatible subset and the admin API.

The schema is the contract (issue #14): ``/openapi.json`` describes exactly what the server
accepts, so a client generated from it is never refused for schema-valid input except for the
reasons each operation states (``x-calculet-refusals``: a prompt that does not fit the context,
capacity). Capability honesty (§1, §9.3, R1.1, R9.3.9, R19.12) shapes it:

* accepted: ``model``, ``prompt`` (one prompt: a string, token ids, or a list of exactly one of
  either) / ``messages``, ``max_tokens`` (chat also ``max_completion_tokens``), ``temperature``,
  ``top_p``, ``seed``, ``stop`` (up to 4 strings), ``stream``, ``stream_options``
  (``include_usage``, and vLLM's ``continuous_usage_stats``: usage in every chunk); two
  extensions other OpenAI-compatible servers also accept: ``top_k`` and ``ignore_eos``;
* accepted only at their neutral value, the schema saying so (``n`` = 1, ``best_of`` = 1,
  ``echo`` false, ``logprobs`` null/false, zero penalties, an empty ``logit_bias``, no tools or
  functions, a ``text`` response format): other values need fork/beam-search KV copies (§9.3) or
  features the service does not have, and are refused with 400 ``unsupported_parameter`` naming
  the field;
* accepted and ignored (logged at debug): OpenAI fields that do not change generation —
  ``user``, ``store``, ``metadata``, ``service_tier``, ``prompt_cache_key``,
  ``safety_identifier``, and for chat ``parallel_tool_calls`` — as vLLM and most compatible
  servers do;
* anything else is refused (``extra="forbid"``): unknown fields get 400 naming them, and nothing
  in a request can raise a tenant's weight or limits (§5.3, R5.3.7).

Types are strict (``strict=True``): ``"max_tokens": "16"``, ``"max_tokens": true`` and
``"stream": "yes"`` are 400, not coerced; non-finite numbers are refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

MAX_STOP_SEQUENCES = 4
SEED_MAX = 2**63 - 1

IGNORED_FIELDS = frozenset({"user", "store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier",
                            "parallel_tool_calls"})
"""OpenAI request fields accepted and ignored: they do not change what is generated."""

REFUSED: dict[str, str] = {
    "n": "several choices per request are not supported (only n=1): they need fork/beam-search KV copies, "
         "disabled by §9.3",
    "best_of": "best_of is not supported (only 1): beam/best-of search needs KV copies that are disabled (§9.3)",
    "logprobs": "logprobs are not supported: no log probabilities are returned",
    "top_logprobs": "top_logprobs are not supported: no log probabilities are returned",
    "echo": "echo is not supported",
    "suffix": "suffix (insertion) is not supported",
    "logit_bias": "logit_bias is not supported (only an empty object)",
    "presence_penalty": "presence_penalty is not supported (only 0)",
    "frequency_penalty": "frequency_penalty is not supported (only 0)",
    "tools": "tools (tool calling) are not supported (only an empty list)",
    "functions": "functions (function calling) are not supported (only an empty list)",
    "tool_choice": "tool_choice is not supported (only 'none')",
    "function_call": "function_call is not supported (only 'none')",
    "response_format": "only response_format {'type': 'text'} is supported",
}
"""Fields the service refuses at any value but their neutral one (or, not in the schema, at all), and why."""


def _integral(value: Any) -> Any:
    """JSON Schema's ``integer`` is any number without a fractional part (``2.0`` included): such a float is the
    integer; a boolean is never one (strict mode then refuses strings, ``true`` and ``2.5``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _boolean(value: Any) -> Any:
    """A ``false``-only field takes the JSON boolean ``false`` (or null), never ``0`` (``0 == False`` in Python)."""
    if value is not None and not isinstance(value, bool):
        raise ValueError("Input should be a valid boolean")
    return value


JsonInt = Annotated[int, BeforeValidator(_integral)]


def json_int(**constraints: Any) -> Any:
    """:data:`JsonInt` with ``constraints`` (``ge``, ``le``) on the integer itself, so the schema says ``minimum``."""
    return Annotated[int, Field(**constraints), BeforeValidator(_integral)]
JsonFalse = Annotated[Literal[False], BeforeValidator(_boolean)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------


class StreamOptions(_Request):
    include_usage: bool = Field(False, description="Send a last chunk with the usage counts before [DONE].")
    continuous_usage_stats: bool = Field(False, description="vLLM's extension: usage counts so far in every chunk.")


def _shape(value: Any) -> str | None:
    """The branch of a text-or-list union a value takes, decided by its shape, so that an error names the
    element the client wrote (``stop.0``) and never pydantic's union tags. Tags are not identifiers, so they can
    never be mistaken for a field name."""
    if isinstance(value, str):
        return "as-text"
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, str):
            return "as-texts"
        if isinstance(first, list):
            return "as-token-lists"
        if isinstance(first, dict):
            return "as-parts"
    return "as-tokens" if isinstance(value, list) else None


def _text_or_list(kind: str, list_tag: str) -> Discriminator:
    """A text-or-list union's discriminator whose error, for a value of neither kind (``"content": 5``), names both
    kinds the field takes — not only the member its tag fell back to (``Input should be a valid list``)."""
    def shape(value: Any) -> str | None:
        if isinstance(value, str):
            return "as-text"
        return list_tag if isinstance(value, list) else None
    return Discriminator(shape, custom_error_type="text_or_list_type",
                         custom_error_message=f"Input should be a string or a list of {kind}")


StopField = Annotated[Union[Annotated[Annotated[str, Field(min_length=1)], Tag("as-text")],
                            Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES),
                                      Tag("as-texts")]],
                      _text_or_list("strings", "as-texts")] | None
_IGNORED = "Accepted for compatibility and ignored: it does not change generation."
_NEUTRAL = "Not supported beyond this value"


class _Sampling(_Request):
    """Fields shared by both endpoints."""

    model: str = Field(min_length=1, max_length=128, description="A model alias from GET /v1/models.")
    temperature: float | None = Field(1.0, ge=0.0, le=2.0,
                                      description="0 = greedy; below 1e-5 is treated as 0 (as vLLM does).")
    top_p: float | None = Field(1.0, gt=0.0, le=1.0)
    top_k: json_int(ge=0, le=1_000_000) | None = Field(None, description="Extension: keep the k most likely tokens (0 = off).")
    seed: json_int(ge=0, le=SEED_MAX) | None = Field(None, description="Seed of this request's sampler.")
    stop: StopField = Field(None, description=f"Up to {MAX_STOP_SEQUENCES} stop strings; the match is not returned.")
    n: json_int(ge=1, le=1) | None = Field(1, description=f"{_NEUTRAL}: one choice per request (§9.3).")
    stream: bool | None = Field(False, description="Server-sent events ending with `data: [DONE]`.")
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="Extension: keep generating past the end-of-sequence token.")
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = Field(
        None, description=f"{_NEUTRAL}: an empty object.")
    presence_penalty: float | None = Field(None, ge=0.0, le=0.0, description=f"{_NEUTRAL}: 0.")
    frequency_penalty: float | None = Field(None, ge=0.0, le=0.0, description=f"{_NEUTRAL}: 0.")
    user: str | None = Field(None, max_length=256, description=_IGNORED)
    store: bool | None = Field(None, description=_IGNORED)
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = Field(None, description=_IGNORED)
    service_tier: str | None = Field(None, max_length=64, description=_IGNORED)
    prompt_cache_key: str | None = Field(None, max_length=256, description=_IGNORED)
    safety_identifier: str | None = Field(None, max_length=256, description=_IGNORED)

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def ignored(self) -> list[str]:
        """The accepted-and-ignored fields this request set."""
        return sorted(IGNORED_FIELDS & self.model_fields_set)


TokenIds = Annotated[list[json_int(ge=0)], Field(min_length=1)]
PromptField = Annotated[Union[Annotated[str, Tag("as-text")],
                              Annotated[list[str], Field(min_length=1, max_length=1), Tag("as-texts")],
                              Annotated[TokenIds, Tag("as-tokens")],
                              Annotated[list[TokenIds], Field(min_length=1, max_length=1), Tag("as-token-lists")]],
                        Discriminator(_shape, custom_error_type="text_or_list_type",
                                      custom_error_message="Input should be a string, a list of token ids, or a list of one of either")]


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: PromptField = Field(description="One prompt: text, or token ids of the served model's vocabulary (a "
                                            "list of exactly one of either is the same prompt).")
    max_tokens: json_int(ge=1) | None = Field(16, description="Tokens to generate (prompt + max_tokens must fit the context).")
    best_of: json_int(ge=1, le=1) | None = Field(None, description=f"{_NEUTRAL}: 1.")
    logprobs: None = Field(None, description=f"{_NEUTRAL}: null.")
    echo: JsonFalse | None = Field(None, description=f"{_NEUTRAL}: false.")


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[Union[Annotated[str, Tag("as-text")], Annotated[list[TextPart], Tag("as-parts")]],
                       _text_or_list("text parts", "as-parts")] | None = None
    name: str | None = Field(None, max_length=64)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Request):
    type: Literal["text"]


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    max_tokens: json_int(ge=1) | None = Field(None, description="Tokens to generate; default: what the context leaves.")
    max_completion_tokens: json_int(ge=1) | None = Field(None, description="Same as max_tokens; it wins when both are "
                                                                      "given (OpenAI's newer name).")
    logprobs: JsonFalse | None = Field(None, description=f"{_NEUTRAL}: false.")
    tools: Annotated[list[dict[str, Any]], Field(max_length=0)] | None = Field(
        None, description=f"{_NEUTRAL}: an empty list.")
    tool_choice: Literal["none"] | None = Field(None, description=f"{_NEUTRAL}: 'none'.")
    functions: Annotated[list[dict[str, Any]], Field(max_length=0)] | None = Field(
        None, description=f"{_NEUTRAL}: an empty list.")
    function_call: Literal["none"] | None = Field(None, description=f"{_NEUTRAL}: 'none'.")
    parallel_tool_calls: bool | None = Field(None, description=_IGNORED)
    response_format: ResponseFormat | None = Field(None, description=f"{_NEUTRAL}: {{'type': 'text'}}.")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class LoadRequest(_Request):
    """POST /admin/models/{alias}/load: a signed package under a trusted root (§11 steps 1–2)."""

    package: str = Field(min_length=1, max_length=4096, pattern=r"^[^\x00]+$",
                         description="Package directory or .tar archive path (no NUL: no file system has one).")


# ---------------------------------------------------------------------------------------------
# responses
# ---------------------------------------------------------------------------------------------


class ErrorDetail(_Response):
    message: str
    type: str
    code: str
    param: str | None = None


class ErrorResponse(_Response):
    error: ErrorDetail


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


FinishReasonOut = Literal["stop", "length"]


StopReason = Union[str, int, None]
_STOP_REASON = ("As vLLM gives it: the stop string that ended the choice, or null (end-of-sequence token, length "
                "limit, or still running).")


class CompletionChoice(_Response):
    index: int
    text: str
    finish_reason: FinishReasonOut | None
    stop_reason: StopReason = Field(None, description=_STOP_REASON)
    logprobs: None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    finish_reason: FinishReasonOut
    stop_reason: StopReason = Field(None, description=_STOP_REASON)
    logprobs: None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class ModelDetails(_Response):
    """What the served generation is, with honest device facts (R1.1, R20.7)."""

    generation: int
    state: str
    calbin: str | None = None
    context_length: int | None = None
    npu_compiled_batch_profiles: list[int] = Field(
        description="Compiled batch sizes of the loaded calbin (B1 is the current product, C0; B>1 is C3).")
    evidence: str = Field(description="Where the device facts come from: 'simulated NPU' or a vendor runtime.")


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    calculet: ModelDetails


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OperationReport(_Response):
    """What a load, rollback, unload or drain did (the ModelManager's ``LoadReport`` / ``UnloadReport``)."""

    kind: Literal["load", "rollback", "unload", "drain"]
    ok: bool
    replaced: int | None = Field(None, description="Load/rollback: the generation the alias pointed at before.")
    previous_drained: bool | None = Field(
        None, description="Load/rollback: the old generation was drained and unloaded before configure (CalRT 0.7.6: "
                          "configure is device-global, so a replacement is never zero-downtime).")
    downtime_s: float | None = Field(None, description="Load/rollback: how long new requests for the alias were held.")
    rollback_available: bool | None = Field(None, description="Load/rollback: §11 step 11 kept the previous artifact.")
    golden: str | None = Field(None, description="Load/rollback: golden vectors and warm-up outcome.")
    drain_s: float | None = Field(None, description="Unload: time until no request was pinned and no job in flight.")
    deadline_passed: bool | None = Field(None, description="Unload: the drain deadline passed first.")
    cancelled_requests: int | None = Field(None, description="Unload: requests cancelled at the drain deadline.")
    drain_deadline_ms: int | None = Field(None, description="Drain/unload: the drain deadline applied.")
    warnings: list[str] = Field(default_factory=list)
    steps: dict[str, float] = Field(default_factory=dict, description="Seconds per §11/§12 step.")


class ModelStatusResponse(BaseModel):
    """One model generation as the admin API lists it (the ModelAdmin ``status()`` entry)."""

    model_config = ConfigDict(extra="allow")

    alias: str
    generation: int
    state: str = Field(description="A §10 ModelState: unloaded, validating, configuring, warming, ready, draining, "
                                   "unloading, recovering, failed.")
    active: bool = Field(description="The alias points at this generation.")
    calbin: str | None = None
    exact_submodel: str | None = None
    package: str | None = None
    package_sha256: str | None = Field(None, description="SHA-256 of the package's signed manifest.json.")
    signed_by: str | None = Field(None, description="The trusted key that signed the package (§11 step 2).")
    max_seq: int | None = None
    profiles: list[int] = Field(default_factory=list)
    active_requests: int = Field(0, description="Requests pinned to this generation (§10).")
    inflight_jobs: int = Field(0, description="Device jobs of this generation still in flight (§10).")
    durations_s: dict[str, float] = Field(default_factory=dict, description="load/configure/warmup/drain/unload.")
    detail: str = ""
    report: OperationReport | None = Field(None, description="The operation this response answers (load, rollback, "
                                                             "unload, drain); absent from listings.")


class ModelStatusList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelStatusResponse]


class CapabilityRow(_Response):
    name: str
    value: str
    tier: str = Field(description="The spec's evidence tier C0–C4 (§1).")
    source: str = Field(description="spec | simulated | vendor | measured.")
    ref: str
    simulated: bool
    proved: bool


class ProfileRow(_Response):
    compiled_batch: int
    tier: str
    usable: bool
    max_seq: int


class CapabilityContract(_Response):
    device: str
    runtime: str
    note: str
    npu_batch: ProfileRow | None = Field(description="The largest compiled batch in use: what the device really runs.")
    profiles: list[ProfileRow]
    capabilities: list[CapabilityRow]
    software_multi_slot: str


class Health(_Response):
    status: str
    detail: str = ""
