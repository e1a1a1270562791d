"""Each error code produced by a real request (§5.2), and a client disconnect that cancels (§4).

The paced server runs 5 ms decode steps with one active sequence and one waiting request at
most, so a long stream is still running while the test acts on it. Nothing here sleeps: every
wait is for an event (a chunk read from the socket, a stream closed inside the service).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
import socket

import httpx
import openai
import pytest

from calculet.server.model_admin import ManagedModelAdmin
from tests.service import reference
from tests.service.support import ADMIN_TOKEN, ALIAS, TENANT_KEYS, RunningServer, families_value

LONG = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def _kv_is_free(server: RunningServer) -> dict[str, float]:
    families = server.metrics()
    lanes = families_value(families, "calculet_kv_lanes")
    states = {s.labels["state"]: s.value for s in families["calculet_kv_sequences"]}
    assert states["free"] == lanes and sum(states.values()) == lanes, states
    assert families_value(families, "calculet_kv_reserved_tokens") == 0
    assert families_value(families, "calculet_kv_used_tokens") == 0
    assert families_value(families, "calculet_admission_active_sequences") == 0
    assert families_value(families, "calculet_executor_sequences_bound") == 0
    return {"cancelled": families_value(families, "calculet_engine_finished_requests", reason="cancelled")}


@pytest.mark.req("R5.2.3", "R5.1.4")
def test_400_prompt_or_prompt_plus_max_tokens_beyond_the_context(server: RunningServer) -> None:
    client = server.client("alpha")
    short = len(reference.tokenizer().encode("short"))  # BOS + the bundled package's BPE tokens (#18)
    with pytest.raises(openai.BadRequestError) as long_prompt:
        client.completions.create(model=ALIAS, prompt="y" * 300, max_tokens=1)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(model=ALIAS, prompt="short", max_tokens=257 - short)
    with pytest.raises(openai.BadRequestError) as token_ids:
        client.completions.create(model=ALIAS, prompt=[256, 70000], max_tokens=1)
    assert long_prompt.value.code == "context_length_exceeded" and long_prompt.value.param == "prompt"
    assert too_many.value.code == "context_length_exceeded" and too_many.value.param == "max_tokens"
    assert "256" in too_many.value.message
    assert token_ids.value.param == "prompt"
    # exactly at the context is accepted: the prompt's tokens + the rest of 256
    ok = client.completions.create(model=ALIAS, prompt="short", max_tokens=256 - short, **LONG)
    assert ok.usage is not None and ok.usage.total_tokens == 256


@pytest.mark.req("R5.3.7")
def test_401_unknown_or_missing_api_key(server: RunningServer) -> None:
    with pytest.raises(openai.AuthenticationError) as unknown:
        server.client(api_key="sk-not-a-tenant").completions.create(model=ALIAS, prompt="x", max_tokens=1)
    assert unknown.value.status_code == 401 and unknown.value.code == "invalid_api_key"
    with server.http() as http:
        missing = http.post("/v1/completions", json={"model": ALIAS, "prompt": "x", "max_tokens": 1})
        models = http.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    assert models.status_code == 401


def test_404_unknown_model_and_route(server: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        server.client("alpha").completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    with server.http() as http:
        route = http.get("/v1/nothing-here")
    assert route.status_code == 404 and route.json()["error"]["code"] == "not_found"


@pytest.mark.req("R5.2.4", "R5.2.2", "R4.3", "R4.5")
def test_429_when_the_waiting_queue_is_full_with_retry_after(paced_server: RunningServer) -> None:
    """One active sequence and one waiting request fill the budget; the third request gets 429."""
    server = paced_server
    client = server.client("alpha")
    running = client.completions.create(model=ALIAS, prompt="first", max_tokens=200, stream=True, **LONG)
    next(iter(running))  # the first request is admitted and generating
    waiting = server.client("beta").completions.create(model=ALIAS, prompt="second", max_tokens=200, stream=True,
                                                        **LONG)  # response headers: queued (§5.2 Queue)
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            server.client("gamma").completions.create(model=ALIAS, prompt="third", max_tokens=5)
        error = caught.value
        assert error.status_code == 429 and error.code == "over_capacity"
        assert error.response.headers["Retry-After"] == "1"
        assert "waiting" in error.message
        families = server.metrics()
        assert families_value(families, "calculet_admission_decisions", decision="reject_capacity") >= 1
        assert families_value(families, "calculet_admission_waiting_requests") == 1
    finally:
        running.close()
        waiting.close()
    assert server.service.wait_streams_closed(30)
    _kv_is_free(server)


@pytest.mark.req("R4.3", "R4.4", "R4.5", "R16.4")
def test_a_stream_closed_mid_way_is_cancelled_and_its_kv_freed(paced_server: RunningServer) -> None:
    server = paced_server
    before = _kv_is_free(server)
    stream = server.client("delta").completions.create(model=ALIAS, prompt="cancel me", max_tokens=200,
                                                        stream=True, **LONG)
    received = 0
    for chunk in stream:
        received += len(chunk.choices[0].text) if chunk.choices else 0
        if received >= 3:
            break
    families = server.metrics()
    assert families_value(families, "calculet_kv_sequences", state="free") < families_value(families,
                                                                                             "calculet_kv_lanes")
    stream.close()  # the client goes away mid-stream
    assert server.service.wait_streams_closed(30)
    after = _kv_is_free(server)
    assert after["cancelled"] == before["cancelled"] + 1
    families = server.metrics()
    assert families_value(families, "calculet_http_client_disconnects", tenant="delta") >= 1
    assert families_value(families, "calculet_engine_live_requests") == 0


@pytest.mark.req("R4.3", "R4.5")
def test_a_non_streamed_request_whose_client_disconnects_is_cancelled(paced_server: RunningServer) -> None:
    server = paced_server
    before = _kv_is_free(server)
    body = json.dumps({"model": ALIAS, "prompt": "abandon", "max_tokens": 200, "temperature": 0,
                       "ignore_eos": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {TENANT_KEYS['alpha']}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + body)
        assert server.service.wait_streams(lambda n: n == 1, 30), "the request never reached the engine"
    assert server.service.wait_streams_closed(30)
    after = _kv_is_free(server)
    assert after["cancelled"] == before["cancelled"] + 1


@pytest.mark.req("R5.2.5", "R12.2", "R12.4")
def test_503_after_drain_and_not_ready(fresh_server: RunningServer) -> None:
    server = fresh_server
    client = server.client("alpha")
    assert client.completions.create(model=ALIAS, prompt="before", max_tokens=2).usage is not None
    with server.http() as http:
        drained = http.post(f"/admin/models/{ALIAS}/drain", headers=server.admin_headers())
        assert drained.status_code == 200 and drained.json()["state"] in ("draining", "unloaded")
        assert drained.json()["report"]["kind"] == "drain"
        admin = server.service.admin
        assert isinstance(admin, ManagedModelAdmin) and admin.wait(ALIAS, 30)
        models = http.get("/admin/models", headers=server.admin_headers()).json()["data"]
        ready = http.get("/health/ready")
    assert models[0]["state"] == "unloaded" and "drain" in models[0]["durations_s"]
    assert not models[0]["active"] and server.service.lifecycle.state == "running"  # the process stays up
    assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
    with pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(model=ALIAS, prompt="after", max_tokens=2)
    assert caught.value.status_code == 503 and caught.value.code == "model_unavailable"
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       stream=True)


@pytest.mark.req("R5.2.5", "R12.2")
def test_503_while_shutting_down_and_accepted_streams_still_finish(fresh_server: RunningServer) -> None:
    server = fresh_server
    running = server.client("beta").completions.create(model=ALIAS, prompt="drain me", max_tokens=60,
                                                        stream=True, stream_options={"include_usage": True}, **LONG)
    chunks = iter(running)
    next(chunks)
    server.service.begin_shutdown()  # what SIGTERM does
    with pytest.raises(openai.InternalServerError) as caught:
        server.client("alpha").completions.create(model=ALIAS, prompt="late", max_tokens=2)
    assert caught.value.status_code == 503
    rest = list(chunks)
    assert rest[-1].usage is not None and rest[-1].usage.completion_tokens == 60, "the accepted stream completed"
    assert server.service.lifecycle.wait_stopped(30)


def test_admin_token_is_required(server: RunningServer, paced_server: RunningServer) -> None:
    with server.http() as http:
        missing = http.get("/admin/models")
        wrong = http.get("/admin/models", headers={"Authorization": "Bearer nope"})
        tenant_key = http.get("/admin/models", headers={"Authorization": f"Bearer {TENANT_KEYS['alpha']}"})
        right = http.get("/admin/models", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert (missing.status_code, wrong.status_code, tenant_key.status_code, right.status_code) == (401, 401, 401, 200)
    with paced_server.http() as http:
        disabled = http.get("/admin/models", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert disabled.status_code == 403 and disabled.json()["error"]["code"] == "admin_disabled"


@pytest.mark.req("R12.2")
def test_admin_state_conflicts_are_409_and_concurrent_drains_get_one_answer_each(fresh_server: RunningServer) -> None:
    """Issue #14: two concurrent drains used to answer 200 twice (one with generation 0); draining or unloading
    what is already unloaded was 503. Now the begin of an unload is serialised: one caller drains, every other
    one gets 409 naming the state."""
    server = fresh_server
    streaming = server.client("alpha").completions.create(model=ALIAS, prompt="hold", max_tokens=60, stream=True,
                                                          extra_body={"ignore_eos": True})
    next(iter(streaming))  # a stream in flight: the drain has something to wait for

    def drain() -> httpx.Response:
        with server.http() as http:
            return http.post(f"/admin/models/{ALIAS}/drain", headers=server.admin_headers())

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: drain(), range(2)))
    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    won = next(a for a in answers if a.status_code == 200).json()
    lost = next(a for a in answers if a.status_code == 409).json()["error"]
    assert won["generation"] == 1 and lost["code"] == "conflict" and lost["param"] == "alias"
    assert "already" in lost["message"]
    list(streaming)  # the accepted stream runs to its end
    admin = server.service.admin
    assert isinstance(admin, ManagedModelAdmin) and admin.wait(ALIAS, 30)
    with server.http() as http:
        again = [http.post(f"/admin/models/{ALIAS}/{op}", headers=server.admin_headers()) for op in ("drain", "unload")]
        ready = http.get("/health/ready")
    for response in again:
        assert response.status_code == 409 and "already unloaded" in response.json()["error"]["message"]
    assert ready.status_code == 503
