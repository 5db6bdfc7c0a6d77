"""Server-sent events, and waiting for a result while watching for the client to leave.

Either way a client that disconnects aborts its engine requests at once: the stream's response
aborts them when it stops (finished, cancelled by the disconnect, or failed), and a
non-streaming route races its result against the ``http.disconnect`` message.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import StreamingResponse

from .engine_loop import RequestGroup
from .errors import ApiError

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class ChunkWriter:
    """SSE events of one stream: the fields every chunk repeats (id, object, created, model) are
    serialized once; each event adds its ``choices`` (and ``usage`` when asked for)."""

    def __init__(self, head: dict[str, Any], include_usage: bool):
        self.prefix = "data: " + json.dumps(head, ensure_ascii=False)[:-1] + ', "choices": '
        self.suffix = ', "usage": null}\n\n' if include_usage else "}\n\n"
        self.include_usage = include_usage

    def choice(self, choice: dict[str, Any]) -> str:
        return f"{self.prefix}[{json.dumps(choice, ensure_ascii=False)}]{self.suffix}"

    def usage(self, usage: dict[str, int]) -> str:
        return f"{self.prefix}[], \"usage\": {json.dumps(usage)}}}\n\n"


class EventStreamResponse(StreamingResponse):
    """An SSE stream of a request group's chunks; the group is aborted whenever the stream stops."""

    def __init__(self, chunks: AsyncIterator[str], group: RequestGroup):
        super().__init__(self._guarded(chunks), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.group = group

    async def _guarded(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield chunk
        except ApiError as exc:  # headers are gone; OpenAI's clients read an error event instead
            yield sse(exc.body())
        yield DONE

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.group.abort()


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


async def until_disconnect(request: Request) -> None:
    """Returns when the client disconnects (the request body has been read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, group: RequestGroup, work: Callable[[], Awaitable[Any]]) -> Any:
    """``await work()``, but abort ``group`` and raise ClientGone if the client leaves first."""
    task = asyncio.ensure_future(work())
    watcher = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        raise ClientGone()
    finally:
        watcher.cancel()
        group.abort()
