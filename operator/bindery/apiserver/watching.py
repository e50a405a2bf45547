"""One list-then-watch loop for every resource Bindery follows.

There were three (the unbound pods, the bound pods, the reference RM's mirrors) with three resume
policies: resume from the last resourceVersion, relist after every watch end, resume only after an
orderly end. A relist is the expensive path (every object again, on the apiserver and here) and,
done naively, the lossy one: an object deleted while nothing watched is simply absent from the new
list, and no DELETED ever comes for it. So, as Kopf's ``watching.py`` does, the watch here is
resumed whenever it can be, and relisted only when it must:

- list (paged), yield every object (type None, as Kopf delivers listed objects), then one
  :class:`Listed` marker; each page is delivered before the next is read and nothing of it is kept
  but what `remember` keeps, so a list holds one page at a time however many objects match (it used
  to hold every page of the list before delivering the first object: with large pods, hundreds of
  megabytes);
- watch from the list's resourceVersion with bookmarks, which keep the version fresh on a quiet
  resource; a watch the server ends (``timeoutSeconds``), or whose stream broke or went silent
  (a half-open connection: the client's read timeout is a little longer than the server's own
  timeout), resumes from the last version seen;
- a 410 Gone (the version was compacted away) relists, and the relist is **diffed against what was
  known**: ADDED for new objects and MODIFIED for changed ones as their pages arrive, then DELETED
  for each object that vanished (its body as `remember` kept it); objects unchanged since are not
  delivered again. A list that fails half way is listed again from the start: the objects of its
  first pages may then be delivered twice (consumers take events idempotently);
- every failure waits in one :class:`bindery.backoff.Backoff`, reset by any progress.

The bookkeeping (:class:`Cursor`) and the diff are pure and tested without a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from bindery.apiserver.api import METADATA_ONLY_WATCH, ApiClient, list_pages, response, selectors
from bindery.apiserver.errors import ApiError, Gone, Unavailable, from_status, translate
from bindery.apiserver.resources import Resource
from bindery.backoff import Backoff, BackoffPolicy
from bindery.typedefs import Logger

__all__ = [
    "WATCH_BACKOFF",
    "Cursor",
    "Event",
    "Listed",
    "identity",
    "list_watch",
    "object_key",
    "parse_line",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One object's change: type None for an object of the first list, else ADDED/MODIFIED/DELETED."""

    type: str | None
    object: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Listed:
    """After a (re)list's objects or diff: `relist` is False for the first list only."""

    relist: bool
    count: int


def object_key(obj: Mapping[str, Any]) -> str:
    """Pure: the identity of an object across lists: its UID (a recreated object is another one)."""
    metadata = obj.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}")


def identity(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """Pure: the default of what is remembered per object (and what a synthesized DELETED carries):
    its name, namespace, UID and resourceVersion. Enough to forget it; callers needing more say so."""
    metadata = obj.get("metadata") or {}
    kept = {key: metadata[key] for key in ("name", "namespace", "uid", "resourceVersion") if key in metadata}
    return {"metadata": kept}


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclasses.dataclass
class Cursor:
    """Where one list-then-watch stands: the version to resume from and the objects known.

    `remember` projects each object to what is kept of it: the stand-in body of a DELETED that a
    diff synthesizes. The counters are for tests and logs.
    """

    remember: Callable[[Mapping[str, Any]], Mapping[str, Any]] = identity
    resource_version: str = ""
    #: key → (resourceVersion, remembered body) of every object in the set
    known: dict[str, tuple[str, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    #: `known` of the list under way, page by page (replaces `known` once its last page arrived)
    fresh: dict[str, tuple[str, Mapping[str, Any]]] = dataclasses.field(default_factory=dict, repr=False)
    must_list: bool = True
    lists: int = 0  #: completed (re)lists
    watches: int = 0  #: watch requests answered 200
    expired: int = 0  #: 410 Gone answers and ERROR events

    def listed(self, items: Sequence[Mapping[str, Any]], *, resource_version: str) -> list[Event]:
        """Take a complete list at once; the events it means (pure): :meth:`begin`, :meth:`page`
        and :meth:`end` in one, with the deletions first.

        The first list: every object, type None. A relist: the diff against what was known.
        """
        self.begin()
        changed = self.page(items)
        return self.end(resource_version=resource_version) + changed

    def begin(self) -> None:
        """A (re)list starts (pure). Objects a failed attempt delivered count as known, so that
        this list says DELETED for those that vanished meanwhile."""
        self.known.update(self.fresh)
        self.fresh = {}

    def page(self, items: Sequence[Mapping[str, Any]]) -> list[Event]:
        """Take one page of the list under way; the events of its objects (pure): all of them on the
        first list (type None), the new and changed ones on a relist."""
        events: list[Event] = []
        first = self.lists == 0
        for item in items:
            key = object_key(item)
            version = _version(item)
            if first:
                events.append(Event(None, item))
            elif (old := self.known.get(key)) is None:
                events.append(Event("ADDED", item))
            elif old[0] != version:
                events.append(Event("MODIFIED", item))
            self.fresh[key] = (version, self.remember(item))
        return events

    def end(self, *, resource_version: str) -> list[Event]:
        """The last page arrived (pure): the list's objects become the ones known, and each object
        known before (a relist's, or one a failed attempt delivered) and absent is DELETED."""
        events = [Event("DELETED", body) for key, (_, body) in self.known.items() if key not in self.fresh]
        self.known, self.fresh = self.fresh, {}
        self.resource_version = resource_version
        self.must_list = not resource_version  # a list without a version cannot be watched from
        self.lists += 1
        return events

    def observed(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Take one watch event (pure); True if it is to be delivered (not a BOOKMARK)."""
        self.resource_version = _version(obj) or self.resource_version
        if kind == "BOOKMARK":
            return False
        key = object_key(obj)
        if kind == "DELETED":
            self.known.pop(key, None)
        else:
            self.known[key] = (_version(obj), self.remember(obj))
        return True

    def expire(self) -> None:
        """The version is gone (410): the next round lists, and diffs against `known`."""
        self.expired += 1
        self.must_list = True


#: The wait after a failed list or watch: 0.5 s doubling to 10 s, reset by any progress.
WATCH_BACKOFF = BackoffPolicy(initial=0.5, maximum=10.0)


def parse_line(line: bytes) -> tuple[str, dict[str, Any]] | None:
    """Pure: (type, object) of one line of a watch stream; None for a blank keep-alive line.

    Raises :class:`Unavailable` for a line that is not a watch event (a truncated stream), and the
    error of the Status an ERROR event carries (:class:`Gone` for 410 Expired).
    """
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except ValueError as error:
        raise Unavailable(f"a watch line is not JSON: {line[:200]!r}") from error
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict) or "type" not in event:
        raise Unavailable(f"not a watch event: {line[:200]!r}")
    kind, obj = str(event["type"]), event["object"]
    if kind == "ERROR":
        code = obj.get("code")
        raise from_status(int(code) if isinstance(code, int) else 500, obj, what="watch")
    return kind, obj


def read_timeout(watch_seconds: int) -> aiohttp.ClientTimeout:
    """Pure: the client bound of one watch request: a stream silent past the server's own
    `watch_seconds` is half-open (the apiserver's host vanished, a load balancer dropped it)."""
    return aiohttp.ClientTimeout(sock_connect=10, sock_read=watch_seconds + max(5, watch_seconds / 10))


async def _watch(
    api: ApiClient,
    path: str,
    *,
    query: dict[str, str | int | bool],
    metadata_only: bool,
    watch_seconds: int,
    cursor: Cursor,
) -> AsyncGenerator[Event, None]:
    """One watch request from ``cursor.resource_version``, until the server ends it."""
    query = {
        **query,
        "watch": True,
        "allowWatchBookmarks": True,
        "timeoutSeconds": watch_seconds,
        "resourceVersion": cursor.resource_version,
    }
    accept = METADATA_ONLY_WATCH if metadata_only else "application/json"
    async with response(
        api,
        "GET",
        path,
        query=query,
        accept=accept,
        request_timeout=read_timeout(watch_seconds),
        what=f"watch {path}",
    ) as stream:
        cursor.watches += 1
        while True:
            try:
                line = await stream.content.readline()
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                raise translate(error, what=f"watch {path}") from error
            if not line:
                return  # the server ended the watch
            event = parse_line(line)
            if event is not None and cursor.observed(*event):
                yield Event(*event)


async def list_watch(
    api: ApiClient,
    resource: Resource,
    *,
    namespace: str | None = None,
    label_selector: str = "",
    field_selector: str = "",
    metadata_only: bool = False,
    watch_seconds: int = 300,
    page_size: int | None = None,
    list_timeout: float = 60.0,
    cursor: Cursor | None = None,
    backoff: Backoff | None = None,
    logger: Logger | None = None,
    what: str = "",
    hint: Callable[[ApiError], str] = lambda error: "",
) -> AsyncGenerator[Event | Listed, None]:
    """Every change of the selected objects, for ever: see the module's docstring.

    Pass a `cursor` to read its counters, or to resume a previous loop's state (its version and
    known objects: a diff then covers what happened in between). `hint` adds advice to the log
    line of a failure (which permission to grant on a Forbidden, say).
    """
    cursor = cursor if cursor is not None else Cursor()
    backoff = backoff if backoff is not None else Backoff(WATCH_BACKOFF)
    log = logger if logger is not None else logging.getLogger(__name__)
    scope = f"in {namespace}" if namespace else "in all namespaces" if resource.namespaced else ""
    what = what or " ".join(
        part for part in (resource.plural, selectors_text(label_selector, field_selector), scope) if part
    )
    path = resource.path(namespace=namespace)
    query: dict[str, str | int | bool] = dict(
        selectors(label_selector=label_selector, field_selector=field_selector)
    )
    just_listed = False
    #: the last watch expired straight after its list: the next list is no progress of its own
    expiring = False
    while True:
        try:
            if cursor.must_list:
                relist = cursor.lists > 0
                count, version = 0, ""
                cursor.begin()
                pages = list_pages(
                    api,
                    resource,
                    namespace=namespace,
                    label_selector=label_selector,
                    field_selector=field_selector,
                    metadata_only=metadata_only,
                    page_size=page_size,
                    request_timeout=list_timeout,
                )
                async with contextlib.aclosing(pages):
                    async for page in pages:
                        # All pages are of one snapshot: the first page's version is the list's.
                        version = version or str((page.get("metadata") or {}).get("resourceVersion") or "")
                        items = page.get("items") or []
                        count += len(items)
                        events = cursor.page(items)
                        del page, items  # one page at a time: only the events refer to it now
                        for event in events:
                            yield event
                        del events
                deleted = cursor.end(resource_version=version)
                if not expiring:  # else only a watch event resets it: the relists back off
                    backoff.reset()
                for event in deleted:
                    yield event
                yield Listed(relist=relist, count=count)
                if cursor.must_list:
                    raise Unavailable("the list carried no resourceVersion to watch from", what=what)
                just_listed = True
            # Closed with this generator: a consumer that stops reading releases the connection now.
            async with contextlib.aclosing(
                _watch(
                    api,
                    path,
                    query=query,
                    metadata_only=metadata_only,
                    watch_seconds=watch_seconds,
                    cursor=cursor,
                )
            ) as events_of_watch:
                async for event in events_of_watch:
                    backoff.reset()
                    just_listed = expiring = False
                    yield event
            # Ended by the server: resume from the last version seen (a bookmark's, on a quiet set).
        except Gone as error:
            cursor.expire()
            log.info(f"watch of {what} expired ({error.message}): relisting")
            if just_listed:  # expired again straight after a list: do not hammer the apiserver
                expiring = True
                await asyncio.sleep(backoff.next())
        except ApiError as error:
            delay = backoff.next(retry_after=getattr(error, "retry_after", None))
            action = "listing" if cursor.must_list else f"resuming from {cursor.resource_version}"
            log.warning(f"watch of {what} failed: {error}{hint(error)}; {action} in {delay:.1f}s")
            await asyncio.sleep(delay)


def selectors_text(label_selector: str, field_selector: str) -> str:
    """Pure: the selectors as a log shows them."""
    return ",".join(part for part in (label_selector, field_selector) if part)
