"""An OpenAPI 3.x document read into the operations, parameters and schemas the tools need.

Pure data and pure functions: `parse_document` turns text into a dict, `ApiSpec.build`
walks it once. `$ref`s are kept as they are (rendering and validation follow them
lazily, with cycle guards); only references inside the document (`#/...`) are
supported, and an external one is a load error that says how to bundle the spec.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import yaml

__all__ = [
    "HTTP_METHODS",
    "ApiSpec",
    "Operation",
    "Parameter",
    "RequestBody",
    "SpecError",
    "deref",
    "parse_document",
    "pointer_get",
    "synthesized_operation_id",
]

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_NOT_WORD = re.compile(r"[^0-9A-Za-z]+")


class SpecError(Exception):
    """The document is not a usable OpenAPI 3.x description; the message says why."""


def parse_document(text: str, source: str) -> dict[str, Any]:
    """JSON or YAML text as a dict; an error names the source and the problem."""
    stripped = text.lstrip()
    try:
        if stripped.startswith("{"):
            data = json.loads(text)
        else:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            data = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{source}: not valid JSON or YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: not an OpenAPI document (the top level is not a mapping)")
    version = str(data.get("openapi", ""))
    if not version.startswith("3."):
        found = f"swagger {data['swagger']}" if "swagger" in data else f"openapi {version!r}"
        raise SpecError(
            f"{source}: only OpenAPI 3.x is supported, found {found}; convert it first "
            "(for example with swagger2openapi)"
        )
    if not isinstance(data.get("paths", {}), dict):
        raise SpecError(f"{source}: `paths` is not a mapping")
    external = next(_external_refs(data), None)
    if external is not None:
        raise SpecError(
            f"{source}: external $ref {external!r} is not supported; bundle the spec into one file first "
            "(for example `redocly bundle` or `swagger-cli bundle`)"
        )
    return data


def _external_refs(node: Any) -> Iterator[str]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                yield ref
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def pointer_get(document: Mapping[str, Any], pointer: str) -> Any:
    """The node at a local JSON pointer (`#/components/schemas/Pet`); KeyError if absent."""
    node: Any = document
    for token in pointer.lstrip("#").split("/")[1:]:
        token = _unescape(token)
        if isinstance(node, list):
            node = node[int(token)]
        elif isinstance(node, Mapping):
            node = node[token]
        else:
            raise KeyError(pointer)
    return node


def deref(document: Mapping[str, Any], node: Any) -> Any:
    """`node` with its chain of `$ref`s followed (a loop or a dangling ref gives `{}`)."""
    seen: set[str] = set()
    while isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
        ref = node["$ref"]
        if ref in seen:
            return {}
        seen.add(ref)
        try:
            node = pointer_get(document, ref)
        except (KeyError, IndexError, ValueError):
            return {}
    return node


def synthesized_operation_id(method: str, path: str) -> str:
    """The id of an operation that has no operationId: `get_pets_petId` for GET /pets/{petId}.

    It depends on the method and path alone, so it is stable across reloads and versions.
    """
    words = [w for w in _NOT_WORD.split(path) if w]
    return "_".join([method.lower(), *words]) if words else method.lower()


@dataclass(frozen=True)
class Parameter:
    """One path, query, header or cookie parameter (path and operation level merged)."""

    name: str
    location: str
    required: bool
    description: str
    schema: Mapping[str, Any]
    schema_pointer: str
    """Where the schema is in the document, for validation with `$ref`s resolved."""
    style: str = ""
    explode: bool = True


@dataclass(frozen=True)
class RequestBody:
    required: bool
    description: str
    content: Mapping[str, str]
    """Media type -> JSON pointer of its schema ("" when it has none)."""


@dataclass(frozen=True)
class Operation:
    id: str
    """The id clients use: the operationId, qualified as `<spec>:<operationId>` with several specs."""
    operation_id: str
    """The operationId in the document, or the synthesized one."""
    synthesized: bool
    spec: str
    method: str
    path: str
    summary: str
    description: str
    tags: tuple[str, ...]
    parameters: tuple[Parameter, ...]
    body: RequestBody | None
    responses: Mapping[str, Any]
    pointer: str
    """JSON pointer of the operation object."""
    deprecated: bool = False

    @property
    def title(self) -> str:
        return f"{self.method.upper()} {self.path}"


@dataclass
class ApiSpec:
    """One loaded spec: its operations (by id and by operationId) and component schemas."""

    name: str
    document: dict[str, Any]
    base_url: str
    operations: dict[str, Operation] = field(default_factory=dict)
    """By operationId (unqualified)."""
    warnings: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        info = self.document.get("info")
        return str(info.get("title", self.name)) if isinstance(info, dict) else self.name

    @property
    def version(self) -> str:
        return str(self.document.get("openapi", "3.0"))

    @property
    def schemas(self) -> dict[str, Any]:
        components = self.document.get("components")
        schemas = components.get("schemas") if isinstance(components, dict) else None
        return schemas if isinstance(schemas, dict) else {}

    @classmethod
    def build(
        cls, name: str, document: dict[str, Any], *, source_url: str = "", base_url: str = "", qualify: bool = False
    ) -> ApiSpec:
        """Walk the paths once. `qualify`: prefix ids with `<name>:` (several specs are configured)."""
        spec = cls(name, document, base_url or server_url(document, source_url))
        taken: set[str] = set()
        planned: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []
        for path, item in document.get("paths", {}).items():
            item = deref(document, item)
            if not isinstance(item, dict):
                continue
            for method in HTTP_METHODS:
                op = item.get(method)
                if isinstance(op, dict):
                    planned.append((path, method, item, op))
                    if isinstance(op.get("operationId"), str):
                        taken.add(op["operationId"])
        used: set[str] = set()
        for path, method, item, op in planned:
            raw_id = op.get("operationId")
            synthesized = not (isinstance(raw_id, str) and raw_id.strip())
            base = synthesized_operation_id(method, path) if synthesized else str(raw_id)
            op_id, counter = base, 1
            while op_id in used or (synthesized and op_id in taken):
                counter += 1
                op_id = f"{base}_{counter}"
            if op_id != base:
                spec.warnings.append(f"{method.upper()} {path}: id {base!r} is used twice; this one is {op_id!r}")
            used.add(op_id)
            pointer = f"#/paths/{_escape(path)}/{method}"
            spec.operations[op_id] = Operation(
                id=f"{name}:{op_id}" if qualify else op_id,
                operation_id=op_id,
                synthesized=synthesized,
                spec=name,
                method=method,
                path=path,
                summary=_text(op.get("summary")),
                description=_text(op.get("description")),
                tags=tuple(str(t) for t in op.get("tags") or () if isinstance(t, str | int)) or ("default",),
                parameters=_parameters(document, path, method, item, op),
                body=_request_body(document, pointer, op.get("requestBody")),
                responses=_mapping(op.get("responses")),
                pointer=pointer,
                deprecated=bool(op.get("deprecated")),
            )
        return spec


def _mapping(value: Any) -> dict[str, Any]:
    """`value` if it is a mapping (as the spec says it should be), else an empty one."""
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def server_url(document: Mapping[str, Any], source_url: str = "") -> str:
    """The first `servers` entry with its variables at their defaults, absolute if the source was a URL."""
    servers = document.get("servers")
    if not isinstance(servers, list) or not servers or not isinstance(servers[0], dict):
        return source_url and urljoin(source_url, "/")
    first = servers[0]
    url = str(first.get("url", ""))
    variables = _mapping(first.get("variables"))
    for var, spec in variables.items():
        if isinstance(spec, dict) and "default" in spec:
            url = url.replace("{" + var + "}", str(spec["default"]))
    if source_url and not re.match(r"^[a-z][a-z0-9+.-]*://", url, re.IGNORECASE):
        url = urljoin(source_url, url)
    return url


def _parameters(
    document: Mapping[str, Any], path: str, method: str, item: Mapping[str, Any], op: Mapping[str, Any]
) -> tuple[Parameter, ...]:
    """Path-level parameters overridden by operation-level ones with the same name and location."""
    merged: dict[tuple[str, str], Parameter] = {}
    for level, raw_list in (("", item.get("parameters")), (f"/{method}", op.get("parameters"))):
        if not isinstance(raw_list, list):
            continue
        for index, raw in enumerate(raw_list):
            pointer = f"#/paths/{_escape(path)}{level}/parameters/{index}"
            if isinstance(raw, dict) and isinstance(raw.get("$ref"), str):
                pointer = raw["$ref"]
            param = deref(document, raw)
            if not isinstance(param, dict) or "name" not in param or "in" not in param:
                continue
            schema = param.get("schema")
            schema_pointer = f"{pointer}/schema"
            if not isinstance(schema, dict):
                # `content` instead of `schema`: take the first media type's schema.
                content = _mapping(param.get("content"))
                media = next(iter(content), None)
                schema = _mapping(content[media]).get("schema", {}) if media else {}
                schema_pointer = f"{pointer}/content/{_escape(media)}/schema" if media else ""
            location = str(param["in"])
            style = str(param.get("style", "form" if location in ("query", "cookie") else "simple"))
            merged[(location, str(param["name"]))] = Parameter(
                name=str(param["name"]),
                location=location,
                required=bool(param.get("required")) or location == "path",
                description=_text(param.get("description")),
                schema=schema if isinstance(schema, dict) else {},
                schema_pointer=schema_pointer,
                style=style,
                explode=bool(param.get("explode", style == "form")),
            )
    return tuple(merged.values())


def _request_body(document: Mapping[str, Any], op_pointer: str, raw: Any) -> RequestBody | None:
    if raw is None:
        return None
    pointer = raw["$ref"] if isinstance(raw, dict) and isinstance(raw.get("$ref"), str) else f"{op_pointer}/requestBody"
    body = deref(document, raw)
    if not isinstance(body, dict):
        return None
    content = _mapping(body.get("content"))
    media = {
        str(kind): (f"{pointer}/content/{_escape(str(kind))}/schema" if isinstance(v, dict) and "schema" in v else "")
        for kind, v in content.items()
    }
    return RequestBody(required=bool(body.get("required")), description=_text(body.get("description")), content=media)
