"""The OpenAI-compatible API through the official ``openai`` client against a real server.

Every text is compared with what the engine generates for the same prompt in virtual time
(:mod:`tests.service.reference`): the HTTP layer adds, drops and re-encodes nothing.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from calculet.server.request_parsing import chat_prompt
from calculet.server.schemas import ChatMessage
from tests.service import reference
from tests.service.support import ALIAS, TENANT_KEYS, RunningServer, families_value, iter_json

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.mark.req("R5.2.1", "R3.1")
def test_completion_returns_the_engine_tokens_with_usage(server: RunningServer) -> None:
    expected = reference.for_text([("Calculet NPU", 12)])[0]
    out = server.client("alpha").completions.create(model=ALIAS, prompt="Calculet NPU", max_tokens=12, **GREEDY)
    choice = out.choices[0]
    assert choice.text == expected.text and choice.finish_reason == "length"
    assert out.usage is not None
    prompt = len(expected.prompt)  # the bundled package's own BPE tokenizer (#18)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (prompt, 12, prompt + 12)
    assert out.model == ALIAS and out.id.startswith("cmpl-") and out.object == "text_completion"


@pytest.mark.req("R5.2.1", "R4.7")
def test_streamed_completion_ends_with_done_and_carries_usage(server: RunningServer) -> None:
    expected = reference.for_text([("hello, world", 20)])[0]
    stream = server.client("beta").completions.create(model=ALIAS, prompt="hello, world", max_tokens=20, stream=True,
                                                       stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == expected.text and finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    # the wire format itself: server-sent events, the last one `data: [DONE]`
    body = {"model": ALIAS, "prompt": "hello, world", "max_tokens": 5, "temperature": 0, "stream": True}
    with server.http() as http, http.stream("POST", "/v1/completions", json=body,
                                            headers={"Authorization": f"Bearer {TENANT_KEYS['beta']}"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


@pytest.mark.req("R5.2.1")
def test_chat_completion_plain_and_streamed(server: RunningServer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is a KV lane?"}]
    prompt = chat_prompt(reference.tokenizer(), [ChatMessage.model_validate(m) for m in messages], 10_000)
    expected = reference.generate([(prompt, 16)])[0]
    client = server.client("gamma")
    out = client.chat.completions.create(model=ALIAS, messages=messages,  # type: ignore[arg-type]
                                         max_tokens=16, **GREEDY)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == expected.text
    assert out.choices[0].finish_reason == "length" and out.object == "chat.completion"
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(prompt), 16)

    chunks = list(client.chat.completions.create(model=ALIAS, messages=messages,  # type: ignore[arg-type]
                                                 max_tokens=16, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == expected.text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16


@pytest.mark.req("R7.4.1")
def test_a_stop_string_ends_generation_and_is_not_returned(server: RunningServer) -> None:
    expected = reference.for_text([("stop here", 40)])[0]
    tokens = expected.tokens
    tok = reference.tokenizer()  # the bundled package's BPE (#18): a token that is its own text's only encoding
    index = next(i for i, t in enumerate(tokens) if i >= 1 and tok.decode([t]).strip()
                 and tok.encode(tok.decode([t]), add_bos=False) == [t] and tok.decode([t]) not in tok.decode(tokens[:i]))
    stop = tok.decode([tokens[index]])
    out = server.client("delta").completions.create(model=ALIAS, prompt="stop here", max_tokens=40, stop=[stop],
                                                     **GREEDY)
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == reference.tokenizer().decode(tokens[:index])
    assert out.usage is not None and out.usage.completion_tokens == index + 1


def test_seeded_sampling_is_reproducible_streamed_or_not(server: RunningServer) -> None:
    client = server.client("alpha")
    args = {"model": ALIAS, "prompt": "seeded", "max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 7,
            "extra_body": {"ignore_eos": True}}
    first = client.completions.create(**args).choices[0].text  # type: ignore[call-overload]
    again = client.completions.create(**args).choices[0].text  # type: ignore[call-overload]
    chunks = client.completions.create(stream=True, **args)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert first == again == streamed


@pytest.mark.req("R5.3.1", "R5.3.7", "R17.3.1")
def test_32_concurrent_streams_from_4_tenants_get_the_right_tokens(server: RunningServer) -> None:
    tenants = list(TENANT_KEYS)
    plan = [(f"stream {i}: {'x' * (i % 5)}", 6 + i % 7) for i in range(32)]
    expected = reference.for_text(plan)
    before = server.metrics()

    async def run() -> list[tuple[str, str | None, int | None]]:
        clients = {t: server.async_client(t) for t in tenants}

        async def one(i: int) -> tuple[str, str | None, int | None]:
            prompt, n = plan[i]
            stream = await clients[tenants[i % 4]].completions.create(
                model=ALIAS, prompt=prompt, max_tokens=n, stream=True, stream_options={"include_usage": True},
                **GREEDY)
            text, finish, used = "", None, None
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].text
                    finish = chunk.choices[0].finish_reason or finish
                if chunk.usage is not None:
                    used = chunk.usage.completion_tokens
            return text, finish, used

        try:
            return await asyncio.gather(*(one(i) for i in range(32)))
        finally:
            for client in clients.values():
                await client.close()

    results = asyncio.run(run())
    for (text, finish, used), exp, (_, n) in zip(results, expected, plan):
        assert (text, finish, used) == (exp.text, "length", n)
    after = server.metrics()
    served = {t: families_value(after, "calculet_fairness_service_tokens", tenant=t)
              - families_value(before, "calculet_fairness_service_tokens", tenant=t) for t in tenants}
    assert all(v > 0 for v in served.values()), served
    finished = (families_value(after, "calculet_engine_finished_requests", reason="length")
                - families_value(before, "calculet_engine_finished_requests", reason="length"))
    assert finished == 32
    assert families_value(after, "calculet_batch_compiled_size_lanes") == 1.0, "device batch stays B1 (R1.1)"


@pytest.mark.req("R1.1", "R9.3.9", "R19.12", "R20.7")
def test_nothing_claims_npu_batch_continuous_batching_prompt_cache_fork_or_beam(server: RunningServer) -> None:
    models = server.client("alpha").models.list()
    assert [m.id for m in models.data] == [ALIAS]
    with server.http() as http:
        listing = http.get("/v1/models", headers={"Authorization": f"Bearer {TENANT_KEYS['alpha']}"}).json()
        contract = http.get("/admin/capabilities", headers=server.admin_headers()).json()
        openapi = http.get("/openapi.json").json()
    assert listing["data"][0]["calculet"]["npu_compiled_batch_profiles"] == [1]
    assert "simulated" in listing["data"][0]["calculet"]["evidence"]
    forbidden = ("continuous", "prompt_cache", "prompt cache", "fork", "beam", "batching")
    for document in (listing, contract):
        words = " ".join(iter_json(document)).lower()
        for word in forbidden:
            assert word not in words, f"{word!r} appears in a capability listing"
    assert contract["npu_batch"]["compiled_batch"] == 1 and contract["npu_batch"]["tier"] == "C0"
    for row in contract["capabilities"]:
        assert row["tier"] in ("C0", "C1", "C1/C2", "C2", "C2/C3", "C3", "C4") and row["source"]
        assert not (row["proved"] and (row["simulated"] or row["tier"] != "C0"))
    # the API offers these features only at their neutral value (issue #14: the schema states what is accepted)
    fields = openapi["components"]["schemas"]["CompletionRequest"]["properties"]
    for name in ("n", "best_of", "logprobs", "echo"):
        assert "not supported beyond" in fields[name]["description"].lower()
    assert fields["n"]["anyOf"][0]["maximum"] == 1 and "suffix" not in fields
    chat = openapi["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert "top_logprobs" not in chat and chat["tool_choice"]["anyOf"][0] == {"const": "none", "type": "string"}


@pytest.mark.req("R9.3.9", "R5.2.3")
@pytest.mark.parametrize(("field", "value"), [("n", 2), ("best_of", 3), ("logprobs", 1), ("echo", True),
                                              ("suffix", "tail"), ("logit_bias", {"65": 1.0}),
                                              ("presence_penalty", 0.5), ("frequency_penalty", 1.0)])
def test_unsupported_features_are_refused_naming_the_field(server: RunningServer, field: str, value: object) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client("alpha").completions.create(model=ALIAS, prompt="x", max_tokens=2,
                                                  extra_body={field: value})
    error = caught.value
    assert error.status_code == 400 and error.param == field and error.code == "unsupported_parameter"
    assert field in error.message


@pytest.mark.req("R9.3.9")
@pytest.mark.parametrize(("field", "value"), [("n", 3), ("logprobs", True), ("tools", [{"type": "function"}]),
                                              ("response_format", {"type": "json_object"}), ("top_logprobs", 2)])
def test_unsupported_chat_features_are_refused_naming_the_field(server: RunningServer, field: str,
                                                                value: object) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client("alpha").chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "x"}],
                                                       max_tokens=2, extra_body={field: value})
    assert caught.value.param == field and caught.value.status_code == 400


def test_unknown_fields_and_bad_values_are_400_naming_the_field(server: RunningServer) -> None:
    headers = {"Authorization": f"Bearer {TENANT_KEYS['alpha']}"}
    with server.http() as http:
        unknown = http.post("/v1/completions", headers=headers,
                            json={"model": ALIAS, "prompt": "x", "priority": 9, "weight": 100})
        hot = http.post("/v1/completions", headers=headers, json={"model": ALIAS, "prompt": "x", "temperature": 3})
        tool_role = http.post("/v1/chat/completions", headers=headers,
                              json={"model": ALIAS, "messages": [{"role": "tool", "content": "x"}]})
        not_json = http.post("/v1/completions", headers={**headers, "Content-Type": "application/json"},
                             content=b"{nope")
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] in ("priority", "weight")
    assert hot.status_code == 400 and hot.json()["error"]["param"] == "temperature"
    assert tool_role.status_code == 400 and tool_role.json()["error"]["param"] == "messages.0.role"
    assert not_json.status_code == 400 and set(not_json.json()["error"]) == {"message", "type", "code", "param"}
    for response in (unknown, hot, tool_role, not_json):
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_an_oversized_body_is_refused_before_it_is_read(server: RunningServer) -> None:
    with server.http() as http:
        response = http.post("/v1/completions", content=b"{" + b" " * (9 * 1024 * 1024) + b"}",
                             headers={"Content-Type": "application/json",
                                      "Authorization": f"Bearer {TENANT_KEYS['alpha']}"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


def test_health_endpoints(server: RunningServer) -> None:
    with server.http() as http:
        assert http.get("/health/live").json()["status"] == "live"
        ready = http.get("/health/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_request_ids_are_the_servers_and_a_client_id_is_only_a_correlation_field(server: RunningServer) -> None:
    """Issue #14: a client-chosen X-Request-Id never becomes the id (two tenants could make ids collide); it is
    echoed in its own header and logged as client_request_id."""
    headers = {"Authorization": f"Bearer {TENANT_KEYS['alpha']}", "X-Request-Id": "trace-123"}
    with server.http() as http:
        given = [http.post("/v1/completions", headers=headers, json={"model": ALIAS, "prompt": "x", "max_tokens": 1})
                 for _ in range(2)]
        generated = http.get("/health/live")
        bad = http.get("/health/live", headers={"X-Request-Id": "no spaces allowed"})
    ids = {r.headers["x-request-id"] for r in given}
    assert len(ids) == 2 and "trace-123" not in ids
    assert all(r.headers["x-client-request-id"] == "trace-123" for r in given)
    assert {r.json()["id"] for r in given} == {f"cmpl-{i}" for i in ids}
    assert len(generated.headers["x-request-id"]) == 32 and "x-client-request-id" not in generated.headers
    assert bad.headers["x-request-id"] != "no spaces allowed" and "x-client-request-id" not in bad.headers


def test_httpx_client_close_mid_body_is_harmless(server: RunningServer) -> None:
    """A client reading only the headers of a streamed response and leaving does not break the server."""
    body = {"model": ALIAS, "prompt": "leave", "max_tokens": 3, "stream": True}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body,
                         headers={"Authorization": f"Bearer {TENANT_KEYS['alpha']}"}) as response:
            assert response.status_code == 200
    assert server.service.wait_streams_closed(30)
