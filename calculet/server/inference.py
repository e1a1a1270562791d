"""The OpenAI-compatible inference API: /v1/completions, /v1/chat/completions, /v1/models.

One request's path (§3, §4, §5.2):

1. the API key names the tenant (:mod:`calculet.server.auth`); the body is validated and any
   unsupported feature is refused with 400 naming the field (§9.3, R9.3.9);
2. the prompt is tokenised (the served package's own tokenizer; chat messages through its chat
   template, #18) and checked against the context: prompt, or prompt + max_tokens, beyond
   ``max_seq`` is 400 ``context_length_exceeded`` (§5.2 RejectInvalid, R5.2.3);
3. ``Engine.submit`` answers the §5.2 outcome at once: 400 / 429 (with ``Retry-After``) / 503
   become OpenAI error bodies; Admit and Queue proceed;
4. tokens arrive through a :class:`~calculet.server.timed_stream.TimedStream` (a ``StreamWriter``
   that also records token times for the TTFT / inter-token histograms) — as server-sent events ending with
   ``data: [DONE]`` when ``stream`` is true, as one JSON body otherwise;
5. a client that disconnects cancels its request (§4: cancel is idempotent; a running job still
   drains and its KV is freed when it does).

Chat template: the package's ``tokenizer_config.json`` ``chat_template`` (Jinja2, rendered in a sandbox);
a byte-level package, which has none of its own, gets::

    BOS "<|system|>\\n" content "\\n" ... "<|user|>\\n" content "\\n" "<|assistant|>\\n"

Usage counts: ``prompt_tokens`` is the tokenised prompt (BOS included); ``completion_tokens``
is every token the model generated, including a stop sequence or EOS that ended it (those are
not shown in the text).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from calculet.errors import CalculetError
from calculet.runtime.engine.early_refusal import EarlyRefusal
from calculet.runtime.engine.types import GenerateRequest
from calculet.runtime.request import RequestOutcome
from calculet.runtime.scheduling.plan import Submission
from calculet.runtime.streams.writer import StreamEvent, StreamFinish, call_soon_held
from calculet.server.errors import APIError, admission_error, from_calculet
from calculet.server.edge_answers import new_request_id
from calculet.server.request_parsing import ApiGeneration, prepare_chat, prepare_completion, stop_reason
from calculet.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelDetails,
    ModelList,
    Usage,
)
from calculet.server.service import Service
from calculet.server.sse import Frames, SSEResponse, finish_of, outcome_error
from calculet.server.timed_stream import TimedStream

log = logging.getLogger("calculet.server.inference")

_api_bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey",
                         description="A tenant's API key (its SHA-256 is tenants[].api_key_sha256).")


SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One server-sent event (OpenAPI 3.1: the schema of a text/event-stream describes each event).",
    "required": ["data"],
    "properties": {
        "data": {"type": "string",
                 "description": "A JSON chunk (text_completion or chat.completion.chunk; a last chunk with usage when "
                                "stream_options.include_usage, usage so far in every chunk when "
                                "stream_options.continuous_usage_stats), an error body {\"error\": {...}} if the request "
                                "fails mid-stream, and finally the literal [DONE]."},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}


REQUEST_MODELS = (CompletionRequest, ChatCompletionRequest)
"""Bodies parsed by the routes themselves (off the event loop); :mod:`calculet.server.app` puts their schemas in
the OpenAPI document."""

REFUSALS = {
    "context_length_exceeded": "400: the prompt's tokens, or prompt + max_tokens, exceed the model's context "
                               "(GET /v1/models/{model_id}: calculet.context_length); a byte-level vocabulary makes "
                               "one token per UTF-8 byte of the prompt, plus BOS",
    "over_capacity": "429 with Retry-After: admission budgets are full, or the request could not finish by its deadline",
    "model_unavailable": "503: the model is loading, draining, recovering or unloaded, or the service is shutting down",
    "body_too_large": "413: the body exceeds server.max_body_bytes",
}
"""Why a schema-valid request may still be refused (``x-calculet-refusals`` on each generation operation)."""


CHAT_REFUSALS = {**REFUSALS, "invalid_request": "400: the served model's chat template refuses the conversation "
                                                 "(a role or an order of roles it has no place for)"}


def request_body(model: str, example: dict[str, Any], refusals: dict[str, str]) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses its own body, an example, and the refusals it may still
    answer to schema-valid input."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model}"}, "example": example}}}, "x-calculet-refusals": refusals}


LARGE_BODY = 1024 * 1024
INLINE_BODY = 8 * 1024
"""Bodies up to this size are parsed, validated and tokenised on the event loop itself (issue #13).

Why: a worker-thread hop costs the loop more than the work it moves for a small body — a future, the worker's
wake-up, ``call_soon_threadsafe`` back and the interpreter lock handed over twice — and under a burst of
refusals those hops were a large share of the loop's CPU per request. A body of at most 8 KiB parses in tens of
microseconds (a prompt within it tokenises in well under a millisecond); larger ones still go to a thread
(issue #14: a body of megabytes held the loop for a second). A model check that needs the engine (an alias
other than the served one, or one the admin API unloaded) sends even a small body to the thread."""


class _AskEngine(Exception):
    """The model check needs a round trip to the engine: not on the event loop."""


class _OnLoop:
    """The service as :func:`prepare_completion` / :func:`prepare_chat` see it on the event loop: the model check
    answers only what it can without the engine (:meth:`Service.model_checked_at_once`); one that needs the engine
    raises :class:`_AskEngine`."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self.tokenizer = service.tokenizer

    @property
    def max_seq(self) -> int:
        return self._service.max_seq

    def check_model(self, model: str) -> None:
        if not self._service.model_checked_at_once(model):
            raise _AskEngine
        self._service.check_model(model)


def on_loop(service: Service) -> _OnLoop:
    """``service`` as ``prepare`` sees it on the event loop (:class:`_OnLoop`)."""
    return _OnLoop(service)


async def _prepare(service: Service, request: Request,
                   prepare: Callable[[Service, bytes | bytearray], ApiGeneration]) -> ApiGeneration:
    """Parse, validate and tokenise the body: a small one on the event loop (:data:`INLINE_BODY`), a larger one on
    a worker thread, so a large body never holds the loop. Bodies over :data:`LARGE_BODY` bytes are parsed one at
    a time: parsing holds the interpreter lock (about 35 ms for 7.5 MB here), and one at a time leaves the event
    loop its turn between them. A body the refusal lane (:mod:`calculet.server.refusal_lane`) prepared already
    (``prepared`` in the scope's state: the same bytes, on this loop, just before) is not prepared again."""
    state = request.scope.get("state", {})
    raw = state.get("body")
    if raw is None:
        raw = await request.body()
    prepared = state.get("prepared")
    if prepared is not None and prepared[0] == raw:
        return prepared[1]  # type: ignore[no-any-return]
    if len(raw) <= INLINE_BODY:
        try:
            return prepare(_OnLoop(service), raw)  # type: ignore[arg-type]
        except _AskEngine:
            pass
    limiter = service.large_body_limiter if len(raw) > LARGE_BODY else service.limiter
    return await anyio.to_thread.run_sync(prepare, service, raw, limiter=limiter)


async def _submit(service: Service, engine_request: GenerateRequest, stream: TimedStream) -> Submission:
    """``engine.submit`` awaited on the event loop: the actor calls back with the §5.2 outcome and wakes the loop
    (``call_soon_threadsafe``), no worker thread waits for it (issue #13). After ``submit_timeout_s`` without an
    answer, ``TimeoutError``; a request admitted after its caller stopped waiting is cancelled."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Submission] = loop.create_future()

    def settle(submission: Submission | None, error: BaseException | None) -> None:
        service.early_admission.answered()  # its snapshot is published: held requests decide again
        if future.done():  # timed out (or cancelled) meanwhile: nobody reads the answer
            if submission is not None and not submission.outcome.rejected:
                _cancel(service, submission.request_id)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(submission)  # type: ignore[arg-type]

    def done(submission: Submission | None, error: BaseException | None) -> None:  # on the actor thread
        if submission is not None and not submission.outcome.rejected and service.early_admission.unawaited():
            # admitted, and no other request waits on the engine's answers: with the first tokens' wake-up, one
            # hand-over to this loop instead of two (issue #20); a refusal, or a burst's answer, goes at once (#13)
            call_soon_held(loop, partial(settle, submission, None))
            return
        try:
            loop.call_soon_threadsafe(settle, submission, error)
        except RuntimeError:  # the loop has closed (the process is stopping): nobody waits
            pass

    service.engine.submit_then(engine_request, stream, done)
    service.early_admission.sent()  # answered() in settle, which runs on this loop: never before this line
    timer = loop.call_later(service.submit_timeout_s, _expire, future)  # not wait_for: no second future, no
    try:  # callbacks between them, once per request (#20)
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Submission]) -> None:
    if not future.done():
        future.set_exception(TimeoutError("the engine did not answer the submit in time"))


GENERATION_ROUTES: dict[str, tuple[Callable[[Service, bytes | bytearray], ApiGeneration], str]] = {
    "/v1/completions": (prepare_completion, "prompt"),
    "/v1/chat/completions": (prepare_chat, "messages"),
}
"""The generation routes: how each parses its body, and the field its prompt is in (for a 400's ``param``)."""


async def generate_route(service: Service, request: Request, tenant: str, path: str) -> Any:
    """One generation request of ``tenant`` on ``path`` (a key of :data:`GENERATION_ROUTES`), from its body to its
    answer: a response, a response model, or an :class:`APIError` raised. The FastAPI routes and the pure-ASGI
    front (:mod:`calculet.server.front`) both answer through it."""
    prepare, prompt_param = GENERATION_ROUTES[path]
    gen = await _prepare(service, request, prepare)
    return await _generate(service, request, tenant, gen, prompt_param=prompt_param)


def inference_router(service: Service) -> APIRouter:
    """The /v1 routes of ``service``."""
    router = APIRouter(tags=["inference"])
    errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse}
                                               for code in (400, 401, 404, 408, 413, 429, 503)}
    stream_doc = {"content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
                  "description": "JSON body, or server-sent events when stream is true (ending with data: [DONE])."}

    async def tenant_of(request: Request,
                        credentials: HTTPAuthorizationCredentials | None = Depends(_api_bearer)) -> str:
        # async: a digest and a comparison per tenant, answered on the loop (a sync dependency is a thread hop)
        tenant: str = service.tenants.resolve(f"Bearer {credentials.credentials}" if credentials else None)
        request.state.tenant = tenant
        return tenant

    @router.get("/v1/models", response_model=ModelList, responses={401: {"model": ErrorResponse}},
                summary="Models this service serves")
    def list_models(tenant: str = Depends(tenant_of)) -> ModelList:
        return _model_list(service)

    @router.get("/v1/models/{model_id}", response_model=ModelCard,
                responses={401: {"model": ErrorResponse}, 404: {"model": ErrorResponse}}, summary="One served model")
    def get_model(model_id: str, tenant: str = Depends(tenant_of)) -> ModelCard:
        for card in _model_list(service).data:
            if card.id == model_id:
                return card
        raise APIError(404, f"the model {model_id!r} does not exist; GET /v1/models lists what is served",
                       code="model_not_found", param="model")

    @router.post("/v1/completions", response_model=CompletionResponse, responses={**errors, 200: stream_doc},
                 openapi_extra=request_body("CompletionRequest", {"model": service.alias, "prompt": "Hello",
                                                                  "max_tokens": 8}, REFUSALS),
                 summary="Text completion (OpenAI-compatible)")
    async def completions(request: Request, tenant: str = Depends(tenant_of)) -> Any:
        return await generate_route(service, request, tenant, "/v1/completions")

    @router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses={**errors, 200: stream_doc},
                 openapi_extra=request_body("ChatCompletionRequest", {
                     "model": service.alias, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
                     CHAT_REFUSALS), summary="Chat completion (OpenAI-compatible)")
    async def chat_completions(request: Request, tenant: str = Depends(tenant_of)) -> Any:
        return await generate_route(service, request, tenant, "/v1/chat/completions")

    return router


def _model_list(service: Service) -> ModelList:
    """The active generations as OpenAI model cards, with the honest device facts (R1.1, R20.7)."""
    info = service.info
    cards = []
    for entry in service.admin.status():
        if not entry.get("active", True):
            continue
        cards.append(ModelCard(
            id=str(entry["alias"]), created=service.created, owned_by="calculet",
            calculet=ModelDetails(generation=int(entry.get("generation", 0)), state=str(entry.get("state")),
                                  calbin=entry.get("calbin"), context_length=entry.get("max_seq", info.max_seq),
                                  npu_compiled_batch_profiles=list(entry.get("profiles") or info.profiles),
                                  evidence=service.device_label)))
    return ModelList(data=cards)


async def _generate(service: Service, request: Request, tenant: str, gen: ApiGeneration, *,
                    prompt_param: str) -> Any:
    max_seq = service.info.max_seq
    n = len(gen.prompt)
    if n > max_seq:
        raise APIError(400, f"the prompt has {n} tokens; the context is {max_seq}", code="context_length_exceeded",
                       param=prompt_param)
    if n + gen.max_tokens > max_seq:
        raise APIError(400, f"prompt {n} + max_tokens {gen.max_tokens} tokens exceed the context of {max_seq}",
                       code="context_length_exceeded", param="max_tokens")
    if not service.accepting:
        raise APIError(503, "the service is shutting down", code="model_unavailable")
    await _refuse_early(service, request, tenant, gen)
    state = request.scope.setdefault("state", {})  # ``request.state``'s dict, read without its wrapper (#20)
    http_id = state.get("request_id") or new_request_id()
    stream = service.open_stream(tenant=tenant, stop=gen.sampling.stop, stop_text=gen.sampling.stop_text)
    engine_request = GenerateRequest(gen.prompt, gen.max_tokens, tenant=tenant, sampling=gen.sampling)
    lane_sent(service, state)  # sent now (_submit counts it in flight, with no wait between)
    try:
        submission = await _submit(service, engine_request, stream)
    except CalculetError as exc:
        stream.release()
        raise from_calculet(exc) from None
    except TimeoutError:
        stream.release()
        raise APIError(503, "the engine did not answer in time", code="model_unavailable") from None
    outcome = submission.outcome
    if outcome.rejected:
        raise _engine_refusal(service, request, submission, gen, tenant)
    fields = {"engine_request_id": submission.request_id, "generation": service.info.generation, "model": gen.model}
    if log.isEnabledFor(logging.DEBUG):
        log.debug("request accepted", extra={"request_id": http_id, "tenant": tenant, **fields, "prompt_tokens": n,
                                             "decision": outcome.decision.value, "max_tokens": gen.max_tokens,
                                             "stream": gen.stream})
    response_id = ("cmpl-" if gen.kind == "completion" else "chatcmpl-") + http_id
    created = int(time.time())
    fingerprint = f"calculet-g{service.info.generation}"
    rid = submission.request_id
    if gen.stream:
        return _sse(service, stream, rid, gen, response_id, created, fingerprint,
                    lambda gone: _note_end(state, fields, stream, gone))
    result_text, outcome_final, disconnected = await _collect(service, request, stream, rid)
    _note_end(state, fields, stream, disconnected)
    if outcome_final.state != "completed":
        raise outcome_error(outcome_final, disconnected=disconnected)
    usage = Usage(prompt_tokens=n, completion_tokens=outcome_final.generated_tokens,
                  total_tokens=n + outcome_final.generated_tokens)
    finish = finish_of(StreamFinish.of(outcome_final.finish_reason))
    why = _stop_reason(stream)
    if gen.kind == "completion":
        return CompletionResponse(id=response_id, created=created, model=gen.model, system_fingerprint=fingerprint,
                                  choices=[CompletionChoice(index=0, text=result_text, finish_reason=finish,
                                                            stop_reason=why)], usage=usage)
    return ChatCompletionResponse(id=response_id, created=created, model=gen.model, system_fingerprint=fingerprint,
                                  choices=[ChatChoice(index=0, message=AssistantMessage(content=result_text),
                                                      finish_reason=finish, stop_reason=why)], usage=usage)


def _engine_refusal(service: Service, request: Request, submission: Submission, gen: ApiGeneration,
                    tenant: str) -> APIError:
    """The engine's §5.2 refusal as the client gets it. One log line for it: the request's own (RequestContext
    writes it with status, code and reason; these fields join it), not a second one here — under a burst each
    line costs the event loop (#13). A no-prospect 429's retry slot is placed among the front's
    (:meth:`~calculet.runtime.engine.admission_snapshot.EarlyAdmission.engine_refused`)."""
    outcome = submission.outcome
    request.scope["state"]["log_fields"] = {"engine_request_id": submission.request_id,
                                            "generation": service.info.generation, "model": gen.model}
    retry_after_s = outcome.retry_after_s
    engine = service.engine
    if outcome.http_status == 429 and retry_after_s is not None and hasattr(type(engine), "admission_snapshot"):
        retry_after_s = service.early_admission.engine_refused(
            lambda: engine.admission_snapshot, prompt_tokens=len(gen.prompt), max_new_tokens=gen.max_tokens,
            tenant=tenant, now=engine.clock.now(), retry_after_s=retry_after_s)
    return admission_error(outcome.http_status or 400, outcome.reason, retry_after_s=retry_after_s)


HOLD_ROUNDS = 3
"""How many waits for the engine's next answer (each at most :data:`~calculet.server.service.HOLD_S`) a held
request makes before it goes to the engine anyway (:meth:`EarlyAdmission.should_hold`)."""


async def _refuse_early(service: Service, request: Request, tenant: str, gen: ApiGeneration) -> None:
    """The 429 of a request the engine's admission snapshot shows cannot finish by its deadline, answered here on
    the event loop without a round trip to the actor (issue #13; the soundness argument is
    :mod:`calculet.runtime.engine.admission_snapshot`'s). Anything the snapshot cannot refuse goes on to the
    engine, which decides; an engine without a snapshot (a test double) is always asked."""
    engine = service.engine
    if not hasattr(type(engine), "admission_snapshot") or request.scope["state"].get("early_decided"):
        return  # no snapshot ever, or the refusal lane decided from it already (and counted its forward)
    early = service.early_admission
    if service.config.batch.deadline_order == "on_time":  # no snapshot ever comes under another order
        for _ in range(HOLD_ROUNDS):
            if not early.should_hold(engine.admission_snapshot):
                break
            await wait_next_answer(service)
    refusal = early.decide(lambda: engine.admission_snapshot, prompt_tokens=len(gen.prompt),
                           max_new_tokens=gen.max_tokens, tenant=tenant, now=engine.clock.now())
    if not isinstance(refusal, EarlyRefusal):
        return
    request.scope["state"]["log_fields"] = {"refused_by": "front", "generation": service.info.generation,
                                            "model": gen.model}
    raise admission_error(429, refusal.reason, retry_after_s=refusal.retry_after_s)


def lane_sent(service: Service, state: dict[str, Any]) -> None:
    """A request the refusal lane forwarded is no longer on its way to the engine (sent, or ended before):
    :attr:`EarlyAdmission.unsent` counts it no more. Called at the submit and at the request's end (idempotent)."""
    if state.pop("unsent", False):
        service.early_admission.unsent -= 1


async def wait_next_answer(service: Service) -> None:
    """Wait for the engine's next answer (or the hold's timer: :class:`~calculet.server.service.NextAnswer`), one wait
    shared by every held request; a cancellation that is not the caller's own (another held request was cancelled,
    and with it the shared future) ends the wait, not the caller."""
    try:
        await service.next_answer.wait()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this request was cancelled


def _stop_reason(stream: TimedStream) -> str | None:
    """vLLM's ``stop_reason`` of a closed stream: the stop string that ended it, else None."""
    result = stream.result(0)
    return stop_reason(stream.stop_matched, result.finish_reason is StreamFinish.STOP)


def _cancel(service: Service, request_id: int) -> None:
    """Cancel without waiting (safe from a cancelled coroutine): the reply is not needed."""
    def run() -> None:
        try:
            service.engine.cancel(request_id, timeout=service.submit_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the engine may have stopped meanwhile; nothing to undo
            log.debug("cancel not delivered", extra={"engine_request_id": request_id, "detail": str(exc)})
    try:
        asyncio.get_running_loop().run_in_executor(None, run)
    except RuntimeError:
        run()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(service: Service, request: Request, stream: TimedStream,
                   rid: int) -> tuple[str, RequestOutcome, bool]:
    """Wait for the close; a client disconnect meanwhile cancels the request (§4)."""
    async def consume() -> None:
        async for _event in stream.aevents():
            pass

    done_task = asyncio.ensure_future(consume())
    watch = asyncio.ensure_future(_wait_disconnect(request))
    disconnected = False
    try:
        await asyncio.wait({done_task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not done_task.done():
            disconnected = True
            service.metrics.of(stream.tenant).disconnects.inc()
            _cancel(service, rid)
            await done_task
    finally:
        watch.cancel()
        if not done_task.done():
            done_task.cancel()
            _cancel(service, rid)
    result = stream.result(0)
    return result.text, result.outcome, disconnected


def _sse(service: Service, stream: TimedStream, rid: int, gen: ApiGeneration, response_id: str, created: int,
         fingerprint: str, end: Callable[[bool], None]) -> SSEResponse:
    """The server-sent events of ``stream`` (:mod:`calculet.server.sse`); if the client goes away first, the request
    is cancelled (§4)."""
    chat = gen.kind == "chat"
    frames = Frames(response_id=response_id, created=created, model=gen.model, fingerprint=fingerprint, chat=chat,
                    prompt_tokens=len(gen.prompt), include_usage=gen.include_usage,
                    continuous_usage=gen.continuous_usage)

    def why(event: StreamEvent) -> str | None:
        return stop_reason(stream.stop_matched, event.finish_reason is StreamFinish.STOP)

    def abandon() -> None:
        service.metrics.of(stream.tenant).disconnects.inc()
        _cancel(service, rid)

    return SSEResponse(stream, frames, first=frames.chunk("", None, role=True) if chat else None, why=why,
                       abandon=abandon, end=end)


def _note_end(state: dict[str, Any], fields: dict[str, Any], stream: TimedStream, disconnected: bool) -> None:
    """How the request ended, for its one log line (:class:`~calculet.server.app.RequestContext` writes it, with
    these fields, at the response's last message, or at its end when the client went away first): the engine's
    id, the generation and model, the finish reason (None: abandoned before the engine closed it), the tokens
    generated, the time to the first token, and whether the client went away. One line per request, not a
    "request finished" line beside it: each line is written on the event loop (#13, #20)."""
    outcome = stream.final
    times = stream.token_times
    state["log_fields"] = {**state.get("log_fields", {}), **fields,
                           "finish_reason": outcome.finish_reason.name.lower() if outcome else None,
                           "completion_tokens": outcome.generated_tokens if outcome else len(times),
                           "ttft_s": round(times[0] - stream.arrival, 6) if times else None,
                           "client_disconnected": disconnected}
