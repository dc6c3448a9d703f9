"""Plain ASGI middleware (streaming untouched) that answers before the app runs, in OpenAI's error shape:
a body over the size limit (413), a /v1 request without the API key (401)."""

from __future__ import annotations

import hmac

from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.server.metrics import ServerMetrics
from specdec.server.schemas import APIError


class BodyLimit:
    """A request body over `limit` bytes is a 413 in OpenAI's error shape: at once when Content-Length says so,
    else (a chunked body) as soon as the bytes read pass the limit."""

    def __init__(self, app, limit: int, metrics: ServerMetrics):
        self.app, self.limit, self.metrics = app, limit, metrics

    def too_large(self, size: str) -> str:
        return f"the request body has {size} bytes; this server takes at most {self.limit} (no prompt that fits " \
               "the context is longer)"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            self.metrics.record_error(413, "request_too_large")
            error = APIError(413, self.too_large(str(int(declared))), code="request_too_large")
            await error.response()(scope, receive, send)
            return
        read = 0

        async def counted():
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > self.limit:  # raised inside the body's parsing: the app's error handler answers it
                raise StarletteHTTPException(413, self.too_large(f"more than {self.limit}"))
            return message

        await self.app(scope, counted, send)


class APIKeyMiddleware:
    """Every /v1 path needs the key: `Authorization: Bearer <api_key>` (the scheme in any case, as RFC 7235
    says) or `X-Api-Key: <api_key>` (llama.cpp's server takes it). Plain ASGI, so streaming is untouched."""

    def __init__(self, app, api_key: str, metrics: ServerMetrics):
        self.app = app
        self.expected = api_key.encode()
        self.metrics = metrics

    def given_key(self, headers: dict[bytes, bytes]) -> bytes | None:
        if b"authorization" in headers:
            scheme, _, key = headers[b"authorization"].partition(b" ")
            return key.strip(b" ") if scheme.lower() == b"bearer" else b""
        return headers.get(b"x-api-key")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = self.given_key(dict(scope["headers"]))
            if given is None or not hmac.compare_digest(given, self.expected):
                message = ("You didn't provide an API key: send it as 'Authorization: Bearer KEY'." if given is None
                           else "Incorrect API key provided.")
                self.metrics.record_error(401, "invalid_api_key")
                response = APIError(401, message, code="invalid_api_key",
                                    headers={"WWW-Authenticate": "Bearer"}).response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
