"""The ``view`` web app: the report's views of one or more run folders, served live.

Every page is rendered from the files at the moment it is asked (:mod:`.run` re-parses an
episode file only when it changed), and a small script on each page polls ``/version`` and
reloads when a run wrote something, so a running training refreshes by itself. Drawn pages are
kept up to :data:`RENDERED_BYTES` of HTML; an episode's page reads only its GRPO group from the
step's file (:meth:`~agentgym_lightning.viewer.run.RunFolder.episode_group`).

Routes: ``/`` (overview), ``/runs/{i}/{train|eval}/{step}`` (a step's episodes),
``/runs/{i}/{train|eval}/{step}/{episode_id}`` (one episode, call by call), ``/version``.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from agentgym_lightning.viewer.pages import Links, episode_detail, episode_list, overview, page
from agentgym_lightning.viewer.run import EpisodeFile, RunFolder

__all__ = ["make_app", "RENDERED_BYTES"]

#: The drawn pages kept, in characters of HTML (a page of a large step's episodes is large).
RENDERED_BYTES = 64 * 2**20


def _links() -> Links:
    return Links(
        episodes=lambda r, f: f"/runs/{r}/{f.kind}/{f.step}",
        episode=lambda r, f, e: f"/runs/{r}/{f.kind}/{f.step}/{quote(e, safe='')}",
        home="/",
    )


def make_app(runs: Sequence[RunFolder], refresh_ms: int = 3000) -> Starlette:
    """The app serving ``runs``; pages poll for changes every ``refresh_ms``."""
    links = _links()
    # Rendering reads files and draws charts: one page at a time, off the event loop; a page is
    # drawn again only when the files it shows changed (a live page polls and reloads often).
    lock = asyncio.Lock()
    rendered: dict[str, tuple[int, str]] = {}

    def version(scope: tuple[int, EpisodeFile] | None) -> int:
        if scope is None:
            return sum(r.version() for r in runs)
        return runs[scope[0]].version(scope[1])

    async def render(request: Request, title: str, body, scope: tuple[int, EpisodeFile] | None = None) -> HTMLResponse:  # type: ignore[no-untyped-def]
        async with lock:
            live = version(scope)
            cached = rendered.get(request.url.path)
            if cached is None or cached[0] != live:
                cached = (live, await asyncio.to_thread(body))
                rendered.pop(request.url.path, None)
                rendered[request.url.path] = cached
                while len(rendered) > 256 or sum(len(text) for _, text in rendered.values()) > RENDERED_BYTES:
                    del rendered[next(iter(rendered))]  # the oldest drawn go first
                    if not rendered:
                        break
        url = "/version" if scope is None else f"/version?run={scope[0]}&kind={scope[1].kind}&step={scope[1].step}"
        return HTMLResponse(page(title, cached[1], live_version=live, version_url=url, refresh_ms=refresh_ms, home="/"))

    def file_of(params: Mapping[str, str]) -> tuple[int, RunFolder, EpisodeFile]:
        try:
            index, step = int(params["run"]), int(params["step"])
        except (KeyError, ValueError):
            raise KeyError("give run, kind and step") from None
        if not 0 <= index < len(runs):
            raise KeyError(f"no run {index}")
        run = runs[index]
        return index, run, run.episode_file(params.get("kind", ""), step)

    def not_found(exc: KeyError) -> HTMLResponse:
        return HTMLResponse(page("not found", f"<p>{html.escape(str(exc.args[0] if exc.args else exc))}</p>", home="/"), status_code=404)

    async def home(request: Request) -> HTMLResponse:
        return await render(request, ", ".join(r.name for r in runs), lambda: overview(runs, links))

    async def episodes(request: Request) -> HTMLResponse:
        try:
            index, run, f = file_of(request.path_params)
        except KeyError as exc:
            return not_found(exc)
        what = f"step {f.step}" if f.kind == "train" else f"held-out eval after step {f.step}"
        return await render(request, f"{run.name} · episodes of {what}", lambda: episode_list(index, run, f, links), (index, f))

    async def episode(request: Request) -> HTMLResponse:
        try:
            index, run, f = file_of(request.path_params)
            wanted = request.path_params["episode"]
            group = await asyncio.to_thread(run.episode_group, f, wanted)
            found = next((t for t in group if t.episode_id == wanted), None)
            if found is None:
                raise KeyError(f"no episode {wanted} in {f.path}")
        except KeyError as exc:
            return not_found(exc)
        back = f"<p><a href='{links.episodes(index, f)}'>← all episodes of this step</a></p>"

        return await render(
            request, f"{run.name} · episode {found.episode_id}", lambda: back + episode_detail(index, run, f, found, among=group), (index, f)
        )

    async def version_route(request: Request) -> JSONResponse:
        if not request.query_params:
            return JSONResponse({"version": version(None)})
        try:
            index, _, f = file_of(request.query_params)
        except KeyError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return JSONResponse({"version": version((index, f))})

    return Starlette(routes=[
        Route("/", home),
        Route("/version", version_route),
        Route("/runs/{run:int}/{kind}/{step:int}", episodes),
        Route("/runs/{run:int}/{kind}/{step:int}/{episode}", episode),
    ])
