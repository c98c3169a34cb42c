"""`generate_sql`: the client's own model writes the SQL, through MCP sampling; the gateway holds no API key.

Each attempt is one sampling request, made by the SDK's resolver mechanism
(`Resolve` + `Sample`), so it works on both protocol eras: a mid-call
`sampling/createMessage` request for handshake-era clients, an `InputRequiredResult`
round for 2026-07-28 ones. The retries form a chain of resolvers built for the
configured `max_retries`: attempt k+1 is asked only when attempt k failed
validation, and its prompt carries every earlier answer with the reason it was
rejected. Validation parses the statement (the same policy as `execute_sql`) and runs
EXPLAIN on it; the SQL is never executed.

This module does not use `from __future__ import annotations`: the resolver chain is
built from closures, and the SDK reads their `Annotated[..., Resolve(fn)]`
annotations as objects, which must refer to the closure of the previous step.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from .database import DatabaseError
from .refused import SqlRefused
from .results import GeneratedSql, pipe_table
from .schema import render_schema
from .service import SqlService

__all__ = ["EXCEEDED_RETRIES", "Attempt", "add_generate_sql", "extract_sql"]

EXCEEDED_RETRIES = "EXCEEDED_RETRIES"
MAX_TOKENS = 1024
_FENCE = re.compile(r"```(?:sql|SQL|postgresql|sqlite)?\s*\n?(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Attempt:
    """One sampled answer and what validation made of it."""

    number: int
    reply: str
    sql: str
    error: str | None
    kind: str = ""
    label: str = ""
    plan: list[list[Any]] = field(default_factory=list)
    earlier: tuple["Attempt", ...] = ()


def extract_sql(reply: str) -> str:
    """The SQL in a model's reply: the first fenced code block, else the whole reply."""
    match = _FENCE.search(reply)
    return (match.group(1) if match else reply).strip().rstrip(";").strip()


def _system_prompt(service: SqlService) -> str:
    return (
        f"You write SQL for a {service.dialect_name} database. Use only the tables and columns of the schema "
        "you are given. Answer with exactly one SQL statement in a ```sql code block, and nothing else."
    )


def _question(service: SqlService, prompt: str, schema_text: str) -> str:
    context = service.context.text().strip()
    parts = [f"Database schema ({service.dialect_name}):\n\n{schema_text}"]
    if context:
        parts.append(f"Notes about this database from its owners:\n\n{context}")
    parts.append(f"Write one SQL statement for this request:\n\n{prompt}")
    return "\n\n".join(parts)


def _text(message: str) -> types.TextContent:
    return types.TextContent(type="text", text=message)


def _conversation(question: str, earlier: tuple[Attempt, ...]) -> list[types.SamplingMessage]:
    messages = [types.SamplingMessage(role="user", content=_text(question))]
    for attempt in earlier:
        messages.append(types.SamplingMessage(role="assistant", content=_text(attempt.reply or "(no text)")))
        messages.append(
            types.SamplingMessage(
                role="user",
                content=_text(
                    f"That SQL is not valid: {attempt.error}\nReply with a corrected statement, "
                    "in one ```sql code block."
                ),
            )
        )
    return messages


def _validate(service: SqlService, number: int, reply: str, earlier: tuple[Attempt, ...]) -> Attempt:
    """Parse and EXPLAIN the answer; never run it."""
    sql = extract_sql(reply)
    if not sql:
        return Attempt(number, reply, sql, "the reply contained no SQL", earlier=earlier)
    try:
        classified = service.classify(sql)
        if len(classified.statements) != 1:
            raise SqlRefused(f"expected exactly one statement, got {len(classified.statements)}")
        statement = classified.statements[0]
        plan = service.database.explain(statement.sql, service.limits.timeout_ms)
    except (SqlRefused, DatabaseError) as error:
        return Attempt(number, reply, sql, str(error), earlier=earlier)
    kind = "read" if statement.kind == "read" else "write"
    return Attempt(number, reply, sql, None, kind, statement.label, plan.rows, earlier)


def _reply_text(answer: types.CreateMessageResult) -> str:
    content = answer.content
    return content.text if isinstance(content, types.TextContent) else ""


def _require_sampling(ctx: Context) -> None:
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.sampling is None:
        raise ToolError(
            "generate_sql asks the client's own model to write the SQL through MCP sampling, and this client "
            "does not support sampling (it declared no 'sampling' capability). Use a client that supports "
            "sampling, or write the SQL yourself from describe_schema and check it with execute_sql (dry_run=true)."
        )


def _chain(service: SqlService, max_retries: int) -> Callable[..., Attempt]:
    """Resolvers ask(0) → judge(0) → ask(1) → judge(1) …; the last judge's Attempt is the outcome."""

    async def ask_first(prompt: str, ctx: Context) -> Sample:
        _require_sampling(ctx)
        schema = await service.schema()
        question = _question(service, prompt, render_schema(schema, "markdown"))
        return Sample(_conversation(question, ()), max_tokens=MAX_TOKENS, system_prompt=_system_prompt(service))

    def judge_first(answer: Annotated[types.CreateMessageResult, Resolve(ask_first)]) -> Attempt:
        return _validate(service, 1, _reply_text(answer), ())

    judge: Callable[..., Attempt] = judge_first
    for number in range(2, max_retries + 2):

        def make_step(previous: Callable[..., Attempt], number: int) -> Callable[..., Attempt]:
            async def ask_again(prior: Annotated[Attempt, Resolve(previous)], prompt: str) -> Sample | Attempt:
                if prior.error is None:
                    return prior
                schema = await service.schema()
                question = _question(service, prompt, render_schema(schema, "markdown"))
                history = (*prior.earlier, prior)
                return Sample(
                    _conversation(question, history), max_tokens=MAX_TOKENS, system_prompt=_system_prompt(service)
                )

            def judge_again(
                answer: Annotated[Any, Resolve(ask_again)], prior: Annotated[Attempt, Resolve(previous)]
            ) -> Attempt:
                if isinstance(answer, Attempt):
                    return answer
                return _validate(service, number, _reply_text(answer), (*prior.earlier, prior))

            return judge_again

        judge = make_step(judge, number)
    return judge


def _exceeded(final: Attempt, max_retries: int) -> types.CallToolResult:
    history = (*final.earlier, final)
    reasons = "\n".join(f"{a.number}. {a.sql or '(no SQL)'}\n   rejected: {a.error}" for a in history)
    text = (
        f"{EXCEEDED_RETRIES}: no valid SQL after {len(history)} attempts (max_retries={max_retries}). "
        f"Last SQL: {final.sql or '(none)'}\nAttempts:\n{reasons}"
    )
    details = {
        "code": EXCEEDED_RETRIES,
        "last_sql": final.sql,
        "attempts": len(history),
        "errors": [a.error for a in history],
    }
    return types.CallToolResult(
        content=[_text(text)], structured_content=details, is_error=True, _meta={"mcp-gateway/error": details}
    )


def add_generate_sql(
    server: MCPServer, service: SqlService, max_retries: int, annotations: types.ToolAnnotations
) -> None:
    """Register `generate_sql` on `server`, with a resolver chain of `max_retries + 1` attempts."""
    final_judge = _chain(service, max_retries)

    @server.tool(annotations=annotations)
    async def generate_sql(
        prompt: Annotated[str, Field(description="What the SQL should do, in plain language.", min_length=1)],
        outcome: Annotated[Attempt, Resolve(final_judge)],
    ) -> Annotated[types.CallToolResult, GeneratedSql]:
        """Write SQL for a plain-language request with the client's own model (MCP sampling), checked by
        parsing and EXPLAIN and retried with the error; returns the SQL and its plan. It never runs it:
        use execute_sql for that. Needs a client that supports sampling."""
        if outcome.error is not None:
            return _exceeded(outcome, max_retries)
        note = "Not executed. Run it with execute_sql"
        if outcome.kind == "write":
            note += " (a write: dry run first, then confirm with the token)"
            if service.database.read_only:
                note = "Not executed. The database is read_only, so execute_sql would refuse this write"
        result = GeneratedSql(
            sql=outcome.sql,
            kind="write" if outcome.kind == "write" else "read",
            label=outcome.label,
            attempts=outcome.number,
            plan=outcome.plan,
            rejected=[a.error or "" for a in outcome.earlier],
            note=note + ".",
        )
        plan = pipe_table(["plan"], [[row[-1]] for row in outcome.plan if row])
        tries = f" (after {outcome.number} attempts)" if outcome.number > 1 else ""
        text = f"```sql\n{outcome.sql}\n```\n{result.note}{tries}\n\nPlan:\n{plan}"
        return types.CallToolResult(content=[_text(text)], structured_content=result.model_dump(mode="json"))
