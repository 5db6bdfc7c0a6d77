"""The FastAPI app: routes, the API-key check, and errors in OpenAI's JSON shape.

    GET  /health               200 while the engine thread runs (no key needed)
    GET  /v1/models            the served model names
    POST /v1/completions       completions.py
    POST /v1/chat/completions  chat.py
    GET  /metrics              Prometheus text format (metrics.py)

The engine loop starts with the app (lifespan) and stops with it.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .chat import create_chat_completion
from .completions import create_completion
from .errors import ApiError, error_body, validation_message
from .protocol import ChatCompletionRequest, CompletionRequest
from .state import ServerState
from .streaming import ClientGone

# nginx's status for "client closed request": logged, never read by anyone
CLIENT_CLOSED_REQUEST = 499


def create_app(state: ServerState) -> FastAPI:
    """An app serving ``state``'s engine; its lifespan runs the engine loop."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine_loop.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            state.engine_loop.stop()

    app = FastAPI(title="toolkit", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    _add_error_handlers(app, state)
    _add_routes(app, state)
    return app


def _error_response(state: ServerState, status: int, body: dict, headers: dict | None = None) -> JSONResponse:
    state.metrics.on_error(status)
    return JSONResponse(body, status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return _error_response(state, exc.status, exc.body(), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        message, param = validation_message(list(exc.errors()))
        return _error_response(state, 400, error_body(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return _error_response(state, exc.status_code, error_body(exc.status_code, str(exc.detail)))

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        return Response(status_code=CLIENT_CLOSED_REQUEST)


def _add_routes(app: FastAPI, state: ServerState) -> None:
    async def check_key(request: Request) -> None:  # async: a plain def would hop to a thread pool
        expected = state.settings.api_key
        if expected is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            raise ApiError(401, "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>'.",
                           code="invalid_api_key")

    keyed = [Depends(check_key)]

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state.engine_loop.is_alive else 503)

    @app.get("/v1/models", dependencies=keyed)
    async def models():
        data = [{"id": name, "object": "model", "created": state.settings.created, "owned_by": "toolkit",
                 "max_model_len": state.max_model_len} for name in state.settings.model_names]
        return {"object": "list", "data": data}

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(state, body, request)

    @app.post("/v1/chat/completions", dependencies=keyed)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(state, body, request)

    @app.get("/metrics", dependencies=keyed)
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
