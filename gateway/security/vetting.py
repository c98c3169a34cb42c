"""Vet upstream tool definitions before they enter the catalog: change detection and injection scan.

The registry passes every rebuild's listings through `ToolVetter.vet`. Per tool:

- its fingerprint is recorded (`gateway.security.integrity`); a change since it was first seen
  is flagged, and under `security.tool_changes: block` the tool is withheld until a
  person runs `mcp-gateway tools approve NAME`;
- its description is scanned (`gateway.security.injection`); under `security.injection`,
  `warn` logs and reports, `strip` removes what was found from the description, and
  `quarantine` withholds the tool until it is approved.

What was found is kept in `reports` (per exposed name) for `mcp-gateway check`, and
logged once per tool and fingerprint. A call of a withheld tool gets `tool_withheld`
(`withheld`), saying why and the command that approves it, not "no tool by that name".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

import anyio
import mcp_types as types

from gateway.catalog import ServerListing, expose_name
from gateway.config.security import SecurityConfig
from gateway.errors import ToolWithheld
from gateway.security.injection import Finding, scan, strip_findings
from gateway.security.integrity import FingerprintStore, canonical, fingerprint

__all__ = ["ToolReport", "ToolVetter"]

logger = logging.getLogger(__name__)


@dataclass
class ToolReport:
    """What vetting found about one tool."""

    server: str
    tool: str
    exposed: str
    changed: bool = False
    findings: list[Finding] = field(default_factory=list)
    action: str = "listed"
    """listed, stripped, or withheld."""

    def lines(self) -> list[str]:
        out = []
        if self.changed:
            out.append("definition changed since it was first seen (approve with `mcp-gateway tools approve`)")
        out += [finding.describe() for finding in self.findings]
        return out


class ToolVetter:
    """Applies `security.tool_changes` and `security.injection` to listings."""

    def __init__(self, store: FingerprintStore, config: SecurityConfig) -> None:
        self.store = store
        self.config = config
        self.reports: dict[str, ToolReport] = {}
        self._logged: set[tuple[str, str, str]] = set()
        self._revision = store.revision()
        self._scans: dict[tuple[str, int], list[Finding]] = {}

    async def watch(self, revet: Callable[[], Awaitable[None]], interval: float = 2.0) -> None:
        """Re-vet (`revet`: rebuild the catalog) whenever `mcp-gateway tools approve` approved something."""
        while True:
            await anyio.sleep(interval)
            now = await anyio.to_thread.run_sync(self.store.revision)
            if now != self._revision:
                self._revision = now
                await revet()

    def vet(self, listings: Sequence[ServerListing]) -> list[ServerListing]:
        names = {listing.server_id: _names(listing) for listing in listings}
        # A server that is down keeps its last reports (check prints them after shutting down).
        reports = {k: r for k, r in self.reports.items() if r.server not in names}
        seen = {
            (listing.server_id, tool.name): (expose_name(listing.prefix, tool.name), fingerprint(tool))
            for listing in listings
            for tool in listing.tools
        }
        tools = {(listing.server_id, tool.name): tool for listing in listings for tool in listing.tools}
        stored = self.store.observe_all(
            [(s, t, exposed, fp) for (s, t), (exposed, fp) in seen.items()],
            lambda server, tool: canonical(tools[(server, tool)]),
        )
        vetted = []
        for listing in listings:
            own = set(names[listing.server_id])  # a name this server also has is not a reference to another
            others = tuple(n for sid, ns in names.items() if sid != listing.server_id for n in ns if n not in own)
            kept: list[types.Tool] = []
            for tool in listing.tools:
                key = (listing.server_id, tool.name)
                exposed, fp = seen[key]
                report = ToolReport(listing.server_id, tool.name, exposed, changed=stored[key][0] == "changed")
                report.findings = self._scan(tool, fp, others)
                shown = self._apply(report, tool, trusted=stored[key][1])
                self._log(report, fp)
                if report.changed or report.findings:
                    reports[report.exposed] = report
                if shown is not None:
                    kept.append(shown)
            vetted.append(replace(listing, tools=kept))
        self.reports = reports
        return vetted

    def withheld(self, name: str) -> ToolWithheld | None:
        """The error for a call of `name` when vetting withholds it (None when it does not)."""
        report = self.reports.get(name)
        if report is None or report.action != "withheld":
            return None
        if report.changed and self.config.tool_changes == "block":
            why, reason = "its definition (description or input schema) changed since it was approved", "changed"
        else:
            why, reason = "its description contains text that looks like instructions to a model", "suspicious"
        command = f"mcp-gateway tools approve {name}"
        return ToolWithheld(
            f"Tool {name!r} is withheld by the gateway: {why}, and the gateway's security policy holds such "
            f"tools back until an operator reviews them. It cannot be called now; an operator can approve it "
            f"with `{command}` (it is then served again within seconds). Use another tool meanwhile.",
            server=report.server,
            details={"reason": reason, "approve_command": command},
        )

    def _scan(self, tool: types.Tool, fp: str, others: tuple[str, ...]) -> list[Finding]:
        """Scan a description, remembering the result per definition and set of other tools."""
        key = (fp, hash(others))
        if key not in self._scans:
            if len(self._scans) > 50_000:
                self._scans.clear()
            self._scans[key] = scan(tool.description or "", others)
        return self._scans[key]

    def _apply(self, report: ToolReport, tool: types.Tool, *, trusted: bool) -> types.Tool | None:
        """The policies: the tool as served (maybe stripped), or None when it is withheld."""
        if report.changed and self.config.tool_changes == "block" and not trusted:
            report.action = "withheld"
            return None
        if report.findings and self.config.injection == "quarantine" and not trusted:
            report.action = "withheld"
            return None
        if report.findings and self.config.injection == "strip":
            report.action = "stripped"
            return tool.model_copy(update={"description": strip_findings(tool.description or "", report.findings)})
        return tool

    def _log(self, report: ToolReport, seen: str) -> None:
        if not (report.changed or report.findings) or (report.server, report.tool, seen) in self._logged:
            return
        self._logged.add((report.server, report.tool, seen))
        for line in report.lines():
            logger.warning("tool %s (server %r, %s): %s", report.exposed, report.server, report.action, line)


def _names(listing: ServerListing) -> list[str]:
    """A server's tool names as another server's description might mention them."""
    return [n for tool in listing.tools for n in (tool.name, expose_name(listing.prefix, tool.name))]
