"""Every wire the gateway serves — Chat Completions, the Responses API, legacy Completions, the
Anthropic Messages API — through the official SDKs, in-process and over HTTP: the same
observation as the chat twin, token ids riding along, streaming, tools, errors in each wire's shape."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from agentgym_lightning import Completion
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.episode import Episode
from agentgym_lightning.gateway import Gateway, get_gateway
from agentgym_lightning.gateway.openai_wire import assistant_message
from agentgym_lightning.gateway.wires import base as wires_base
from agentgym_lightning.gateway.wires.anthropic_messages import content_blocks, messages_to_chat
from agentgym_lightning.gateway.wires.responses import (
    ResponsesWire,
    input_to_messages,
    output_items,
    tools_from_chat,
    tools_to_chat,
)
from agentgym_lightning.llm import ChatRequest, GatewayError
from agentgym_lightning.trajectory import Step

anthropic = pytest.importorskip("anthropic", reason="the [anthropic] extra is not installed")

TRANSPORTS = ["inproc", "http"]
NO_REWARD = lambda task, result: 0.0  # noqa: E731 - what these agents return is checked instead
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "add", "description": "add one", "parameters": SCHEMA}}]
# The policy's answers, the same for every wire: a tool call with text, then plain text.
CALL = Completion(
    text="Let me add.",
    tool_calls=[{"id": "call_1", "name": "add", "arguments": '{"a":2}'}],  # no space: not json.dumps's
    prompt_token_ids=[1, 2, 3],
    completion_token_ids=[4, 5],
    logprobs=[-0.5, -0.25],
)
FINAL = Completion(text="3", prompt_token_ids=[1, 2, 3, 4, 5, 6], completion_token_ids=[7], logprobs=[-0.1])


def chat_twin(task, ctx):
    client = ctx.openai_client()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": task}]
    r = client.chat.completions.create(model=ctx.model, messages=messages, tools=CHAT_TOOLS)
    call = r.choices[0].message.tool_calls[0]
    messages += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "3"},
    ]
    r = client.chat.completions.create(model=ctx.model, messages=messages, tools=CHAT_TOOLS, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in r if c.choices)


def responses_agent(task, ctx):
    client = (
        openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
        if ctx.task == "http"
        else ctx.openai_client()
    )
    tools = [{"type": "function", "name": "add", "description": "add one", "parameters": SCHEMA}]
    r = client.responses.create(
        model=ctx.model, instructions="be brief", input=task, tools=tools, include=["message.output_text.logprobs"]
    )
    call = next(item for item in r.output if item.type == "function_call")
    seen = (
        r.output_text,
        r.usage.input_tokens,
        r.usage.output_tokens,
        r.model_extra["token_ids"],
        r.output[0].content[0].logprobs[0].logprob,
    )
    stream = client.responses.create(
        model=ctx.model,
        instructions="be brief",
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "3"}],
        tools=tools,
        stream=True,
    )
    events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert [events[0].type, events[-1].type] == ["response.created", "response.completed"]
    assert events[-1].response.output_text == text
    return text, seen


def anthropic_agent(task, ctx):
    client = (
        anthropic.Anthropic(base_url=ctx.anthropic_base_url, api_key=ctx.api_key)
        if ctx.task == "http"
        else ctx.anthropic_client()
    )
    tools = [{"name": "add", "description": "add one", "input_schema": SCHEMA}]
    messages = [{"role": "user", "content": task}]
    r = client.messages.create(model=ctx.model, system="be brief", max_tokens=64, messages=messages, tools=tools)
    assert r.stop_reason == "tool_use" and r.usage.input_tokens == 3
    use = next(b for b in r.content if b.type == "tool_use")
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "3"}]},
    ]
    with client.messages.stream(model=ctx.model, system="be brief", max_tokens=64, messages=messages, tools=tools) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.stop_reason == "end_turn" and final.content[0].text == text
    return text, use.input


def run(agent, task):
    """The observations (requests) the policy sees, the steps' wires, and the agent's result."""
    env = AgentEnv(agent, [task], NO_REWARD, transport="http" if task == "http" else "inproc")
    obs, info = env.reset(seed=0)
    assert "error" not in info, info.get("error")
    first = obs.request
    obs, *_ = env.step(CALL)
    second = obs.request
    *_, term, _, info = env.step(FINAL)
    assert term and info["status"] == "succeeded", info.get("error")
    return [first, second], [s.request.wire for s in info["trajectory"].steps], info["trajectory"].result


def same_observation(a: ChatRequest, b: ChatRequest) -> None:
    assert a.messages == b.messages
    assert a.tools == b.tools


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_responses_api_agent_sees_what_its_chat_twin_sees(transport):
    twin, _, _ = run(chat_twin, transport)
    seen, wires, (text, first) = run(responses_agent, transport)
    for ours, theirs in zip(seen, twin):
        same_observation(ours, theirs)
    assert wires == ["responses", "responses"]
    assert seen[1].stream and seen[0].sampling.logprobs
    assert text == "3" and first == ("Let me add.", 3, 2, [4, 5], -0.5)


def resending_agent(task, ctx):
    """A Responses agent that keeps its own history and re-sends its previous output items as
    ``item.model_dump()`` gives them (mini-swe-agent's ``LitellmResponseModel``), with no
    ``previous_response_id``; its first call passes ``None`` for the optional arguments it does not
    use, as LlamaIndex's ``OpenAIResponses`` does."""
    client = (
        openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
        if ctx.task == "http"
        else ctx.openai_client().with_options(max_retries=0)
    )
    tools = [{"type": "function", "name": "add", "description": "add one", "parameters": SCHEMA}]
    history: list = [{"role": "user", "content": task}]
    nulls = dict(user=None, include=None, max_output_tokens=None, metadata=None, previous_response_id=None, store=None,
                 temperature=None, top_p=None, truncation=None, reasoning=None, parallel_tool_calls=None)
    r = client.responses.create(model=ctx.model, instructions="be brief", input=history, tools=tools, **nulls)
    dumped = [item.model_dump() for item in r.output]  # the SDK's own objects, every field of them
    history += dumped + [{"type": "function_call_output", "call_id": r.output[1].call_id, "output": "3"}]
    r = client.responses.create(model=ctx.model, instructions="be brief", input=history, tools=tools, stream=True)
    return "".join(e.delta for e in r if e.type == "response.output_text.delta"), dumped


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_agent_that_resends_its_output_items_as_the_sdk_dumps_them_completes_its_episode(transport):
    twin, _, _ = run(chat_twin, transport)
    seen, wires, (text, dumped) = run(resending_agent, transport)
    # What the SDK dumps carries the fields it has and we never set (openai 3.x: namespace,
    # caller, async_ on a function call; phase on a message; logprobs on its text), all null.
    assert [d["type"] for d in dumped] == ["message", "function_call"]
    assert {"namespace", "caller", "async_"} <= {k for k, v in dumped[1].items() if v is None}
    for ours, theirs in zip(seen, twin):
        same_observation(ours, theirs)
    assert wires == ["responses", "responses"] and text == "3"


def test_no_field_a_null_is_dropped_from_is_required_and_nullable_in_the_sdks_types():
    """The wire reads a null as "not given" at the body's top level, in input items and in their
    parts; that loses nothing only while no field there is Required[Optional[...]] (as a function
    tool's "parameters" is, which the wire leaves alone)."""
    import typing

    from openai.types.responses import ResponseInputItemParam
    from openai.types.responses.response_create_params import ResponseCreateParamsBase
    from typing_extensions import Required, get_type_hints, is_typeddict

    def typed_dicts(hint, depth):
        if is_typeddict(hint):
            yield hint
            if depth:
                for field in get_type_hints(hint).values():
                    yield from typed_dicts(field, depth - 1)
        else:
            for arg in typing.get_args(hint):
                yield from typed_dicts(arg, depth)

    served = [
        m for m in typing.get_args(ResponseInputItemParam)
        if {"message", "function_call", "function_call_output"} & set(typing.get_args(get_type_hints(m)["type"]))
    ]
    assert len(served) == 5  # three message shapes, a function call, its output
    nullable_required = [
        f"{t.__name__}.{name}"
        for t in {*typed_dicts(typing.Union[tuple(served)], 1), ResponseCreateParamsBase}  # items and their parts
        for name, hint in get_type_hints(t, include_extras=True).items()
        if typing.get_origin(hint) is Required and type(None) in typing.get_args(typing.get_args(hint)[0])
    ]
    assert nullable_required == []


def test_output_items_in_every_dump_of_the_sdk_read_as_the_chat_answer():
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    text = ResponseOutputText(type="output_text", text="Let me add.", annotations=[])
    message = ResponseOutputMessage(type="message", id="msg_1", role="assistant", status="completed", content=[text])
    call = ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1", name="add", arguments='{"a":2}')
    user = {"role": "user", "content": "q"}
    for dump in ({}, {"by_alias": True}, {"mode": "json"}, {"exclude_none": True}):
        request = ResponsesWire().parse(
            {"input": [user, message.model_dump(**dump), call.model_dump(**dump)]}, Episode(task=None), ("text",)
        )
        assert request.messages == [user, assistant_message(CALL)], dump


def _refusal(body):
    try:
        ResponsesWire().parse(body, Episode(task=None), ("text",))
    except GatewayError as exc:
        return exc.status, exc.message
    raise AssertionError("accepted")


def test_an_invalid_input_item_is_refused_naming_its_type_and_field():
    from openai.types.responses import ResponseFunctionToolCall

    call = ResponseFunctionToolCall(type="function_call", call_id="c1", name="add", arguments="{}", id="fc_1").model_dump()
    user = {"role": "user", "content": "q"}
    status, message = _refusal({"input": [user, {**call, "namespace": 5}]})
    assert status == 400 and "input[1] (function_call item).namespace: Input should be a valid string (got 5)" in message
    status, message = _refusal({"input": [user, {**call, "call_id": 1}]})
    assert "input[1] (function_call item).call_id: Input should be a valid string (got 1)" in message
    status, message = _refusal({"input": [{**user, "content": [{"type": "input_text"}]}]})
    assert "input[0] (message item).content[0].text: Field required" in message
    status, message = _refusal({"input": [user, {**call, "type": "reasoning"}]})
    assert "input[1]: items of type 'reasoning' are not served" in message
    # A null stays a refusal where a value is required (null means "not given").
    status, message = _refusal({"input": [user, {**call, "call_id": None}]})
    assert "input[1] (function_call item).call_id: Field required" in message


def test_a_request_repeating_its_last_user_turn_is_flagged_and_warned_about_once(monkeypatch):
    """Semantic Kernel's OpenAIResponsesAgent sends each user turn twice: such a step is recorded as
    sent (the policy saw it so), flagged on its request, and the process warns once."""
    monkeypatch.setattr(wires_base, "_repeat_warned", False)
    tools = [{"type": "function", "name": "add", "description": "add one", "parameters": SCHEMA}]

    def agent(task, ctx):
        client = ctx.openai_client()
        turn = {"role": "user", "content": task}
        r = client.responses.create(model=ctx.model, instructions="be brief", input=[turn, turn], tools=tools)
        call = r.output[1]
        done = {"type": "function_call_output", "call_id": call.call_id, "output": "3"}
        r = client.responses.create(model=ctx.model, instructions="be brief", input=[turn, turn, *r.output, done], tools=tools)
        return r.output_text

    with pytest.warns(wires_base.RepeatedUserTurnWarning, match="Semantic Kernel's OpenAIResponsesAgent") as caught:
        for _ in range(2):
            seen, wires, text = run(agent, "inproc")
    assert len(caught) == 1  # once per process, however many requests
    assert text == "3" and wires == ["responses", "responses"]
    assert all(request.repeated_user_turn for request in seen)
    assert seen[0].messages[1:] == [{"role": "user", "content": "inproc"}] * 2  # as sent


def test_only_a_last_user_turn_given_twice_in_a_row_is_a_repeated_turn():
    def request(*messages):
        return ChatRequest(messages=[{"role": role, "content": text} for role, text in messages])

    assert request(("user", "q"), ("user", "q")).repeated_user_turn
    assert request(("system", "s"), ("user", "q"), ("user", "q"), ("assistant", "a"), ("tool", "3")).repeated_user_turn
    assert not request(("user", "q")).repeated_user_turn
    assert not request(("user", "q"), ("assistant", "a"), ("user", "q")).repeated_user_turn  # not in a row
    assert not request(("user", "q"), ("user", "q"), ("assistant", "a"), ("user", "r")).repeated_user_turn  # not the last
    assert not request(("user", "q"), ("user", "q2")).repeated_user_turn


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_anthropic_agent_with_a_tool_sees_what_its_chat_twin_sees(transport):
    twin, _, _ = run(chat_twin, transport)
    seen, wires, (text, tool_input) = run(anthropic_agent, transport)
    # Anthropic requires max_tokens (the chat twin sends none): messages and tools are compared.
    for ours, theirs in zip(seen, twin):
        same_observation(ours, theirs)
    assert wires == ["messages", "messages"] and seen[0].sampling.max_tokens == 64
    # The tool call goes back to the policy as the exact text it generated.
    assert seen[1].messages[2]["tool_calls"][0]["function"]["arguments"] == '{"a":2}'
    assert text == "3" and tool_input == {"a": 2}


def test_previous_response_id_reaches_only_the_episode_that_returned_it():
    ids = []

    def agent(task, ctx):
        client = ctx.openai_client()
        if task == "first":
            ids.append(client.responses.create(model=ctx.model, input="hi").id)
            return None
        try:
            client.responses.create(model=ctx.model, input="again", previous_response_id=ids[0])
        except openai.BadRequestError as exc:
            return exc.message

    env = AgentEnv(agent, ["first", "second"], NO_REWARD)
    env.reset(options={"task_index": 0})
    env.step("hello")
    env.reset(options={"task_index": 1})
    message = env.trajectory.result
    assert "previous_response_id" in message and "not a finished response of this episode" in message
    assert env.trajectory.steps == []  # refused before anything was recorded


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_legacy_completions_record_the_raw_prompt(transport):
    def agent(task, ctx):
        client = (
            openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
            if transport == "http"
            else ctx.openai_client()
        )
        refused = []
        for bad in ({"echo": True}, {"n": 2}, {"best_of": 3}, {"prompt": [[1, 2]]}):
            try:
                client.completions.create(**{"model": ctx.model, "prompt": "x", **bad})
            except openai.BadRequestError as exc:
                refused.append(exc.status_code)
        r = client.completions.create(model=ctx.model, prompt="2+2=", max_tokens=4, logprobs=1)
        chunks = list(
            client.completions.create(model=ctx.model, prompt=["3+3="], stream=True, stream_options={"include_usage": True})
        )
        streamed = "".join(c.choices[0].text for c in chunks if c.choices)
        return (
            refused,
            r.choices[0].text,
            r.choices[0].logprobs.token_logprobs,
            r.usage.prompt_tokens,
            streamed,
            chunks[-1].usage.total_tokens,
        )

    env = AgentEnv(agent, [{}], NO_REWARD, transport=transport)
    obs, _ = env.reset(seed=0)
    assert (obs.request.wire, obs.request.prompt, obs.request.messages) == (
        "completions",
        "2+2=",
        [{"role": "user", "content": "2+2="}],
    )
    obs, *_ = env.step(Completion(text="4", prompt_token_ids=[9, 9], completion_token_ids=[4], logprobs=[-0.2]))
    assert obs.request.prompt == "3+3=" and obs.request.stream
    *_, info = env.step(Completion(text="6", prompt_token_ids=[9], completion_token_ids=[6]))
    assert info["trajectory"].result == ([400, 400, 400, 400], "4", [-0.2], 2, "6", 2)


def test_a_raw_prompt_is_tokenized_without_the_chat_template(smol_tokenizer):
    from agentgym_lightning.policies.chat import render_prompt_ids, render_prompt_text

    chat = ChatRequest(messages=[{"role": "user", "content": "2+2="}])
    raw = ChatRequest(messages=[{"role": "user", "content": "2+2="}], wire="completions", prompt="2+2=")
    assert render_prompt_text(smol_tokenizer, raw) == "2+2="
    assert render_prompt_ids(smol_tokenizer, raw) == smol_tokenizer("2+2=")["input_ids"]
    assert render_prompt_ids(smol_tokenizer, chat) != render_prompt_ids(smol_tokenizer, raw)


def test_the_anthropic_key_header_is_checked_and_errors_take_anthropics_shape():
    gw = Gateway(token="s3cret")

    def agent(task, ctx):
        out = []
        for key in ("wrong", ctx.api_key):
            client = anthropic.Anthropic(base_url=ctx.anthropic_base_url, api_key=key, max_retries=0)
            try:
                client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [{"type": "image"}]}])
            except anthropic.APIStatusError as exc:
                out.append((exc.status_code, exc.body["error"]["type"]))
        return out

    env = AgentEnv(agent, [{}], NO_REWARD, gateway=gw, transport="http")
    env.reset(seed=0)
    assert env.trajectory.result == [(401, "authentication_error"), (400, "invalid_request_error")]
    gw.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unserved_routes_answer_404_in_the_wire_shape_naming_what_is_served(transport):
    def agent(task, ctx):
        with ctx.http_client() as http:
            base = ctx.base_url_for_clients
            embeddings = http.post(f"{base}/embeddings", json={"input": "x"})
            count = http.post(f"{base}/messages/count_tokens", json={"messages": []})
        return embeddings.status_code, embeddings.json(), count.status_code, count.json()

    env = AgentEnv(agent, [{}], NO_REWARD, transport=transport)
    env.reset(seed=0)
    status, body, count_status, count = env.trajectory.result
    assert status == count_status == 404
    assert "POST /v1/responses" in body["error"]["message"] and "POST /v1/messages" in body["error"]["message"]
    assert count["type"] == "error" and count["error"]["type"] == "not_found_error"


# --------------------------------------------------------------------------- conversions, both ways


def test_responses_output_read_back_is_the_chat_answer():
    call = type("Call", (), {"call_id": "abc", "request": ChatRequest(messages=[{"role": "user", "content": "q"}])})()
    for completion in (CALL, FINAL, Completion(tool_calls=[{"id": "c", "name": "add", "arguments": "{}"}])):
        items = output_items(call, completion)
        assert input_to_messages(json.loads(json.dumps(items))) == [assistant_message(completion)]
    assert tools_from_chat(tools_to_chat(tools_from_chat(CHAT_TOOLS))) == tools_from_chat(CHAT_TOOLS)
    assert tools_to_chat(tools_from_chat(CHAT_TOOLS)) == CHAT_TOOLS


def test_anthropic_content_read_back_is_the_chat_answer():
    for completion in (CALL, FINAL):
        blocks = content_blocks(completion)
        arguments = {tc.id: tc.arguments for tc in completion.tool_calls}
        assert messages_to_chat(None, [{"role": "assistant", "content": blocks}], arguments) == [
            assistant_message(completion)
        ]
    # Without the remembered text, the arguments are the input's JSON.
    (message,) = messages_to_chat(None, [{"role": "assistant", "content": content_blocks(CALL)}])
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 2}


def test_a_chat_step_is_stored_as_before_and_the_wire_round_trips():
    chat = Step(index=0, request=ChatRequest(messages=[{"role": "user", "content": "q"}]))
    assert "wire" not in chat.to_dict()["request"] and "prompt" not in chat.to_dict()["request"]
    raw = Step(index=0, request=ChatRequest(messages=[{"role": "user", "content": "q"}], wire="completions", prompt="q"))
    assert Step.from_dict(json.loads(json.dumps(raw.to_dict()))) == raw


def test_the_anthropic_base_url_is_the_episode_url_without_v1():
    gw = get_gateway()
    assert gw.anthropic_base_url("e1") == gw.base_url("e1").removesuffix("/v1")
    assert httpx.URL(gw.anthropic_base_url("e1")).path == "/episodes/e1"
    env = AgentEnv(lambda task, ctx: ctx.anthropic_base_url, [{}], NO_REWARD)
    env.reset(seed=0)
    assert env.trajectory.result == gw.anthropic_base_url(env.trajectory.episode_id)


def test_a_cut_answer_is_incomplete_on_responses_and_max_tokens_on_messages():
    def agent(task, ctx):
        r = ctx.openai_client().responses.create(model=ctx.model, input="x", max_output_tokens=2)
        events = [e.type for e in ctx.openai_client().responses.create(model=ctx.model, input="x", stream=True)]
        m = ctx.anthropic_client().messages.create(
            model=ctx.model, max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
        return r.status, r.incomplete_details.reason, events[-1], m.stop_reason

    env = AgentEnv(agent, [{}], NO_REWARD)
    env.reset(seed=0)
    cut = Completion(text="ab", finish_reason="length", prompt_token_ids=[1], completion_token_ids=[2, 3])
    for _ in range(2):
        env.step(cut)
    *_, info = env.step(cut)
    assert info["trajectory"].result == ("incomplete", "max_output_tokens", "response.incomplete", "max_tokens")


def test_the_env_hands_out_the_anthropic_base_url_of_its_running_episode():
    env = AgentEnv(lambda task, ctx: ctx.openai_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]), [{}], NO_REWARD)
    env.reset(seed=0)
    assert env.anthropic_base_url == env.base_url.removesuffix("/v1")
    env.close()


def test_a_chat_request_with_null_optional_fields_is_read_as_if_they_were_absent():
    """OpenAI's server reads a top-level null as a field not given; LlamaIndex's OpenAI client
    sends "user": null (it was refused: 'user: Input should be a valid string')."""
    from agentgym_lightning.gateway.validation import check_chat_request

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": None, "stop": None, "max_tokens": None}
    check_chat_request(body)  # no GatewayError
    with pytest.raises(GatewayError, match="user"):
        check_chat_request({**body, "user": 5})  # a wrong value is still refused, naming its field


def test_a_request_is_validated_once_on_every_wire(monkeypatch):
    """On its way to a step a request is checked once, whichever wire it came on: one schema pass
    over its body (its own wire's: a Responses request is not checked again as chat once
    translated), each of its messages or input items once, its item counts and its sampling
    limits once."""
    from collections import Counter

    from agentgym_lightning import llm
    from agentgym_lightning.gateway import router as router_module
    from agentgym_lightning.gateway import validation
    from agentgym_lightning.gateway.router import EpisodeRouter
    from agentgym_lightning.gateway.wires import WIRES

    counts: Counter[str] = Counter()
    validate = validation._validate  # every schema check of the gateway runs through it

    def counted_validate(validator, value, path, skip=0):
        counts["body" if path == () else "item"] += 1
        return validate(validator, value, path, skip)

    def counted(name, check):
        def spy(*args, **kwargs):
            counts[name] += 1
            return check(*args, **kwargs)

        return spy

    monkeypatch.setattr(validation, "_validate", counted_validate)
    monkeypatch.setattr(llm, "_check_sampling", counted("sampling limits", llm._check_sampling))
    monkeypatch.setattr(router_module, "check_item_counts", counted("item counts", router_module.check_item_counts))
    user = {"role": "user", "content": "add 2"}
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":2}'}
    output = {"type": "function_call_output", "call_id": "c1", "output": "3"}
    tools = [{"type": "function", "name": "add", "description": "add one", "parameters": SCHEMA}]
    bodies = {  # and how many messages or input items each holds
        "chat/completions": ({"model": "m", "messages": [{"role": "system", "content": "s"}, user], "temperature": 0.5}, 2),
        "responses": (
            {"model": "m", "instructions": "s", "input": [user, call, output], "tools": tools, "temperature": 0.5},
            3,
        ),
        "completions": ({"model": "m", "prompt": "add 2", "temperature": 0.5}, 0),
        "messages": ({"model": "m", "max_tokens": 8, "messages": [user], "temperature": 0.5}, 1),
    }
    router = EpisodeRouter()
    for path, (body, items) in bodies.items():
        episode = Episode(task=None)
        router.register(episode)
        counts.clear()
        request = router.submit(episode.episode_id, body, WIRES[path]).request
        assert request.wire == WIRES[path].name and request.sampling.temperature == 0.5
        once = Counter({"body": 1, "item": items, "sampling limits": 1, "item counts": 1})
        assert counts == once, path


def test_a_responses_request_is_still_refused_for_what_only_chat_checked():
    """Not checked again as chat, a translated Responses request is still refused, with chat's
    errors, for what no Responses type states: a stream that is no boolean (the base params do
    not type it), an empty conversation, content parts the policy does not render."""
    assert _refusal({"input": "hi", "stream": "no"}) == (400, "'stream' must be true or false, got 'no'")
    assert _refusal({"input": []}) == (400, "'messages' must be a non-empty list of chat messages")
    assert _refusal({"input": "hi", "temperature": 5})[1] == "'temperature' must be in [0.0, 2.0], got 5"
    two_texts = {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}
    with pytest.raises(GatewayError, match=r"messages\[1\]\.content\[0\]: content parts of type 'text' cannot be rendered"):
        ResponsesWire().parse({"instructions": "s", "input": [two_texts]}, Episode(task=None), ("image_url",))
