"""The one bearer-token rule of every server this package runs (the gateway, the standalone
gateway, the policy server).

Off loopback a token is required: the one given, or a fresh one generated (read it back from the
server's ``token``). On loopback the one given is checked, and none is needed. Requests send it
as ``Authorization: Bearer <token>``, compared in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets

from agentgym_lightning.llm import GatewayError

__all__ = ["is_loopback", "server_token", "check_bearer"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_token(host: str, token: str | None) -> str | None:
    """The token a server bound to ``host`` checks: ``token``, or a generated one off loopback."""
    if not token and not is_loopback(host):
        return secrets.token_urlsafe(24)
    return token or None


def check_bearer(authorization: str | None, token: str | None) -> None:
    """Raise a 401 :class:`GatewayError` unless ``authorization`` is ``Bearer <token>`` (nothing
    is checked when ``token`` is ``None``)."""
    if not token:
        return
    if not authorization or not hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
        raise GatewayError(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'", "authentication_error")
