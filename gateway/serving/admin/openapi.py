"""What a route of the admin API is (`ApiRoute`, `Param`), and the OpenAPI 3.1 document made from the
route table (`gateway.serving.admin.api.ROUTES`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request

from gateway.security.auth import Principal
from gateway.version import installed_version

__all__ = ["ApiRoute", "Param", "openapi_document"]

ParamType = Literal["string", "integer", "number"]


@dataclass(frozen=True)
class Param:
    name: str
    where: Literal["path", "query"]
    type: ParamType = "string"
    description: str = ""
    enum: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    default: Any = None


@dataclass(frozen=True)
class ApiRoute:
    method: Literal["GET", "POST"]
    path: str
    """Under `API_PREFIX`, with `{name}` path parameters."""
    summary: str
    answer: Callable[[Request, Principal, dict[str, Any]], Awaitable[Any]]
    params: tuple[Param, ...] = ()
    auth: bool = True
    """False only for login: it is how a browser gets credentials."""

    @property
    def changes_state(self) -> bool:
        return self.method != "GET"


_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "A short code: bad_request, unauthorized, forbidden, not_found…"},
        "message": {"type": "string", "description": "What is wrong, for people."},
    },
}
_ERRORS = {
    "400": "A parameter is wrong (named in the message).",
    "401": "No credentials: send `Authorization: Bearer <admin key>` or log in.",
    "403": "Not an admin, or a missing CSRF token on a session request.",
    "404": "No such server, tool or call (named in the message).",
}


def _schema(param: Param) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": param.type}
    if param.enum is not None:
        schema["enum"] = list(param.enum)
    if param.minimum is not None:
        schema["minimum"] = param.minimum
    if param.maximum is not None:
        schema["maximum"] = param.maximum
    if param.default is not None:
        schema["default"] = param.default
    return schema


def _operation(route: ApiRoute) -> dict[str, Any]:
    name = (route.method.lower() + route.path).replace("/", "_").replace("{", "").replace("}", "")
    operation: dict[str, Any] = {
        "operationId": name,
        "summary": route.summary,
        "parameters": [
            {
                "name": p.name,
                "in": p.where,
                "required": p.where == "path",
                "description": p.description,
                "schema": _schema(p),
            }
            for p in route.params
        ],
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
            **{
                status: {
                    "description": text,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                }
                for status, text in _ERRORS.items()
            },
        },
    }
    if not route.auth:
        operation["security"] = []
        operation["requestBody"] = {
            "required": True,
            "content": {
                media: {"schema": {"type": "object", "required": ["key"], "properties": {"key": {"type": "string"}}}}
                for media in ("application/json", "application/x-www-form-urlencoded")
            },
        }
    elif route.changes_state:
        operation["parameters"].append(
            {
                "name": "X-CSRF-Token",
                "in": "header",
                "required": False,
                "description": "The session's CSRF token; needed when authenticated by the session cookie.",
                "schema": {"type": "string"},
            }
        )
    return operation


def openapi_document(routes: Sequence[ApiRoute], prefix: str) -> dict[str, Any]:
    """OpenAPI 3.1 for `routes` under `prefix`: every route, its parameters, and the error shape."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(prefix + route.path, {})[route.method.lower()] = _operation(route)
    paths[prefix + "/openapi.json"] = {
        "get": {
            "operationId": "get_openapi",
            "summary": "This document.",
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mcp-gateway admin API",
            "version": installed_version() or "unknown",
            "description": "The operator console's JSON API (docs/console.md).",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR_SCHEMA},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key with `admin: true`, or a JWT.",
                },
                "session": {"type": "apiKey", "in": "cookie", "name": "mcp_gateway_admin"},
            },
        },
        "security": [{"bearer": []}, {"session": []}],
    }
