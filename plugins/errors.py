"""Default failure classification: connection and server errors are the infrastructure's fault."""

from __future__ import annotations

import sys

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Status


@hookimpl(trylast=True)
def agentgym_classify_error(error: BaseException) -> Status | None:
    # openai and httpx are looked up, not imported: an error of theirs exists only once they are
    # loaded, and importing openai here (every plugin loads on `import agentgym_lightning`) cost
    # every command, `--help` included, a second of CPU.
    openai, httpx = sys.modules.get("openai"), sys.modules.get("httpx")
    infra: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
    if httpx is not None:
        infra += (httpx.TransportError,)
    if openai is not None:
        infra += (openai.APIConnectionError, openai.APITimeoutError)
    if isinstance(error, infra):
        return Status.INFRA_FAILED
    if openai is not None and isinstance(error, openai.APIStatusError) and error.status_code >= 500:
        return Status.INFRA_FAILED
    return Status.TASK_FAILED
