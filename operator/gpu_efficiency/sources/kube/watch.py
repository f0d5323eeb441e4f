"""List, then watch, one kind of object into a map of plain views (client-go's reflector, small).

Why: a cycle that LISTs every pod costs one request per 500 pods and seconds of decoding at
thousands of pods, every cycle, growing with the cluster. A watch costs nothing while nothing
changes, and one event per change. The cycle reads an immutable snapshot of the map instead.

How:
- a paged LIST (orjson, 500 a page, views built page by page) fills the map and gives the
  resourceVersion to WATCH from, with bookmarks so that the version keeps moving while the watched
  objects do not (the API server sends one about every minute);
- the watch stream is read line by line and each event decoded with orjson (the client's model
  deserialisation is ~10x slower); ADDED/MODIFIED/DELETED update the map keyed by uid, an object
  the filter rejects (or that leaves a field selector, which arrives as DELETED) is dropped;
- the server ending the stream (its timeout) re-watches from the last version at once; an error
  retries with exponential backoff from the same version, relisting every few failures in a row;
  410 Gone/Expired relists at once, and a relist replaces the map in one step;
- a stream silent for longer than ``idle_timeout`` (two bookmark intervals) is taken for dead, or
  for one the server cannot serve (a version it has not reached, e.g. after an etcd restore, is
  accepted and never answered): re-watched, and relisted when the next one is silent too.

Health is what the server proved, not what was asked: the map is current as of the last line the
watch delivered (or the last LIST). ``snapshot`` returns None until the first LIST is complete, and
once the map cannot be vouched for since more than ``max_broken`` seconds; the caller then LISTs
itself (``cluster_cache.CachedClusterReader``), so a cycle never reads an empty or stale map.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from gpu_efficiency import metrics

log = logging.getLogger(__name__)

V = TypeVar("V")

#: Every this many watch failures in a row, the next attempt relists instead of resuming.
RELIST_AFTER_FAILURES = 5
#: Silent watches in a row after which the next attempt relists.
RELIST_AFTER_SILENCES = 2


class GoneError(Exception):
    """The resourceVersion (or a list's continue token) is too old: 410 Gone. Relist."""


class WatchError(Exception):
    """The server ended the watch with an ERROR event other than 410."""


class SilentError(Exception):
    """The watch delivered nothing, not even a bookmark: for ``idle_timeout`` seconds, or at all."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter (so replicas do not retry in step)."""

    initial: float = 0.5
    maximum: float = 30.0

    def delay(self, failures: int) -> float:
        base = min(self.maximum, self.initial * 2.0 ** max(0, failures - 1))
        return float(base * random.uniform(0.8, 1.2))


@dataclass(frozen=True, slots=True)
class _Entry(Generic[V]):
    version: int | None  # resourceVersion as an int, when it is one (read-your-writes compares them)
    view: V


def _version(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def iter_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Newline-delimited lines from a chunked stream; a line may span chunks, a chunk hold many."""
    pending = b""
    for chunk in chunks:
        if not chunk:
            continue
        data = pending + chunk if pending else bytes(chunk)
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            if end > start:
                yield data[start:end]
            start = end + 1
        pending = data[start:]
    if pending.strip():
        yield pending


def abort_stream(response: Any, what: str) -> None:
    """Close a streaming HTTP response another thread is reading: shut the socket first, since
    close() alone waits for the read blocked on the stream (the next event, or the server's timeout)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        response.close()
    except Exception:  # closing a broken stream may fail in many ways
        log.debug("closing the %s failed", what, exc_info=True)


class Informer(Generic[V]):
    """One resource kind, listed then watched on a daemon thread; ``snapshot`` for readers.

    ``list_fn`` is a generated ``CoreV1Api.list_*`` method with its selectors bound (the same call
    lists and, with ``watch=True``, watches); ``view`` turns a decoded object into the engine's view;
    ``keep`` drops views the cycle never needs (pods without GPUs); ``order`` sorts snapshots as a
    LIST returns them (by namespace and name), so a cycle plans the same whichever way it read;
    ``retry_after`` gives the wait after an error the backoff should not shorten (a kind the server
    does not serve, or RBAC forbids, is asked again once a minute, not at 0.5, 1, 2... seconds).
    """

    def __init__(
        self,
        resource: str,
        list_fn: Callable[..., Any],
        view: Callable[[Mapping[str, Any]], V],
        *,
        keep: Callable[[V], bool] | None = None,
        order: Callable[[V], Any] | None = None,
        page_size: int = 500,
        watch_seconds: tuple[int, int] = (240, 360),
        idle_timeout: float = 130.0,
        max_broken: float = 75.0,
        backoff: Backoff | None = None,
        retry_after: Callable[[Exception], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resource = resource
        self._list_fn = list_fn
        self._view = view
        self._keep = keep
        self._order = order
        self.page_size = page_size
        self.watch_seconds = watch_seconds
        self.idle_timeout = idle_timeout
        self.max_broken = max_broken
        self.backoff = backoff or Backoff()
        self._retry_after = retry_after
        self._clock = clock
        self._items: dict[str, _Entry[V]] = {}
        self._snapshot: tuple[V, ...] | None = None
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._broken_since: float | None = None  # since when the map may be stale; None: current
        self._heard_at: float | None = None  # last line delivered, or LIST completed
        self._failures = 0  # errors in a row (a delivered line resets)
        self._silences = 0  # silent watches in a row (a delivered line resets)
        self._version: str | None = None  # where the next watch resumes; None: relist first
        self._relist_reason = "start"
        self.error: Exception | None = None  # the last failed LIST or watch; None once the server delivers
        self._response: Any = None
        self._thread: threading.Thread | None = None
        #: Called as (view before, view after; None: absent) on the watch thread for each watched
        #: ADDED/MODIFIED event that changed the map (not for relists): keep it quick.
        self.on_change: Callable[[V | None, V | None], None] | None = None
        self.relists = 0  # LISTs that filled the map
        self.watches = 0  # watch requests the server accepted
        self.events = 0

    # -- readers ---------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first LIST has filled the map (it stays true across relists)."""
        return self._synced.is_set()

    @property
    def resource_version(self) -> str | None:
        return self._version

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def usable(self) -> bool:
        """Synced, and the watch not broken for longer than ``max_broken``: safe to read."""
        broken = self._broken_since
        return self._synced.is_set() and (broken is None or self._clock() - broken <= self.max_broken)

    def snapshot(self) -> tuple[V, ...] | None:
        """An immutable, ordered tuple of the views; None when the cache must not be read."""
        usable = self.usable()
        metrics.CACHE_SYNCED.labels(self.resource).set(1 if usable else 0)
        if not usable:
            return None
        with self._lock:
            if self._snapshot is None:
                views = [e.view for e in self._items.values()]
                if self._order is not None:
                    views.sort(key=self._order)
                self._snapshot = tuple(views)
            return self._snapshot

    # -- read-your-writes ------------------------------------------------------------------------

    def observe_written(self, obj: Mapping[str, Any]) -> bool:
        """Take an object our own write returned, if it is newer than the cached one.

        The watch delivers the same change moments later; until then a cycle would plan the write
        again. Only objects the cache holds are refreshed (one it lacks may have been deleted since),
        and only when both resourceVersions are integers (as etcd's are) and ours is the newer.
        """
        meta = obj.get("metadata") or {}
        uid, version = str(meta.get("uid") or ""), _version(meta.get("resourceVersion"))
        if not uid or version is None:
            return False
        view = self._view(obj)
        if self._keep is not None and not self._keep(view):
            return False
        with self._lock:
            current = self._items.get(uid)
            if current is None or current.version is None or current.version >= version:
                return False
            self._items[uid] = _Entry(version, view)
            self._snapshot = None
        return True

    def update(self, uid: str, change: Callable[[V], V]) -> bool:
        """Change a cached view in place (its resourceVersion kept, so the next event overrides it)."""
        with self._lock:
            current = self._items.get(uid)
            if current is None:
                return False
            self._items[uid] = _Entry(current.version, change(current.view))
            self._snapshot = None
        return True

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.resource}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._abort()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

    def restart_watch(self, from_version: str | None = None) -> None:
        """Drop the current watch; it resumes from ``from_version`` (default: where it was).

        For tests and debugging: an old version gets 410 Gone (or a replay, while the server's watch
        cache still reaches back that far); one the server has not reached is never served.
        """
        if from_version is not None:
            self._version = from_version
        self._abort()

    def _abort(self) -> None:
        """Unblock the watch thread blocked on the stream."""
        if self._response is not None:
            abort_stream(self._response, f"{self.resource} watch")

    # -- the watch thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._version is None:
                    self._relist()
                self._watch()
                self._restarted("ended")
            except GoneError as exc:
                if self._stop.is_set():
                    return
                log.info("%s: watch expired (%s); relisting", self.resource, exc)
                self._mark_broken(self._clock())
                self._restarted("expired")
                self._version, self._relist_reason = None, "expired"
            except SilentError as exc:
                if self._stop.is_set():
                    return
                self._silences += 1
                self._mark_broken(self._heard_at)
                self._restarted("silent")
                relist = self._silences >= RELIST_AFTER_SILENCES
                if relist:
                    self._version, self._relist_reason, self._silences = None, "silent", 0
                log.warning(
                    "%s: watch %s (no event, no bookmark): %s",
                    self.resource,
                    exc,
                    "relisting" if relist else "watching again",
                )
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._failures += 1
                self.error = exc
                self._mark_broken(self._clock())
                self._restarted("error")
                what = "watch" if self._version is not None else "list"
                if self._failures % RELIST_AFTER_FAILURES == 0 and self._version is not None:
                    self._version, self._relist_reason = None, "error"
                held = self._retry_after(exc) if self._retry_after is not None else None
                delay = held or self.backoff.delay(self._failures)
                # An expected refusal (``retry_after``) is said once, not every minute.
                level = (
                    logging.WARNING if not held else logging.INFO if self._failures == 1 else logging.DEBUG
                )
                log.log(
                    level,
                    "%s: %s failed (%s: %s); retrying in %.1fs",
                    self.resource,
                    what,
                    type(exc).__name__,
                    f"HTTP {exc.status}: {exc.reason}" if isinstance(exc, ApiException) else exc,
                    delay,
                )
                self._stop.wait(delay)

    def _restarted(self, reason: str) -> None:
        metrics.CACHE_WATCH_RESTARTS.labels(self.resource, reason).inc()

    def _mark_broken(self, since: float | None) -> None:
        """The map may be stale from ``since`` on (the last moment it was known current)."""
        if self._broken_since is None:
            self._broken_since = since if since is not None else self._clock()

    def _heard(self) -> None:
        """The server delivered: the map is current; failures and silences start over."""
        self._heard_at = self._clock()
        self._broken_since = None
        self._failures = self._silences = 0
        self.error = None

    def _call(self, **kwargs: Any) -> Any:
        try:
            return self._list_fn(_preload_content=False, **kwargs)
        except ApiException as exc:
            if exc.status == 410:
                raise GoneError(f"HTTP 410: {exc.reason}") from None
            raise

    def _relist(self) -> None:
        """Page through a fresh LIST into a new map, then swap it in at once."""
        items: dict[str, _Entry[V]] = {}
        token: str | None = None
        version: str | None = None
        while True:
            response = self._call(limit=self.page_size, _continue=token, _request_timeout=(10, 120))
            doc = orjson.loads(response.data)
            meta = doc.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version or "")
            for obj in doc.get("items") or ():
                self._put(items, obj)
            token = meta.get("continue")
            del doc
            if not token:
                break
        with self._lock:
            self._items = items
            self._snapshot = None
        self._version = version or None
        self._heard_at = self._clock()
        self._broken_since = None
        self.error = None
        self.relists += 1
        metrics.CACHE_RELISTS.labels(self.resource, self._relist_reason).inc()
        metrics.CACHE_OBJECTS.labels(self.resource).set(len(items))
        self._relist_reason = "error"
        first = not self._synced.is_set()
        self._synced.set()
        log.info(
            "%s: cache %s with %d objects at resourceVersion %s",
            self.resource,
            "synced" if first else "relisted",
            len(items),
            self._version,
        )

    def _put(self, items: dict[str, _Entry[V]], obj: Mapping[str, Any]) -> bool:
        """Store the object's view (or drop it when ``keep`` rejects it); True if the map changed."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        view = self._view(obj)
        if self._keep is not None and not self._keep(view):
            return items.pop(uid, None) is not None
        items[uid] = _Entry(_version(meta.get("resourceVersion")), view)
        return True

    def _watch(self) -> None:
        """One watch request, events applied until the stream ends; the version advances as it goes."""
        seconds = random.randint(*self.watch_seconds)
        response = self._call(
            watch=True,
            resource_version=self._version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            # The read timeout is the longest silence: bookmarks come about once a minute.
            _request_timeout=(10, self.idle_timeout),
        )
        self._response = response
        self.watches += 1
        lines = 0
        try:
            for line in iter_lines(response.stream(amt=None, decode_content=False)):
                if self._stop.is_set():
                    return
                self._apply(orjson.loads(line))
                self._heard()
                lines += 1
        except ReadTimeoutError:
            raise SilentError(f"silent for {self.idle_timeout:.0f}s") from None
        finally:
            self._response = None
            try:
                response.release_conn()
            except Exception:  # the connection may be shut down already
                log.debug("%s: releasing the watch connection failed", self.resource, exc_info=True)
        if not lines and not self._stop.is_set():
            # A served watch gets a bookmark just before its deadline: an empty one was not served.
            raise SilentError("ended empty")

    def _notify(self, before: V | None, after: V | None) -> None:
        listener = self.on_change
        if listener is None:
            return
        try:
            listener(before, after)
        except Exception:  # a listener's bug must not break the watch
            log.exception("%s: change listener failed", self.resource)

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code, message = obj.get("code"), obj.get("message", "")
            if code == 410:
                raise GoneError(str(message))
            raise WatchError(f"HTTP {code}: {message}")
        meta = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED"):
            uid = str(meta.get("uid") or "")
            with self._lock:
                before = self._items.get(uid)
                version = _version(meta.get("resourceVersion"))
                # An event older than what our own write returned (read-your-writes) is skipped.
                stale = before and before.version and version and version < before.version
                changed = not stale and self._put(self._items, obj)
                if changed:
                    self._snapshot = None
                after = self._items.get(uid) if changed else None
            if changed:
                self._notify(before.view if before else None, after.view if after else None)
        elif kind == "DELETED":
            with self._lock:
                if self._items.pop(str(meta.get("uid") or ""), None) is not None:
                    self._snapshot = None
        elif kind != "BOOKMARK":
            log.debug("%s: ignoring watch event %r", self.resource, kind)
            return
        self._version = str(meta.get("resourceVersion") or self._version)
        self.events += 1
        metrics.CACHE_EVENTS.labels(self.resource, str(kind)).inc()
        if kind != "BOOKMARK":
            metrics.CACHE_OBJECTS.labels(self.resource).set(len(self._items))


W = TypeVar("W")


class Projection(Generic[V, W]):
    """One part of an informer's views, read like an informer of its own: two readers of one LIST
    and one watch (the GPU pods and every pod's address come from the same pods).

    ``part`` picks a view's part (None: this view has none); the snapshot is rebuilt only when the
    informer's own snapshot changed, so a steady cycle reads the same tuple without a pass over it,
    and stays the same tuple when only other parts changed.
    """

    def __init__(
        self, informer: Informer[V], part: Callable[[V], W | None], *, order: Callable[[W], Any]
    ) -> None:
        self.informer = informer
        self._part = part
        self._order = order
        self._lock = threading.Lock()
        self._source: tuple[V, ...] | None = None
        self._snapshot: tuple[W, ...] = ()

    @property
    def synced(self) -> bool:
        return self.informer.synced

    def wait_synced(self, timeout: float) -> bool:
        return self.informer.wait_synced(timeout)

    def snapshot(self) -> tuple[W, ...] | None:
        """The parts, ordered; None whenever the informer's snapshot is (not synced, or broken)."""
        source = self.informer.snapshot()
        if source is None:
            return None
        with self._lock:
            if source is not self._source:
                parts = [part for view in source if (part := self._part(view)) is not None]
                parts.sort(key=self._order)
                self._source = source
                # Another part moved (a CPU pod's IP): this one reads as the very same tuple.
                if (fresh := tuple(parts)) != self._snapshot:
                    self._snapshot = fresh
            return self._snapshot


class InformerSet(ABC):
    """The informers of one watch cache, started, stopped and awaited together (the cluster's and
    the DRA objects' caches); a subclass names them in ``informers`` (abstract: a cache that names
    none cannot be built)."""

    @property
    @abstractmethod
    def informers(self) -> tuple[Informer[Any], ...]: ...

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()

    def wait_synced(self, timeout: float) -> bool:
        return all(informer.wait_synced(timeout) for informer in self.informers)
