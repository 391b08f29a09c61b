"""The interception gateway: an OpenAI-compatible endpoint whose every call is an env step."""

from agentgym_lightning.gateway.gateway import Gateway, get_gateway
from agentgym_lightning.gateway.openai_wire import GatewayError

__all__ = ["Gateway", "GatewayError", "get_gateway"]
