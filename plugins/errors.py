"""Default failure classification: connection and server errors are the infrastructure's fault."""

from __future__ import annotations

import httpx
import openai

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Status

_INFRA = (openai.APIConnectionError, openai.APITimeoutError, httpx.TransportError, ConnectionError, TimeoutError)


@hookimpl(trylast=True)
def agentgym_classify_error(error: BaseException) -> Status | None:
    if isinstance(error, _INFRA):
        return Status.INFRA_FAILED
    if isinstance(error, openai.APIStatusError) and error.status_code >= 500:
        return Status.INFRA_FAILED
    return Status.TASK_FAILED
