"""The Library API of tests/data/openapi/library.yaml as a real HTTP server, for call_api tests.

Run `python tests/servers/library_api.py`; it prints `PORT=<n>` once listening on
127.0.0.1. Every request must carry `Authorization: Bearer $LIBRARY_TOKEN` (401
otherwise). `GET /v1/whoami` echoes the credentials it received, so tests can check
they never reach a tool result; shelf 500 answers 500; waiting on an operation takes
5 s (for timeouts); `/v1/export?copies=N` is as large as asked. The spec itself is
served, without authentication, at `/openapi.yaml`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SPEC = Path(__file__).resolve().parent.parent / "data" / "openapi" / "library.yaml"
TOKEN = os.environ.get("LIBRARY_TOKEN", "library-test-token")
SHELVES: dict[int, dict[str, Any]] = {1: {"id": 1, "theme": "Fiction", "create_time": "2024-05-01T12:00:00Z"}}
BOOKS: dict[int, list[dict[str, Any]]] = {
    1: [
        {"id": 1, "title": "Dune", "author": "Frank Herbert", "format": "PAPERBACK"},
        {"id": 2, "title": "Solaris", "author": "Stanisław Lem", "format": "EBOOK"},
    ]
}


def _error(status: int, code: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, "details": []}, status_code=status, headers=headers)


def _authorized(request: Request) -> bool:
    return request.headers.get("authorization") == f"Bearer {TOKEN}"


async def list_shelves(request: Request) -> Response:
    headers = {
        "Link": '<http://127.0.0.1/v1/shelves?page_token=2>; rel="next"',
        "X-RateLimit-Remaining": "4999",
        "X-Internal-Trace": "not-interesting",
    }
    return JSONResponse({"shelves": list(SHELVES.values()), "next_page_token": "2"}, headers=headers)


async def create_shelf(request: Request) -> Response:
    data = await request.json()
    shelf = {"id": max(SHELVES) + 1, "theme": data["theme"], "create_time": "2024-05-02T08:00:00Z"}
    SHELVES[shelf["id"]] = shelf
    return JSONResponse(shelf, headers={"Location": f"/v1/shelves/{shelf['id']}"})


async def shelf(request: Request) -> Response:
    shelf_id = int(request.path_params["shelf"])
    if shelf_id == 500:
        return _error(500, 13, "the shelf index is corrupt")
    if shelf_id not in SHELVES:
        return _error(404, 5, f"shelf {shelf_id} not found")
    if request.method == "DELETE":
        del SHELVES[shelf_id]
        return Response(status_code=204)
    return JSONResponse(SHELVES[shelf_id])


async def books(request: Request) -> Response:
    shelf_id = int(request.path_params["shelf"])
    if shelf_id not in SHELVES:
        return _error(404, 5, f"shelf {shelf_id} not found")
    on_shelf = BOOKS.setdefault(shelf_id, [])
    if request.method == "POST":
        book = {"id": 100 + len(on_shelf), **(await request.json())}
        on_shelf.append(book)
        return JSONResponse(book)
    wanted = request.query_params.get("format")
    return JSONResponse({"books": [b for b in on_shelf if not wanted or b.get("format") == wanted]})


async def export(request: Request) -> Response:
    copies = int(request.query_params.get("copies", "1"))
    books = [b for shelf_books in BOOKS.values() for b in shelf_books]
    return JSONResponse([book | {"copy": n} for n in range(copies) for book in books])


async def wait_operation(request: Request) -> Response:
    await anyio.sleep(5)
    return JSONResponse({"@type": "type.googleapis.com/library.v1.Shelf", "id": 1})


async def whoami(request: Request) -> Response:
    return JSONResponse(
        {"authorization": request.headers.get("authorization"), "user_agent": request.headers.get("user-agent")}
    )


async def openapi_document(request: Request) -> Response:
    return Response(SPEC.read_text(encoding="utf-8"), media_type="application/yaml")


class BearerOnly:
    """401 for a request without the right token, before any route runs."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/openapi.yaml" and not _authorized(Request(scope)):
            response = _error(401, 16, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


app = BearerOnly(
    Starlette(
        routes=[
            Route("/v1/shelves", list_shelves, methods=["GET"]),
            Route("/v1/shelves", create_shelf, methods=["POST"]),
            Route("/v1/shelves/{shelf:int}", shelf, methods=["GET", "DELETE"]),
            Route("/v1/shelves/{shelf:int}/books", books, methods=["GET", "POST"]),
            Route("/v1/export", export, methods=["GET"]),
            Route("/v1/operations/{name}:wait", wait_operation, methods=["POST"]),
            Route("/v1/whoami", whoami, methods=["GET"]),
            Route("/openapi.yaml", openapi_document, methods=["GET"]),
        ]
    )
)


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue from now on, before uvicorn takes the socket over
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", ws="none"))
    print(f"PORT={sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
