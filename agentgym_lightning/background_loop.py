"""An asyncio event loop on a daemon thread: the one ``async def`` agents share (the gateway's),
and the OpenAI policy's I/O loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Runs coroutines submitted from any thread on one loop of its own."""

    def __init__(self, name: str = "agentgym-loop") -> None:
        self.loop = asyncio.new_event_loop()
        # The loop keeps only weak references to tasks: hold them until done, or a task waiting
        # on a socket can be garbage-collected mid-episode.
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; the returned future is thread-safe."""

        async def held() -> T:
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            try:
                return await coro
            finally:
                self._tasks.discard(task)

        return asyncio.run_coroutine_threadsafe(held(), self.loop)

    def close(self, timeout: float = 5.0) -> None:
        if self.loop.is_closed():
            return

        async def _shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.submit(_shutdown()).result(timeout)
        except Exception:  # noqa: BLE001 - best effort on shutdown
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
