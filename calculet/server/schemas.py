"""Request and response bodies of the HTTP service: the OpenAI-compatible subset and the admin API.

Accepted and refused fields (capability honesty, §1, §9.3, R1.1, R9.3.9, R19.12):

* accepted: ``model``, ``prompt`` / ``messages``, ``max_tokens`` (chat also
  ``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``stop`` (up to 4 strings),
  ``n`` (only 1), ``stream``, ``stream_options.include_usage``, ``user`` (not used); two
  extensions other OpenAI-compatible servers also accept: ``top_k`` and ``ignore_eos``;
* refused with 400 naming the field when asked for: ``n > 1`` and ``best_of > 1`` (several
  choices need fork / beam-search KV copies, §9.3), ``logprobs`` / ``top_logprobs``, ``echo``,
  ``suffix``, ``logit_bias``, non-zero ``presence_penalty`` / ``frequency_penalty``, tools and
  functions, a ``response_format`` other than text;
* any other field is refused (``extra="forbid"``): nothing a client sends is silently ignored,
  and nothing in a request can raise a tenant's weight or limits (§5.3, R5.3.7).

Nothing here declares NPU batch > 1, continuous batching, prompt cache, fork or beam search as
supported (R1.1, R9.3.9, R19.12); the capability contract with its evidence tiers is served
by the admin API (:mod:`calculet.server.admin`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from calculet.server.errors import APIError, unsupported

MAX_STOP_SEQUENCES = 4
SEED_MAX = 2**63 - 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------


class StreamOptions(_Request):
    include_usage: bool = Field(False, description="Send a last chunk with the usage counts before [DONE].")


StopField = Union[Annotated[str, Field(min_length=1)],
                  Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)],
                  None]


class _Sampling(_Request):
    """Fields shared by both endpoints."""

    model: str = Field(min_length=1, max_length=128, description="A model alias from GET /v1/models.")
    temperature: float | None = Field(1.0, ge=0.0, le=2.0, description="0 = greedy.")
    top_p: float | None = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=1_000_000,
                              description="Extension: keep the k most likely tokens (0 = off).")
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="Seed of this request's sampler.")
    stop: StopField = Field(None, description=f"Up to {MAX_STOP_SEQUENCES} stop strings; the match is not returned.")
    n: int | None = Field(1, ge=1, le=128, description="Only 1: several choices need fork/beam KV copies (§9.3).")
    stream: bool | None = Field(False, description="Server-sent events ending with `data: [DONE]`.")
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="Extension: keep generating past the end-of-sequence token.")
    user: str | None = Field(None, max_length=256, description="Accepted for compatibility; not used.")
    logit_bias: dict[str, float] | None = Field(None, description="Not supported: refused unless empty.")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="Not supported: refused unless 0.")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="Not supported: refused unless 0.")

    def common_refusals(self) -> APIError | None:
        if self.n is not None and self.n != 1:
            return unsupported("n", f"n={self.n} is not supported: this service returns exactly one choice per "
                                    "request (several choices need fork/beam-search KV copies, disabled by §9.3)")
        if self.logit_bias:
            return unsupported("logit_bias", "logit_bias is not supported")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                return unsupported(name, f"{name} is not supported (only 0)")
        return None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


PromptField = Union[str,
                    Annotated[list[str], Field(min_length=1)],
                    Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)],
                    Annotated[list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
                              Field(min_length=1)]]


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: PromptField = Field(description="Text, or token ids of the byte-level vocabulary; one prompt per request.")
    max_tokens: int | None = Field(16, ge=1,
                                   description="Tokens to generate (prompt + max_tokens must fit the context).")
    best_of: int | None = Field(None, ge=1, le=128, description="Not supported: refused unless 1.")
    logprobs: int | None = Field(None, ge=0, le=5, description="Not supported: refused unless null.")
    echo: bool | None = Field(None, description="Not supported: refused unless false.")
    suffix: str | None = Field(None, description="Not supported: refused unless null.")

    def refusals(self) -> APIError | None:
        if self.best_of not in (None, 1):
            return unsupported("best_of", f"best_of={self.best_of} is not supported: beam/best-of search needs "
                                          "KV copies that are disabled (§9.3)")
        if self.logprobs is not None:
            return unsupported("logprobs", "logprobs are not supported")
        if self.echo:
            return unsupported("echo", "echo is not supported")
        if self.suffix is not None:
            return unsupported("suffix", "suffix (insertion) is not supported")
        if isinstance(self.prompt, list) and len(self.prompt) > 1 and not isinstance(self.prompt[0], int):
            return unsupported("prompt", f"{len(self.prompt)} prompts in one request are not supported; send one "
                                         "prompt per request")
        return self.common_refusals()


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=64)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Request):
    type: str


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    max_tokens: int | None = Field(None, ge=1, description="Tokens to generate; default: what the context leaves.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Same as max_tokens.")
    logprobs: bool | None = Field(None, description="Not supported: refused unless false.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="Not supported: refused unless null.")
    tools: list[dict[str, Any]] | None = Field(None, description="Not supported: refused unless empty.")
    tool_choice: str | dict[str, Any] | None = Field(None, description="Not supported: refused unless null/none.")
    functions: list[dict[str, Any]] | None = Field(None, description="Not supported: refused unless empty.")
    function_call: str | dict[str, Any] | None = Field(None, description="Not supported: refused unless null/none.")
    parallel_tool_calls: bool | None = Field(None, description="Not supported: refused unless null.")
    response_format: ResponseFormat | None = Field(None, description="Only {'type': 'text'}.")

    def refusals(self) -> APIError | None:
        if self.logprobs:
            return unsupported("logprobs", "logprobs are not supported")
        if self.top_logprobs is not None:
            return unsupported("top_logprobs", "top_logprobs are not supported")
        for name in ("tools", "functions"):
            if getattr(self, name):
                return unsupported(name, f"{name} (tool/function calling) are not supported")
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none"):
                return unsupported(name, f"{name} is not supported")
        if self.parallel_tool_calls is not None:
            return unsupported("parallel_tool_calls", "parallel_tool_calls is not supported")
        if self.response_format is not None and self.response_format.type != "text":
            return unsupported("response_format", f"response_format {self.response_format.type!r} is not supported "
                                                  "(only 'text')")
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):
            return unsupported("max_completion_tokens", "max_tokens and max_completion_tokens disagree; send one")
        return self.common_refusals()

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class LoadRequest(_Request):
    """POST /admin/models/{alias}/load: a signed package under a trusted root (§11 steps 1–2)."""

    package: str = Field(min_length=1, max_length=4096, description="Package directory or .tar archive path.")


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


class CompletionChoice(_Response):
    index: int
    text: str
    finish_reason: FinishReasonOut | None
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
