"""The chat agent that plays an OpenEnv environment: observation → messages, completion → action.

Each episode: ``reset`` the server's environment (the task's ``seed``), show the model the
observation, and loop: one model call, its answer read as an action, the action sent with
``step``, the next observation shown; until the environment says ``done`` or the turns run out.

* **observation → message**: :meth:`OpenEnvChatAgent.render_observation`, the observation's
  fields as JSON (without ``done``, ``reward`` and ``metadata``, which the env reports itself).
* **completion → action**: the model is handed one tool, ``act``, whose parameters are the
  server's action schema (its ``Action`` model, ``GET /schema``); a tool call's arguments are the
  action. An answer without a tool call is the action when the schema has exactly one required
  text field (``message``, ``command``): the answer's text fills it. Anything else, or an action
  the server refuses, is shown to the model as what went wrong, and it tries again
  (``invalid_action`` on that call's outcome).
* **reward and done**: the env's. Each step's reward lands in the outcome of the call that chose
  the action (``openenv_reward``); the episode's final reward is their sum (its return).

Replace it by subclassing (override :meth:`render_observation`, :meth:`read_action`,
``system_prompt``) and passing ``agent=my_module:MyAgent``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .session import InvalidAction, open_session

if TYPE_CHECKING:
    from agentgym_lightning.agent import AgentContext

__all__ = ["ACT_TOOL", "OpenEnvChatAgent", "action_tool"]

#: The name of the tool whose arguments are an action.
ACT_TOOL = "act"
#: Observation fields the env reports itself, not shown as the observation.
_NOT_SHOWN = ("done", "reward", "metadata")


def action_tool(action_schema: Mapping[str, Any]) -> dict[str, Any]:
    """The model's one tool: ``act``, with the server's action schema as its parameters (less
    ``metadata``, which openenv's base ``Action`` carries for the harness, not the model)."""
    properties = {k: v for k, v in dict(action_schema.get("properties") or {}).items() if k != "metadata"}
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    required = [r for r in action_schema.get("required") or [] if r in properties]
    if required:
        parameters["required"] = required
    if "$defs" in action_schema:
        parameters["$defs"] = action_schema["$defs"]
    description = str(action_schema.get("description") or action_schema.get("title") or "Take an action in the environment.")
    return {"type": "function", "function": {"name": ACT_TOOL, "description": description, "parameters": parameters}}


class OpenEnvChatAgent:
    """``agent(task, ctx)``: one episode of the OpenEnv server at ``url``; returns
    ``{"return", "done", "steps"}`` (the sum of the env's rewards, whether the env ended it, the
    actions sent)."""

    system_prompt = (
        "You act in an environment. Each turn you see its observation; answer with your action "
        f"by calling the `{ACT_TOOL}` tool."
    )

    def __init__(self, url: str, max_turns: int = 16, max_tokens: int | None = None, timeout: float = 60.0) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.url, self.max_turns, self.max_tokens, self.timeout = url, max_turns, max_tokens, timeout

    def render_observation(self, observation: Mapping[str, Any]) -> str:
        """The observation as the model reads it."""
        shown = {k: v for k, v in observation.items() if k not in _NOT_SHOWN}
        return json.dumps(shown, ensure_ascii=False, indent=1)

    def read_action(self, message: Any, action_schema: Mapping[str, Any]) -> dict[str, Any]:
        """The action in the model's ``message`` (an OpenAI chat message). Raises
        :class:`~.session.InvalidAction` saying what is wrong."""
        calls = message.tool_calls or []
        if calls:
            try:
                action = json.loads(calls[0].function.arguments or "{}")
            except json.JSONDecodeError as exc:
                raise InvalidAction(f"the arguments of {ACT_TOOL} are not JSON ({exc.msg})") from None
            if not isinstance(action, dict):
                raise InvalidAction(f"the arguments of {ACT_TOOL} must be a JSON object")
            return action
        properties = action_schema.get("properties") or {}
        required = list(action_schema.get("required") or [])
        if len(required) == 1 and (properties.get(required[0]) or {}).get("type") == "string":
            return {required[0]: message.content or ""}
        raise InvalidAction(f"call the {ACT_TOOL} tool with your action")

    async def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:
        client = ctx.async_openai_client()
        params: dict[str, Any] = {} if self.max_tokens is None else {"max_tokens": self.max_tokens}
        total, steps = 0.0, 0
        async with open_session(self.url, self.timeout) as session:
            result = await session.reset(**dict(task))
            tools = [action_tool(session.action_schema)]
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": self.render_observation(result.observation)},
            ]
            for _ in range(self.max_turns):
                if result.done:
                    break
                reply = await client.chat.completions.create(model=ctx.model, messages=messages, tools=tools, **params)
                message = reply.choices[0].message
                messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
                try:
                    result = await session.step(self.read_action(message, session.action_schema))
                    shown, invalid = self.render_observation(result.observation), False
                except InvalidAction as exc:
                    shown, invalid = f"That action is invalid: {exc}. Try again.", True
                if not invalid:
                    steps += 1
                    total += float(result.reward or 0.0)
                    ctx.emit_variable("openenv_reward", float(result.reward or 0.0))
                ctx.emit_variable("invalid_action", invalid)
                calls = message.tool_calls or []
                messages += [{"role": "tool", "tool_call_id": c.id, "content": shown} for c in calls[:1]]
                messages += [{"role": "tool", "tool_call_id": c.id, "content": "Only one action is taken a turn."} for c in calls[1:]]
                if not calls:
                    messages.append({"role": "user", "content": shown})
        return {"return": total, "done": bool(result.done), "steps": steps}
