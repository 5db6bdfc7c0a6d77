"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``."""
from __future__ import annotations

from typing import Any

# HTTP status -> OpenAI error type
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               413: "invalid_request_error", 500: "server_error", 503: "server_error"}


class ApiError(Exception):
    """An error answered to the client (raised anywhere in a route; the app turns it into JSON).

    :param status: HTTP status
    :param message: what was wrong, for the client
    :param param: the request field at fault, if one is
    :param code: OpenAI's machine-readable code (``invalid_api_key``, ``model_not_found``...)
    :param headers: extra response headers (``Retry-After``)
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One message (and the field at fault) for pydantic's validation errors, worded as OpenAI words them."""
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    if first.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    if first.get("type") == "json_invalid":
        return "We could not parse the JSON body of your request.", None
    return f"Invalid value for '{param}': {first.get('msg', 'invalid')}", param
