"""The ``view`` web app: the report's views of one or more run folders, served live.

Every page is rendered from the files at the moment it is asked (:mod:`.run` re-parses an
episode file only when it changed), and a small script on each page polls ``/version`` and
reloads when a run wrote something, so a running training refreshes by itself.

Routes: ``/`` (overview), ``/runs/{i}/{train|eval}/{step}`` (a step's episodes),
``/runs/{i}/{train|eval}/{step}/{episode_id}`` (one episode, call by call), ``/version``.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from agentgym_lightning.viewer.pages import Links, episode_detail, episode_list, overview, page
from agentgym_lightning.viewer.run import EpisodeFile, RunFolder

__all__ = ["make_app"]


def _links() -> Links:
    return Links(
        episodes=lambda r, f: f"/runs/{r}/{f.kind}/{f.step}",
        episode=lambda r, f, e: f"/runs/{r}/{f.kind}/{f.step}/{quote(e, safe='')}",
        home="/",
    )


def make_app(runs: Sequence[RunFolder], refresh_ms: int = 3000) -> Starlette:
    """The app serving ``runs``; pages poll for changes every ``refresh_ms``."""
    links = _links()
    # Rendering reads files and draws charts: one page at a time, off the event loop.
    lock = asyncio.Lock()

    def version() -> int:
        return sum(r.version() for r in runs)

    async def render(title: str, body) -> HTMLResponse:  # type: ignore[no-untyped-def]
        async with lock:
            live = version()
            text = await asyncio.to_thread(body)
        return HTMLResponse(page(title, text, live_version=live, refresh_ms=refresh_ms, home="/"))

    def file_of(request: Request) -> tuple[int, RunFolder, EpisodeFile]:
        index = int(request.path_params["run"])
        if not 0 <= index < len(runs):
            raise KeyError(f"no run {index}")
        run = runs[index]
        return index, run, run.episode_file(request.path_params["kind"], int(request.path_params["step"]))

    async def home(request: Request) -> HTMLResponse:
        return await render(", ".join(r.name for r in runs), lambda: overview(runs, links))

    async def episodes(request: Request) -> HTMLResponse:
        try:
            index, run, f = file_of(request)
        except KeyError as exc:
            return HTMLResponse(page("not found", f"<p>{exc}</p>", home="/"), status_code=404)
        what = f"step {f.step}" if f.kind == "train" else f"held-out eval after step {f.step}"
        return await render(f"{run.name} · episodes of {what}", lambda: episode_list(index, run, f, links))

    async def episode(request: Request) -> HTMLResponse:
        try:
            index, run, f = file_of(request)
            wanted = request.path_params["episode"]
            found = next((t for t in run.episodes(f) if t.episode_id == wanted), None)
            if found is None:
                raise KeyError(f"no episode {wanted} in {f.path}")
        except KeyError as exc:
            return HTMLResponse(page("not found", f"<p>{exc}</p>", home="/"), status_code=404)
        back = f"<p><a href='{links.episodes(index, f)}'>← all episodes of this step</a></p>"
        return await render(f"{run.name} · episode {found.episode_id}", lambda: back + episode_detail(index, run, f, found))

    async def version_route(request: Request) -> JSONResponse:
        return JSONResponse({"version": version()})

    return Starlette(routes=[
        Route("/", home),
        Route("/version", version_route),
        Route("/runs/{run:int}/{kind}/{step:int}", episodes),
        Route("/runs/{run:int}/{kind}/{step:int}/{episode}", episode),
    ])
