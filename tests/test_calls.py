"""The call chain's middleware, one at a time, then the whole chain against a real in-memory server."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.server import MCPServer

from gateway.calls import ToolCall, compose
from gateway.calls.breaker import CircuitBreaker, CircuitBreakers
from gateway.calls.retry import Retries
from gateway.calls.timeout import apply_timeout
from gateway.calls.validation import ArgumentValidator, signature
from gateway.config.settings import Settings
from gateway.errors import (
    CircuitOpen,
    ExceededRetries,
    GatewayError,
    InvalidArguments,
    OutcomeUnknown,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.registry import Registry
from gateway.upstreams.upstream import UpstreamSpec

pytestmark = pytest.mark.anyio

SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1},
        "order": {"enum": ["asc", "desc"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["query"],
    "additionalProperties": False,
}
TOOL = types.Tool(name="search", input_schema=SCHEMA)
OK = types.CallToolResult(content=[types.TextContent(type="text", text="ok")])


def make_call(
    send: Callable[[dict[str, Any] | None], Any], *, idempotent: bool = False, timeout: float = 5
) -> ToolCall:
    return ToolCall(
        server="s",
        name="s__search",
        original="search",
        tool=TOOL,
        arguments={"query": "x"},
        send=send,
        timeout=timeout,
        idempotent=idempotent,
    )


class Script:
    """A `send` that raises the given errors in turn, then answers OK; counts its calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self, arguments: dict[str, Any] | None) -> types.CallToolResult:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return OK


# ---- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "parameter 'query' is required"),
        ({"query": "x", "limit": "ten"}, "parameter 'limit': 'ten' is not of type 'integer'"),
        ({"query": "x", "limit": 0}, "parameter 'limit': 0 is less than the minimum of 1"),
        ({"query": "x", "order": "up"}, "parameter 'order': 'up' is not one of ['asc', 'desc']"),
        ({"query": "x", "tags": ["a", 3]}, "parameter 'tags[1]': 3 is not of type 'string'"),
        ({"query": "x", "color": "red"}, "unknown parameters are not allowed ('color' was unexpected)"),
    ],
)
def test_a_bad_argument_is_named_with_what_is_wrong(arguments: dict[str, Any], problem: str) -> None:
    assert ArgumentValidator().problem("s", TOOL, arguments) == problem


def test_fitting_arguments_and_a_broken_schema_pass() -> None:
    validator = ArgumentValidator()
    assert validator.problem("s", TOOL, {"query": "x", "limit": 3, "tags": []}) is None
    broken = types.Tool(name="odd", input_schema={"type": "object", "properties": {"a": {"type": "nonsense"}}})
    assert validator.problem("s", broken, {"a": 1}) is None  # the upstream's mistake is not the caller's


def test_the_signature_says_what_the_tool_takes() -> None:
    assert signature("s__search", TOOL) == (
        "s__search(query: string, limit?: integer, order?: 'asc' | 'desc', tags?: array of string)"
    )


async def test_invalid_arguments_never_reach_the_upstream() -> None:
    script = Script()
    with pytest.raises(InvalidArguments, match=r"parameter 'query' is required\. Expected: s__search\(query: "):
        await compose([ArgumentValidator()])(replace(make_call(script), arguments={}))
    assert script.calls == 0


# ---- timeout --------------------------------------------------------------------------------------


async def test_a_call_past_its_timeout_is_cancelled_with_upstream_timeout() -> None:
    cancelled = anyio.Event()

    async def hang(arguments: dict[str, Any] | None) -> types.CallToolResult:
        try:
            await anyio.sleep(math.inf)
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    with pytest.raises(UpstreamTimeout) as caught:
        await compose([apply_timeout])(make_call(hang, timeout=0.05))
    assert cancelled.is_set() and caught.value.details == {"timeout_seconds": 0.05}


@pytest.mark.parametrize(
    ("idempotent", "advice"),
    [(True, "Try again later"), (False, "check whether its effect happened")],
)
async def test_a_timeout_tells_the_model_to_check_before_repeating_a_tool_that_is_not_safe_to_repeat(
    idempotent: bool, advice: str
) -> None:
    async def hang(arguments: dict[str, Any] | None) -> types.CallToolResult:
        await anyio.sleep(math.inf)
        raise AssertionError("unreachable")

    with pytest.raises(UpstreamTimeout) as caught:
        await compose([apply_timeout])(make_call(hang, idempotent=idempotent, timeout=0.05))
    assert advice in caught.value.message
    assert ("Try again" in caught.value.message) is idempotent


async def test_calls_under_way_each_meet_their_own_deadline_and_no_other() -> None:
    """The deadlines share one timer: a short one cuts only its own call, a longer one that ends in
    time is left alone, and one past its own time is cut in turn; calls that ended leave nothing behind."""
    ended: list[str] = []

    def sleeper(name: str, seconds: float) -> Callable[[dict[str, Any] | None], Any]:
        async def send(arguments: dict[str, Any] | None) -> types.CallToolResult:
            await anyio.sleep(seconds)
            ended.append(name)
            return OK

        return send

    outcomes: dict[str, str] = {}

    async def run(name: str, seconds: float, timeout: float) -> None:
        try:
            await compose([apply_timeout])(make_call(sleeper(name, seconds), timeout=timeout))
            outcomes[name] = "ok"
        except UpstreamTimeout:
            outcomes[name] = "timeout"

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "short", math.inf, 0.05)
        tg.start_soon(run, "in time", 0.15, 5.0)
        tg.start_soon(run, "quick", 0.0, 0.05)
        tg.start_soon(run, "long", math.inf, 0.3)
        tg.start_soon(run, "unbounded", 0.0, math.inf)
    assert outcomes == {"short": "timeout", "in time": "ok", "quick": "ok", "long": "timeout", "unbounded": "ok"}
    assert sorted(ended) == ["in time", "quick", "unbounded"]
    for _ in range(3):  # the same timeout again, after the first ones ended: the timer is set anew
        await run("again", math.inf, 0.05)
        assert outcomes["again"] == "timeout"


# ---- circuit breaker ----------------------------------------------------------------------------


def test_the_breaker_opens_after_consecutive_failures_and_probes_once_after_the_reset_time() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=3, reset_seconds=10, clock=lambda: now[0])
    for _ in range(2):
        assert breaker.admit()
        breaker.failed()
    breaker.succeeded()  # a success in between starts the count over
    for _ in range(3):
        assert breaker.admit()
        breaker.failed()
    assert breaker.state == "open" and not breaker.admit()
    now[0] = 10.0
    assert breaker.state == "half-open"
    assert breaker.admit() and not breaker.admit()  # one probe at a time
    breaker.failed()  # the probe failed: open for another period
    assert breaker.state == "open" and breaker.seconds_left() == 10
    now[0] = 20.0
    assert breaker.admit()
    breaker.succeeded()
    assert breaker.state == "closed" and breaker.admit()


async def test_the_breaker_middleware_counts_only_upstream_failures() -> None:
    breakers = CircuitBreakers(failures=2, reset_seconds=30)
    chain = compose([breakers])
    for error in (InvalidArguments("bad"), GatewayError("other"), InvalidArguments("bad")):
        with pytest.raises(GatewayError):
            await chain(make_call(Script(error)))
    assert breakers.state("s") == "closed"
    for _ in range(2):
        with pytest.raises(UpstreamUnavailable):
            await chain(make_call(Script(UpstreamUnavailable("down", server="s"))))
    script = Script()
    with pytest.raises(CircuitOpen, match=r"failed 2 calls in a row.*30 s more") as caught:
        await chain(make_call(script))
    assert script.calls == 0 and caught.value.details["retry_after_seconds"] == 30


# ---- retries ------------------------------------------------------------------------------------


def retries(eta: float = 0.0, attempts: int = 3) -> Retries:
    async def ready(server: str, seconds: float) -> None:
        pass

    return Retries(attempts, 5, eta=lambda server: eta, wait_ready=ready, initial_wait=0.001, max_wait=0.01)


async def test_a_failure_before_sending_is_retried_even_for_a_non_idempotent_tool() -> None:
    script = Script(UpstreamUnavailable("not connected"), UpstreamUnavailable("not connected"))
    assert await compose([retries()])(make_call(script)) == OK
    assert script.calls == 3


async def test_a_non_idempotent_call_lost_after_a_retry_sent_it_is_outcome_unknown_not_exceeded_retries() -> None:
    script = Script(UpstreamUnavailable("not connected"), UpstreamUnavailable("died", sent=True))
    with pytest.raises(OutcomeUnknown) as caught:
        await compose([retries()])(make_call(script, idempotent=False))
    assert script.calls == 2 and caught.value.details["attempts"] == 2


async def test_after_sending_only_an_idempotent_tool_is_retried() -> None:
    script = Script(UpstreamUnavailable("died", sent=True))
    with pytest.raises(OutcomeUnknown, match="may or may not have run") as caught:
        await compose([retries()])(make_call(script, idempotent=False))
    assert script.calls == 1 and caught.value.code == "outcome_unknown"
    assert caught.value.details == {"attempts": 1, "cause": "died"}
    script = Script(UpstreamUnavailable("died", sent=True))
    assert await compose([retries()])(make_call(script, idempotent=True)) == OK
    assert script.calls == 2


@pytest.mark.parametrize("error", [UpstreamTimeout("slow", sent=True), CircuitOpen("open"), InvalidArguments("bad")])
async def test_timeouts_open_breakers_and_bad_arguments_are_not_retried(error: GatewayError) -> None:
    script = Script(error)
    with pytest.raises(type(error)):
        await compose([retries()])(make_call(script, idempotent=True))
    assert script.calls == 1


async def test_a_server_that_will_not_be_back_within_the_budget_is_not_waited_for() -> None:
    script = Script(UpstreamUnavailable("down; reconnects in 60 s"))
    with pytest.raises(UpstreamUnavailable):
        await compose([retries(eta=60)])(make_call(script))
    assert script.calls == 1


async def test_running_out_of_attempts_says_how_many_and_the_last_error() -> None:
    script = Script(*(UpstreamUnavailable(f"refused #{i}") for i in range(1, 4)))
    with pytest.raises(ExceededRetries, match=r"after 3 attempts .* Last error: refused #3") as caught:
        await compose([retries(attempts=3)])(make_call(script))
    assert caught.value.details == {"attempts": 3, "last_code": "upstream_unavailable"}


# ---- the whole chain, against a real server -----------------------------------------------------


async def test_the_registry_validates_arguments_before_calling_a_real_server() -> None:
    calls: list[int] = []
    server = MCPServer("maths")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append(1)
        return a + b

    spec = UpstreamSpec(id="maths", prefix="maths", transport="memory", target=server)
    registry = Registry([spec], Settings())
    with anyio.fail_after(20):
        async with registry.running():
            await registry.wait_settled(10)
            with pytest.raises(InvalidArguments) as caught:
                await registry.call_tool("maths__add", {"a": "one", "b": 2})
            assert caught.value.message == (
                "Invalid arguments for 'maths__add': parameter 'a': 'one' is not of type 'integer'. "
                "Expected: maths__add(a: integer, b: integer)."
            )
            assert calls == []
            result = await registry.call_tool("maths__add", {"a": 1, "b": 2})
            assert result.structured_content == {"result": 3} and calls == [1]


# ---- composing --------------------------------------------------------------------------------


class _Check:
    """A check layer (`chain.CheckLayer`) that notes its name, and refuses when told to."""

    def __init__(self, name: str, seen: list[str], refuse: bool = False) -> None:
        self.name, self.seen, self.refuse = name, seen, refuse

    def check(self, call: ToolCall) -> None:
        self.seen.append(self.name)
        if self.refuse:
            raise InvalidArguments(f"refused by {self.name}")

    async def __call__(self, call: ToolCall, call_next: Any) -> types.CallToolResult:
        self.check(call)
        return await call_next(call)


async def test_check_layers_run_in_order_between_the_layers_around_them_and_a_refusal_reaches_those_outside() -> None:
    seen: list[str] = []
    caught: list[BaseException] = []

    async def outer(call: ToolCall, call_next: Any) -> types.CallToolResult:
        seen.append("outer")
        try:
            return await call_next(call)
        except GatewayError as exc:
            caught.append(exc)
            raise

    async def middle(call: ToolCall, call_next: Any) -> types.CallToolResult:
        seen.append("middle")
        return await call_next(call)

    script = Script()
    chain = compose([outer, _Check("a", seen), _Check("b", seen), middle, _Check("c", seen)])
    assert await chain(make_call(script)) == OK
    assert seen == ["outer", "a", "b", "middle", "c"] and script.calls == 1

    seen.clear()
    refusing = compose([outer, _Check("a", seen), _Check("b", seen, refuse=True), middle, _Check("c", seen)])
    with pytest.raises(InvalidArguments, match="refused by b"):
        await refusing(make_call(script))
    assert seen == ["outer", "a", "b"] and script.calls == 1
    assert len(caught) == 1 and isinstance(caught[0], InvalidArguments)


async def test_a_chain_of_checks_alone_runs_them_before_the_call() -> None:
    seen: list[str] = []
    script = Script()
    assert await compose([_Check("a", seen), _Check("b", seen)])(make_call(script)) == OK
    assert seen == ["a", "b"] and script.calls == 1
