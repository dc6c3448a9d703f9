"""OpenAI's error shape {"error": {"message", "type", "param", "code"}} for everything the app refuses or
fails at: malformed JSON and wrong field types are 400 (FastAPI's 422 is replaced), an unknown path 404,
a body over the limit 413, an unexpected exception 500; as_api_error maps a failed job's exception.

    install_error_handlers(app, metrics)   # every answered error is counted by status and code
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from specdec.model.errors import SpecdecError
from specdec.server.metrics import ServerMetrics
from specdec.server.scheduler import ServerStopping
from specdec.server.schemas import APIError

log = logging.getLogger("specdec.server")


def as_api_error(exc: BaseException) -> APIError:
    """The APIError that answers a job failed with `exc` (or refused at submit): APIError as it is, a timeout
    504, a stopping server 503, a ValueError 400, anything else 500."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, TimeoutError):
        return APIError(504, str(exc), type="server_error", code="timeout")
    if isinstance(exc, ServerStopping):
        return APIError(503, str(exc), type="server_error", code="server_stopping")
    if isinstance(exc, ValueError):
        return APIError(400, str(exc), code="invalid_value")
    if isinstance(exc, SpecdecError):
        return APIError(500, str(exc), type="server_error", code="internal_error")
    log.error("generation failed: %r", exc)
    return APIError(500, f"generation failed: {type(exc).__name__}: {exc}", type="server_error",
                    code="internal_error")


_PYDANTIC_CODES = {"missing": "missing_required_parameter", "extra_forbidden": "unknown_parameter",
                   "json_invalid": "invalid_json"}


def _param_loc(error: dict) -> list[str]:
    """A validation error's parameter path without "body" and without pydantic's names of union branches
    ('str', 'list[TextPart]'), which are no parameter of the request ("messages.0.content.str")."""
    return [str(p) for p in tuple(error.get("loc", ()))[1:]
            if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool", "none")))]


def install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def answer(err: APIError) -> JSONResponse:
        metrics.record_error(err.status, err.code)
        return err.response()

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {"type": "invalid", "loc": ("body",), "msg": "invalid request"}
        # a union field (content: str | list[TextPart]) fails once per branch, the string branch first: the
        # error that got deepest into the value says what is wrong ("Input should be 'text'" for an image part)
        field = tuple(first.get("loc", ()))[:2]
        first = max((e for e in errors if tuple(e.get("loc", ()))[:2] == field), key=lambda e: len(_param_loc(e)),
                    default=first)
        kind = first.get("type", "")
        loc = _param_loc(first)
        param = ".".join(loc) or None
        if kind == "json_invalid":
            message = ("We could not parse the JSON body of your request: "
                       f"{first.get('ctx', {}).get('error', 'invalid JSON')}. The API expects a JSON object.")
            param = None
        elif kind in ("model_attributes_type", "missing") and not loc:  # a body that is no object, or none
            message = "The request body must be a JSON object."
            param, kind = None, "model_attributes_type"  # an empty body misses no parameter: it is no object
        elif kind == "missing":
            message = f"Missing required parameter: '{param}'."
        elif kind.endswith("_type"):
            given = repr(first.get("input"))[:60]
            message = f"Invalid type for '{param}': {first.get('msg', 'wrong type')} (got {given})."
        elif param is None:  # e.g. a key that is no valid string
            message = f"Invalid request body: {first.get('msg', 'invalid')}."
        else:
            message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}."
            if re.fullmatch(r"messages\.\d+\.content\.\d+\.type", param):
                message += " specdec serves text models: a message's content parts must be text parts."
        code = _PYDANTIC_CODES.get(kind, "invalid_type" if kind.endswith("_type") else "invalid_value")
        return answer(APIError(400, message, param=param, code=code))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = f"{exc.detail}: {request.method} {request.url.path}" if exc.status_code in (404, 405) \
            else str(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        if exc.status_code == 400:  # FastAPI's own: a body that is not UTF-8 or nests too deep for the parser
            message = ("We could not parse the body of your request as JSON (it is not UTF-8 text, or it nests "
                       "too deep). The API expects a JSON object.")
            code = "invalid_json"
        return answer(APIError(exc.status_code, message, param=None, code=code))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return answer(APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error",
                               code="internal_error"))
