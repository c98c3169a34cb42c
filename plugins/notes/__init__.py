"""Notes: a small markdown notebook served over MCP.

Each note is one markdown file, `<name>.md`, with YAML front matter (title, tags,
created) in `settings.data_dir / "notes"`, so people can read and edit notes with
any editor. With a PostgreSQL `GATEWAY_DATABASE_URL` the same markdown lives in the table
`plugin_notes` of that database instead (`SharedNoteStore`), so every replica of a deployment
serves the same notebook. Beyond being useful on its own, this server exercises every MCP feature
the gateway proxies: tools, resources, a resource template, prompts, completion,
resources list-changed events and progress notifications.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
import threading
import unicodedata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import anyio.to_thread
import yaml
from mcp.server import MCPServer
from mcp.server.mcpserver import Context, UserMessage
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CallToolResult,
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    Resource,
    ResourceTemplateReference,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, Field

from gateway.config.settings import Settings
from gateway.hookspecs import RegisterServer, hookimpl
from gateway.sizes import surrogate_refusal

__all__ = [
    "Note",
    "NoteStore",
    "NotesServer",
    "SharedNoteStore",
    "create_server",
    "gateway_register_servers",
    "slugify",
]

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
NAME_RULE = "lowercase letters, digits and '-', starting with a letter or digit, at most 64 characters"
MAX_NAME = 64
TEMPLATE_URI = "note://{name}"
INDEX_URI = "notes://index"
MARKDOWN = "text/markdown"
MAX_COMPLETIONS = 100
"""The spec caps completion values at 100 per response."""

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False)


def slugify(title: str) -> str:
    """The note name a title gets: ASCII-folded, lowercase, dashes for everything else."""
    folded = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", folded.lower()).strip("-")
    return slug[:MAX_NAME].rstrip("-") or "note"


def _normalize_tags(tags: Sequence[str]) -> list[str]:
    """Lowercase, `#`-less, dash-joined, de-duplicated tags, so `#Work` and `work` are one tag."""
    seen: dict[str, None] = {}
    for tag in tags:
        clean = re.sub(r"\s+", "-", tag.strip().lstrip("#").strip().lower())
        if clean:
            seen.setdefault(clean, None)
    return list(seen)


@dataclass(frozen=True)
class Note:
    """One parsed note file."""

    name: str
    title: str
    tags: tuple[str, ...]
    text: str
    created: str

    @property
    def uri(self) -> str:
        return f"note://{self.name}"

    def render(self) -> str:
        """The note as markdown: YAML front matter (title, tags, created if known), then the body."""
        header: dict[str, Any] = {"title": self.title, "tags": list(self.tags)}
        if self.created:
            header["created"] = self.created
        front = yaml.safe_dump(header, sort_keys=False, allow_unicode=True, default_flow_style=None)
        return f"---\n{front}---\n\n{self.text.strip()}\n"

    @classmethod
    def parse(cls, name: str, content: str) -> Note:
        """Read a note file leniently: a hand-written file without front matter is still a note."""
        header: dict[str, Any] = {}
        content = content.replace("\r\n", "\n")
        body = content
        if content.startswith("---\n") and (end := content.find("\n---\n", 3)) != -1:
            try:
                loaded = yaml.safe_load(content[4:end])
            except yaml.YAMLError:
                loaded = None
            if isinstance(loaded, dict):
                header, body = loaded, content[end + 5 :]
        title = str(header.get("title") or "").strip()
        if not title:
            heading = re.search(r"^#\s+(.+)$", body, re.MULTILINE)
            title = heading.group(1).strip() if heading else name
        raw_tags = header.get("tags")
        tags = _normalize_tags([str(t) for t in raw_tags]) if isinstance(raw_tags, list) else []
        return cls(name, title, tuple(tags), body.strip(), str(header.get("created") or ""))


class NoteStore:
    """The notes directory. Writers are serialised by a lock; every write is temp file + rename.

    Readers take no lock: a rename replaces a file atomically, so they see a whole old
    or a whole new note, never half of one. The directory is created on first write.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.md"

    def names(self) -> list[str]:
        """Every note name, sorted. Temp files and foreign files are not notes."""
        if not self.directory.is_dir():
            return []
        return sorted(p.stem for p in self.directory.glob("*.md") if NAME_PATTERN.match(p.stem))

    def get(self, name: str) -> Note | None:
        """The note, or None if there is none by that name (or it was deleted meanwhile)."""
        if not NAME_PATTERN.match(name):
            return None
        try:
            return Note.parse(name, self._path(name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def all(self) -> list[Note]:
        return [note for name in self.names() if (note := self.get(name)) is not None]

    def add(self, title: str, text: str, tags: Sequence[str]) -> Note:
        """Create a note named after the title; `-2`, `-3`, ... keeps names unique."""
        base = slugify(title)
        created = datetime.now(UTC).isoformat(timespec="seconds")
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            name, counter = base, 1
            while self._path(name).exists():
                counter += 1
                suffix = f"-{counter}"
                name = base[: MAX_NAME - len(suffix)].rstrip("-") + suffix
            note = Note(name, title.strip(), tuple(_normalize_tags(tags)), text, created)
            self._write_atomically(self._path(name), note.render())
        return note

    def delete(self, name: str) -> Note | None:
        """Remove the note and return what it was, or None if it did not exist."""
        with self._lock:
            note = self.get(name)
            if note is not None:
                self._path(name).unlink(missing_ok=True)
        return note

    def _write_atomically(self, path: Path, content: str) -> None:
        fd, temp = tempfile.mkstemp(dir=self.directory, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise


class SharedNoteStore:
    """The notebook in a PostgreSQL database, one row of rendered markdown per note: what `NoteStore`
    keeps in files, shared by every replica. One short connection per operation (notes are few and
    slow); names are chosen and rows written under an advisory lock, so two replicas adding the same
    title at once get `name` and `name-2`."""

    _LOCK = 0x6D636E74  # "mcnt"

    def __init__(self, url: str) -> None:
        self.url = url
        self._ready = False

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        import psycopg  # the gateway's own dependency; imported only when a database is configured

        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as db, db.transaction():
            cursor = db.cursor()
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (self._LOCK,))
            if not self._ready:
                cursor.execute("CREATE TABLE IF NOT EXISTS plugin_notes (name TEXT PRIMARY KEY, content TEXT NOT NULL)")
                self._ready = True
            yield cursor

    def names(self) -> list[str]:
        with self._transaction() as cursor:
            cursor.execute("SELECT name FROM plugin_notes ORDER BY name")
            return [str(row[0]) for row in cursor.fetchall()]

    def get(self, name: str) -> Note | None:
        if not NAME_PATTERN.match(name):
            return None
        with self._transaction() as cursor:
            cursor.execute("SELECT content FROM plugin_notes WHERE name = %s", (name,))
            row = cursor.fetchone()
        return None if row is None else Note.parse(name, str(row[0]))

    def all(self) -> list[Note]:
        with self._transaction() as cursor:
            cursor.execute("SELECT name, content FROM plugin_notes ORDER BY name")
            return [Note.parse(str(name), str(content)) for name, content in cursor.fetchall()]

    def add(self, title: str, text: str, tags: Sequence[str]) -> Note:
        base = slugify(title)
        created = datetime.now(UTC).isoformat(timespec="seconds")
        with self._transaction() as cursor:
            cursor.execute("SELECT name FROM plugin_notes WHERE name = %s OR name LIKE %s", (base, f"{base}-%"))
            taken = {str(row[0]) for row in cursor.fetchall()}
            name, counter = base, 1
            while name in taken:
                counter += 1
                suffix = f"-{counter}"
                name = base[: MAX_NAME - len(suffix)].rstrip("-") + suffix
            note = Note(name, title.strip(), tuple(_normalize_tags(tags)), text, created)
            cursor.execute("INSERT INTO plugin_notes VALUES (%s, %s)", (name, note.render()))
        return note

    def delete(self, name: str) -> Note | None:
        with self._transaction() as cursor:
            cursor.execute("DELETE FROM plugin_notes WHERE name = %s RETURNING content", (name,))
            row = cursor.fetchone()
        return None if row is None else Note.parse(name, str(row[0]))


Notebook = NoteStore | SharedNoteStore
"""Where the notes live: files in the data dir, or the shared database."""


def _terms(query: str) -> list[str]:
    """The distinct lowercase words of a query; the whole query if it has no word characters."""
    words = list(dict.fromkeys(re.findall(r"\w+", query.lower())))
    return words or [query.strip().lower()]


def _score(note: Note, terms: Sequence[str]) -> tuple[int, int]:
    """(query words found, total occurrences) over title, tags and text, case-insensitively."""
    haystack = "\n".join((note.title, " ".join(note.tags), note.text)).lower()
    found = [term for term in terms if term in haystack]
    return len(found), sum(haystack.count(term) for term in found)


def _snippet(note: Note, terms: Sequence[str], width: int = 160) -> str:
    """A one-line excerpt of the text around the first query word it contains."""
    flat = " ".join(note.text.split())
    lowered = flat.lower()
    hits = [i for term in terms if (i := lowered.find(term)) != -1]
    start = max(0, min(hits) - width // 4) if hits else 0
    excerpt = flat[start : start + width]
    return ("…" if start else "") + excerpt + ("…" if start + width < len(flat) else "")


class NoteSummary(BaseModel):
    """What tools say about a note, without its text."""

    name: str
    uri: str
    title: str
    tags: list[str]
    created: str

    @classmethod
    def of(cls, note: Note) -> NoteSummary:
        return cls(name=note.name, uri=note.uri, title=note.title, tags=list(note.tags), created=note.created)


class NoteList(BaseModel):
    """`list_notes`'s structured output."""

    notes: list[NoteSummary]


class SearchHit(NoteSummary):
    """One ranked match."""

    matched_words: int = Field(description="How many distinct query words the note contains.")
    occurrences: int = Field(description="How often those words occur in the note.")
    snippet: str


class SearchResults(BaseModel):
    """`search_notes`'s structured output, best match first."""

    query: str
    scanned: int = Field(description="Number of notes searched.")
    hits: list[SearchHit]


def _structured(text: str, model: BaseModel) -> CallToolResult:
    """A result with readable text for the model, and the same facts as structured content."""
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=model.model_dump(mode="json")
    )


def _bullet(note: Note) -> str:
    tags = f" — {', '.join(note.tags)}" if note.tags else ""
    return f"- [{note.title}]({note.uri}){tags}"


def _unknown_note(store: Notebook, name: str) -> str:
    """Why `name` names no note, with the closest existing names, for tool and resource errors."""
    if not NAME_PATTERN.match(name):
        reason = f"name {name!r} is not a valid note name ({NAME_RULE})"
        candidate = slugify(name)
    else:
        reason = f"name {name!r} is not an existing note"
        candidate = name
    close = difflib.get_close_matches(candidate, store.names(), n=5, cutoff=0.5)
    if close:
        return f"{reason}; close matches: {', '.join(repr(c) for c in close)}"
    return f"{reason}; call list_notes to see every note"


async def _announce_resources_changed(ctx: Context) -> None:
    """Tell clients of both protocol eras that `resources/list` changed.

    At 2026-07-28 change events exist only on `subscriptions/listen` streams, which the
    server's subscription bus feeds. On handshake-era connections they are plain
    notifications on the connection's standalone stream; at 2026-07-28 the SDK drops
    that copy itself, so sending both never duplicates.
    """
    await ctx.notify_resources_changed()
    await ctx.session.send_resource_list_changed()


class NotesServer(MCPServer[Any]):
    """An MCPServer whose `resources/list` also lists every note, read from disk per request.

    MCPServer's static resources are fixed objects registered up front, and it has no
    public way to remove one. Listing the directory on each request keeps the listing
    truthful after add/delete and after someone edits the folder by hand; reading a
    listed `note://<name>` goes through the `note://{name}` template.
    """

    def __init__(self, store: Notebook) -> None:
        super().__init__(
            "notes",
            instructions=(
                "A markdown notebook. Search before adding to avoid duplicates; read a note as the "
                f"resource note://<name>; {INDEX_URI} lists them all."
            ),
        )
        self.store = store

    async def list_resources(self) -> list[Resource]:
        fixed = await super().list_resources()
        notes = await anyio.to_thread.run_sync(self.store.all)
        return fixed + [
            Resource(
                uri=note.uri,
                name=note.name,
                title=note.title,
                description=f"Note tagged {', '.join(note.tags)}" if note.tags else "Note",
                mime_type=MARKDOWN,
            )
            for note in notes
        ]


def create_server(directory: Path, database_url: str | None = None) -> NotesServer:
    """Build the notes server over `directory`, or over the PostgreSQL database at `database_url`
    (shared by replicas); the gateway and the tests use the same object."""
    store: Notebook = SharedNoteStore(database_url) if database_url else NoteStore(directory)
    server = NotesServer(store)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False))
    async def add_note(
        title: Annotated[str, Field(description="Title of the note; its name (a slug) is derived from it.")],
        text: Annotated[str, Field(description="Body of the note, in markdown.")],
        ctx: Context,
        tags: Annotated[list[str], Field(description="Tags such as 'work' or 'recipe'; lowercased.")] = [],  # noqa: B006
    ) -> Annotated[CallToolResult, NoteSummary]:
        """Take a new note: write down and save a title, markdown text and tags, to remember for later.

        Returns its name and URI (note://<name>); a reused title gets a -2, -3... name.
        """
        if not title.strip():
            raise ToolError("title must not be empty; give the note a short title such as 'Groceries'")
        for name, value in [("title", title), ("text", text)] + [(f"tags[{i}]", tag) for i, tag in enumerate(tags)]:
            if (refusal := surrogate_refusal(name, value)) is not None:
                raise ToolError(refusal)  # a file holds UTF-8: it could not be written, nor read back
        note = await anyio.to_thread.run_sync(store.add, title, text, tags)
        await _announce_resources_changed(ctx)
        return _structured(f"Added note {note.name!r} ({note.uri}).", NoteSummary.of(note))

    @server.tool(annotations=READ_ONLY)
    async def search_notes(
        query: Annotated[str, Field(description="Words to look for in titles, tags and text (case-insensitive).")],
        ctx: Context,
        limit: Annotated[int, Field(description="Most hits to return.", ge=1, le=100)] = 10,
    ) -> Annotated[CallToolResult, SearchResults]:
        """Find notes containing any of the query words, ranked by how many words match, then how often."""
        if not query.strip():
            raise ToolError("query must not be empty; give one or more words such as 'budget 2025'")
        terms = _terms(query)
        names = await anyio.to_thread.run_sync(store.names)
        step = max(1, len(names) // 20)
        scored: list[tuple[tuple[int, int], Note]] = []
        if names:
            await ctx.report_progress(0, len(names), "searching notes")
        for done, name in enumerate(names, start=1):
            note = await anyio.to_thread.run_sync(store.get, name)
            if note is not None and (score := _score(note, terms))[0]:
                scored.append((score, note))
            if done % step == 0 or done == len(names):
                await ctx.report_progress(done, len(names), f"searched {done} of {len(names)} notes")
        scored.sort(key=lambda item: (-item[0][0], -item[0][1], item[1].name))
        hits = [
            SearchHit(
                **NoteSummary.of(note).model_dump(),
                matched_words=score[0],
                occurrences=score[1],
                snippet=_snippet(note, terms),
            )
            for score, note in scored[:limit]
        ]
        results = SearchResults(query=query, scanned=len(names), hits=hits)
        if not hits:
            return _structured(f"No note matches {query!r} ({len(names)} searched).", results)
        lines = [f"- {hit.title} ({hit.uri}): {hit.snippet}" for hit in hits]
        return _structured(f"{len(hits)} of {len(scored)} matching notes:\n" + "\n".join(lines), results)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
    async def delete_note(
        name: Annotated[str, Field(description="Name of the note, as list_notes or search_notes report it.")],
        ctx: Context,
    ) -> Annotated[CallToolResult, NoteSummary]:
        """Delete (remove) one existing note by its name, permanently: it cannot be restored."""
        note = await anyio.to_thread.run_sync(store.delete, name)
        if note is None:
            raise ToolError(_unknown_note(store, name))
        await _announce_resources_changed(ctx)
        return _structured(f"Deleted note {note.name!r} ({note.title}).", NoteSummary.of(note))

    @server.tool(annotations=READ_ONLY)
    def list_notes() -> Annotated[CallToolResult, NoteList]:
        """List every saved note: name, URI, title, tags and creation time."""
        notes = store.all()
        text = "\n".join(_bullet(note) for note in notes) or "No notes yet; add one with add_note."
        return _structured(text, NoteList(notes=[NoteSummary.of(note) for note in notes]))

    @server.resource(TEMPLATE_URI, name="note", title="Note", description="One note, as markdown.", mime_type=MARKDOWN)
    def read_note(name: str) -> str:
        """The note as markdown with YAML front matter; hand-written files gain a normalised header."""
        note = store.get(name)
        if note is None:
            raise ResourceNotFoundError(_unknown_note(store, name))
        return note.render()

    @server.resource(INDEX_URI, name="index", title="Notes index", description="Every note.", mime_type=MARKDOWN)
    def read_index() -> str:
        """A markdown list of every note with its tags, linking to note://<name>."""
        notes = store.all()
        lines = [_bullet(note) for note in notes] or ["No notes yet; add one with the add_note tool."]
        return "# Notes\n\n" + "\n".join(lines) + "\n"

    @server.prompt(title="Summarize notes")
    def summarize_notes(
        topic: Annotated[str, Field(description="A word, phrase or tag; the notes that mention it are included.")],
    ) -> UserMessage:
        """Ask for a summary of everything the notebook says about a topic."""
        terms = _terms(topic)
        scored = [(score, note) for note in store.all() if (score := _score(note, terms))[0]]
        scored.sort(key=lambda item: (-item[0][0], -item[0][1], item[1].name))
        if not scored:
            tags = sorted({tag for note in store.all() for tag in note.tags})
            known = f"; tags in use: {', '.join(tags)}" if tags else ""
            # An MCPError reaches the client as is; any other exception becomes "Internal server error".
            raise MCPError(code=INVALID_PARAMS, message=f"topic {topic!r} matches no note{known}")
        sections = [
            f"## {note.title} ({note.uri})\nTags: {', '.join(note.tags) or 'none'}\n\n{note.text}"
            for _, note in scored[:20]
        ]
        return UserMessage(
            f"Summarize what my notes say about {topic!r}. Group related points, keep concrete facts "
            "(dates, numbers, names), point out contradictions, and cite the note URI for each point.\n\n"
            + "\n\n".join(sections)
        )

    @server.prompt(title="Draft a note")
    def draft_note(
        subject: Annotated[str, Field(description="What the note should be about.")],
    ) -> UserMessage:
        """Ask for a well-structured note on a subject, ready to save with add_note."""
        tags = sorted({tag for note in store.all() for tag in note.tags})
        reuse = f" Prefer these existing tags where they fit: {', '.join(tags)}." if tags else ""
        return UserMessage(
            f"Draft a note about {subject!r} for my notebook. Give it a short title, a markdown body "
            "(a one-sentence summary first, then bullet points; facts only, no filler) and 1-3 "
            f"lowercase tags.{reuse} Search my notes with search_notes first so you do not duplicate one, "
            "then save it with add_note(title, text, tags)."
        )

    @server.completion()
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion | None:
        """Note names for `note://{name}`; tags and note names for `summarize_notes`'s topic."""
        prefix = argument.value.strip().lower()
        if isinstance(ref, ResourceTemplateReference) and ref.uri == TEMPLATE_URI and argument.name == "name":
            candidates = await anyio.to_thread.run_sync(store.names)
        elif isinstance(ref, PromptReference) and ref.name == "summarize_notes" and argument.name == "topic":
            notes = await anyio.to_thread.run_sync(store.all)
            tags = sorted({tag for note in notes for tag in note.tags})
            candidates = tags + [note.name for note in notes if note.name not in tags]
        else:
            return None
        values = [value for value in candidates if value.startswith(prefix)]
        return Completion(values=values[:MAX_COMPLETIONS], total=len(values), has_more=len(values) > MAX_COMPLETIONS)

    return server


@hookimpl
def gateway_register_servers(register: RegisterServer, settings: Settings) -> None:
    """Serve the notebook from `<data_dir>/notes`, or from the shared PostgreSQL database when one is set."""
    url = settings.database_url if settings.database_url and settings.database_url.startswith("postgres") else None
    register(
        "notes",
        create_server(settings.data_dir / "notes", url),
        description="A markdown notebook: add, search, list and delete notes; read them as resources.",
        capabilities=["notes", "notebook", "markdown", "search", "memory"],
    )
