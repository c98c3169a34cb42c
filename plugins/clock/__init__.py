"""Clock: the current time, time-zone conversion and date arithmetic, as read-only MCP tools.

Language models do not know what time it is and get calendar arithmetic wrong, so
these small, exact tools are the first thing worth putting behind a gateway. Zones
are IANA names resolved by `zoneinfo` (system tz database, or the `tzdata` package).
"""

from __future__ import annotations

import difflib
import functools
import re
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from gateway.config.settings import Settings
from gateway.hookspecs import RegisterServer, hookimpl

__all__ = ["create_server", "gateway_register_servers"]

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False)
"""Every clock tool only reads the clock and computes: safe to call and to retry."""

_WALL_TIME = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_TIMEZONE_EXAMPLE = "an IANA timezone name such as 'Europe/Paris', 'America/New_York' or 'UTC'"
_MOMENT_EXAMPLE = "an ISO 8601 date or date-time such as '2025-03-04' or '2025-03-04T14:30:00+01:00'"


class ZonedTime(BaseModel):
    """One instant as seen in one zone."""

    timezone: str = Field(description="IANA timezone name.")
    iso: str = Field(description="ISO 8601 date-time with UTC offset.")
    weekday: str = Field(description="English weekday name.")
    utc_offset: str = Field(description="Offset from UTC, e.g. '+02:00'.")
    is_dst: bool = Field(description="Whether daylight saving time is in effect.")


class NowResult(ZonedTime):
    """`now`'s structured output."""

    unix_timestamp: int = Field(description="Seconds since 1970-01-01T00:00:00Z.")


class ConversionResult(BaseModel):
    """`convert_time`'s structured output."""

    source: ZonedTime
    target: ZonedTime
    time_difference_hours: float = Field(description="Target UTC offset minus source UTC offset, in hours.")


class DifferenceResult(BaseModel):
    """`date_difference`'s structured output. Every number is negative when end is before start."""

    start: str
    end: str
    total_days: float = Field(description="Whole span in days (fractional).")
    total_hours: float = Field(description="Whole span in hours (fractional).")
    total_minutes: float = Field(description="Whole span in minutes (fractional).")
    days: int = Field(description="Day part of the span as days + hours + minutes + seconds.")
    hours: int = Field(description="Hour part (0-23) of the span.")
    minutes: int = Field(description="Minute part (0-59) of the span.")
    seconds: int = Field(description="Second part (0-59) of the span.")
    business_days: int = Field(description="Monday-Friday dates from start's date up to, not including, end's.")


class AddResult(BaseModel):
    """`add_duration`'s structured output."""

    start: str
    result: str = Field(description="ISO 8601 date (if start was a date and no hours/minutes were added) or date-time.")
    weekday: str = Field(description="English weekday name of the result.")


def _structured(text: str, model: BaseModel) -> CallToolResult:
    """A result with a sentence for people and models, and the same facts as structured content."""
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=model.model_dump(mode="json")
    )


@functools.cache
def _known_zones() -> dict[str, str]:
    """Lower-cased IANA names to their canonical spelling, for lenient lookup and suggestions.

    `localtime` is the host's own zone, not a name a caller means; it is never suggested.
    """
    return {name.lower(): name for name in available_timezones() if name != "localtime"}


def _zone(name: str, param: str) -> ZoneInfo:
    """Resolve an IANA name, or raise a ToolError naming `param` and suggesting close names."""
    canonical = _known_zones().get(name.strip().lower(), name.strip())
    try:
        return ZoneInfo(canonical)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        pass
    message = f"{param} {name!r} is not {_TIMEZONE_EXAMPLE}"
    close = difflib.get_close_matches(name.lower(), _known_zones().keys(), n=3, cutoff=0.6)
    if close:
        message += "; did you mean " + ", ".join(repr(_known_zones()[c]) for c in close) + "?"
    raise ToolError(message)


def _parse_moment(value: str, param: str) -> date | datetime:
    """An ISO 8601 date or date-time (`Z` allowed), or a ToolError naming `param`."""
    text = value.strip()
    try:
        return date.fromisoformat(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ToolError(f"{param} {value!r} is not {_MOMENT_EXAMPLE}") from None


def _as_datetime(moment: date | datetime) -> datetime:
    """Dates become midnight; naive values are taken as UTC so that any two can be compared."""
    if not isinstance(moment, datetime):
        moment = datetime(moment.year, moment.month, moment.day)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _format_offset(delta: timedelta | None) -> str:
    minutes = int((delta or timedelta()).total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _zoned(moment: datetime, zone: tzinfo, zone_name: str) -> ZonedTime:
    local = moment.astimezone(zone)
    return ZonedTime(
        timezone=zone_name,
        iso=local.isoformat(timespec="seconds"),
        weekday=local.strftime("%A"),
        utc_offset=_format_offset(local.utcoffset()),
        is_dst=bool(local.dst()),
    )


def business_days_between(start: date, end: date) -> int:
    """Monday-Friday dates in [start, end); negative when end is before start (like numpy.busday_count)."""
    if end < start:
        return -business_days_between(end, start)
    weeks, rest = divmod((end - start).days, 7)
    return weeks * 5 + sum(1 for i in range(rest) if (start.weekday() + i) % 7 < 5)


def add_business_days(start: date, count: int) -> date:
    """Step `count` Monday-Friday days from start, skipping weekends (like a spreadsheet's WORKDAY)."""
    step = 1 if count >= 0 else -1
    current = start
    for _ in range(abs(count)):
        current += timedelta(days=step)
        while current.weekday() >= 5:
            current += timedelta(days=step)
    return current


async def now(
    timezone: Annotated[str, Field(description=f"Where to read the clock: {_TIMEZONE_EXAMPLE}.")] = "UTC",
) -> Annotated[CallToolResult, NowResult]:
    """What time is it now: the current date and time in a timezone (ISO 8601, weekday, UTC offset, DST flag, unix
    timestamp)."""
    zone = _zone(timezone, "timezone")
    instant = datetime.now(UTC)
    zoned = _zoned(instant, zone, zone.key)
    result = NowResult(**zoned.model_dump(), unix_timestamp=int(instant.timestamp()))
    text = f"{result.weekday} {result.iso} in {zone.key} (UTC{result.utc_offset})"
    text += f", unix time {result.unix_timestamp}"
    return _structured(text, result)


async def convert_time(
    time: Annotated[
        str,
        Field(
            description="Wall-clock 'HH:MM' (today in from_timezone) or an ISO 8601 date-time. "
            "A date-time with its own UTC offset is taken as that exact instant."
        ),
    ],
    from_timezone: Annotated[str, Field(description=f"Zone `time` is read in: {_TIMEZONE_EXAMPLE}.")],
    to_timezone: Annotated[str, Field(description=f"Zone to convert into: {_TIMEZONE_EXAMPLE}.")],
) -> Annotated[CallToolResult, ConversionResult]:
    """Convert a time between two timezones, with the offset difference in hours."""
    source_zone = _zone(from_timezone, "from_timezone")
    target_zone = _zone(to_timezone, "to_timezone")
    if match := _WALL_TIME.match(time.strip()):
        hour, minute, second = (int(part or 0) for part in match.groups())
        if hour > 23 or minute > 59 or second > 59:
            raise ToolError(f"time {time!r} is not a valid wall-clock time; use 'HH:MM' with HH 00-23")
        today = datetime.now(source_zone).date()
        moment = datetime(today.year, today.month, today.day, hour, minute, second, tzinfo=source_zone)
    else:
        try:
            moment = datetime.fromisoformat(time.strip())
        except ValueError:
            raise ToolError(
                f"time {time!r} is neither 'HH:MM' nor an ISO 8601 date-time such as '2025-03-04T14:30'"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=source_zone)
    if moment.tzinfo is source_zone:
        # A wall time skipped by a DST jump does not survive a round trip through UTC.
        round_trip = moment.astimezone(UTC).astimezone(source_zone)
        if round_trip.replace(tzinfo=None) != moment.replace(tzinfo=None):
            raise ToolError(
                f"time {time!r} does not exist in {source_zone.key} on {moment.date()} "
                "(the clocks skip it for daylight saving time)"
            )
    source = _zoned(moment, source_zone, source_zone.key)
    target = _zoned(moment, target_zone, target_zone.key)
    source_offset = moment.astimezone(source_zone).utcoffset() or timedelta()
    target_offset = moment.astimezone(target_zone).utcoffset() or timedelta()
    difference = (target_offset - source_offset).total_seconds() / 3600
    result = ConversionResult(source=source, target=target, time_difference_hours=difference)
    relation = (
        "the same offset as"
        if difference == 0
        else f"{abs(difference):g}h {'ahead of' if difference > 0 else 'behind'}"
    )
    text = (
        f"{source.iso} ({source.weekday}) in {source.timezone} is {target.iso} ({target.weekday}) in "
        f"{target.timezone}; {target.timezone} is {relation} {source.timezone}"
    )
    return _structured(text, result)


async def date_difference(
    start: Annotated[str, Field(description=f"{_MOMENT_EXAMPLE}; without an offset it is taken as UTC.")],
    end: Annotated[str, Field(description=f"{_MOMENT_EXAMPLE}; without an offset it is taken as UTC.")],
) -> Annotated[CallToolResult, DifferenceResult]:
    """How long between two dates or date-times (how many days until or since): total days/hours/minutes, a
    breakdown, and business days."""
    start_moment = _as_datetime(_parse_moment(start, "start"))
    end_moment = _as_datetime(_parse_moment(end, "end"))
    span = end_moment - start_moment
    sign = -1 if span < timedelta() else 1
    days, remainder = divmod(int(abs(span).total_seconds()), 86400)
    hours, remainder = divmod(remainder, 3600)
    minutes, seconds = divmod(remainder, 60)
    total_seconds = span.total_seconds()
    result = DifferenceResult(
        start=start_moment.isoformat(),
        end=end_moment.isoformat(),
        total_days=round(total_seconds / 86400, 6),
        total_hours=round(total_seconds / 3600, 4),
        total_minutes=round(total_seconds / 60, 2),
        days=sign * days,
        hours=sign * hours,
        minutes=sign * minutes,
        seconds=sign * seconds,
        business_days=business_days_between(start_moment.date(), end_moment.date()),
    )
    text = (
        f"{'-' if sign < 0 else ''}{days} days {hours} hours {minutes} minutes {seconds} seconds "
        f"({result.total_hours:g} hours) from {result.start} to {result.end}; "
        f"{result.business_days} business days (Mon-Fri, end date excluded)"
    )
    return _structured(text, result)


async def add_duration(
    start: Annotated[str, Field(description=f"{_MOMENT_EXAMPLE}.")],
    days: Annotated[int, Field(description="Calendar days to add (negative subtracts).", ge=-365_000, le=365_000)] = 0,
    hours: Annotated[int, Field(description="Hours to add (negative subtracts).", ge=-8_760_000, le=8_760_000)] = 0,
    minutes: Annotated[int, Field(description="Minutes to add (negative subtracts).")] = 0,
    business_days: Annotated[
        int,
        Field(
            description="Monday-Friday days to add first, skipping weekends (negative goes back).",
            ge=-10_000,
            le=10_000,
        ),
    ] = 0,
) -> Annotated[CallToolResult, AddResult]:
    """Add business days, then days, hours and minutes, to a date or date-time."""
    moment = _parse_moment(start, "start")
    try:
        if business_days:
            moment = (
                datetime.combine(add_business_days(moment.date(), business_days), moment.timetz())
                if isinstance(moment, datetime)
                else add_business_days(moment, business_days)
            )
        if (hours or minutes) and not isinstance(moment, datetime):
            moment = datetime(moment.year, moment.month, moment.day)
        moment = moment + timedelta(days=days, hours=hours, minutes=minutes)
    except OverflowError:
        raise ToolError("the result is outside the years 1-9999; use smaller days, hours or minutes") from None
    result = AddResult(start=start, result=moment.isoformat(), weekday=moment.strftime("%A"))
    return _structured(f"{result.result} ({result.weekday})", result)


def create_server() -> MCPServer:
    """Build the clock server; the gateway and the tests use the same object."""
    server: MCPServer = MCPServer(
        "clock",
        instructions="Exact current time, timezone conversion and date arithmetic. Timezones are IANA names.",
    )
    for tool in (now, convert_time, date_difference, add_duration):
        server.add_tool(tool, annotations=READ_ONLY)
    return server


@hookimpl
def gateway_register_servers(register: RegisterServer, settings: Settings) -> None:
    """Serve the clock; it needs no settings."""
    register(
        "clock",
        create_server(),
        description="Current time in any timezone, timezone conversion, and date/time arithmetic.",
        capabilities=["time", "timezone", "date", "calendar", "business-days"],
    )
