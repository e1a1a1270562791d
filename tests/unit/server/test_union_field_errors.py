"""A field that takes text or a list says so when it gets neither (R5.2.3: a 400 that names the field and what
it takes). Found following the README (session 17): ``"content": 5`` answered "Input should be a valid array",
though a string is the usual form — pydantic's discriminated union reported the member its tag fell back to. The
mutant this catches: a discriminator that falls back to a member's tag for a value of neither kind (checked: the
message names only a list, or only a string)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from calculet.server.request_parsing import from_validation
from calculet.server.schemas import ChatCompletionRequest, CompletionRequest

COMPLETION = {"model": "tiny", "prompt": "hi"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def _message(model: type, body: dict[str, Any]) -> tuple[str | None, str]:
    with pytest.raises(ValidationError) as raised:
        model.model_validate(body)
    error = from_validation(raised.value.errors()).body()["error"]
    return error["param"], error["message"]


@pytest.mark.req("R5.2.3")
@pytest.mark.parametrize(("model", "body", "param", "kinds"), [
    (CompletionRequest, {**COMPLETION, "prompt": 5}, "prompt", ("a string", "a list of token ids")),
    (CompletionRequest, {**COMPLETION, "prompt": {"text": "hi"}}, "prompt", ("a string", "a list of token ids")),
    (CompletionRequest, {**COMPLETION, "stop": 5}, "stop", ("a string", "a list of strings")),
    (ChatCompletionRequest, {**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages.0.content",
     ("a string", "a list of text parts")),
    (ChatCompletionRequest, {**CHAT, "messages": [{"role": "user", "content": {"type": "text"}}]},
     "messages.0.content", ("a string", "a list of text parts")),
])
def test_a_value_of_neither_kind_is_told_both(model: type, body: dict[str, Any], param: str,
                                              kinds: tuple[str, ...]) -> None:
    where, message = _message(model, body)
    assert where == param
    assert all(kind in message for kind in kinds), message


@pytest.mark.req("R5.2.3")
def test_a_list_still_names_its_element() -> None:
    """The element the client wrote stays the one named (the union's member is still chosen by shape)."""
    assert _message(CompletionRequest, {**COMPLETION, "stop": [5]})[0] == "stop.0"
    assert _message(CompletionRequest, {**COMPLETION, "prompt": [1, "a"]})[0] == "prompt.1"
    where, _ = _message(ChatCompletionRequest, {**CHAT, "messages": [{"role": "user", "content": [{"type": "x"}]}]})
    assert where is not None and where.startswith("messages.0.content.0.")
