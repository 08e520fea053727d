"""The service's live tables and their subscribers, shared by the thread that publishes
changes (the runner's deliver stage, through `txstream.sinks.live.sink`) and the Flight server's
threads (`txstream.sinks.live.flight`).

Each table has a lock: publishing a transaction (applying it and queueing its update for every
subscriber) and subscribing (taking a snapshot and registering the queue) exclude each other,
so a subscriber gets every update after its snapshot, none before it, none twice.

A subscriber that falls behind never slows the pipeline: its queue holds at most `capacity`
updates; when it overflows the queued updates are dropped and the subscriber gets a fresh
snapshot next instead (`Subscriber.next`).

A viewport subscriber (`txstream.sinks.live.viewport`) reads a sorted view of the table, kept
while some subscriber uses it and updated under the same lock, and is sent its window's part
of each update; moving the window queues the change like any update."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from txstream.changes import TIME
from txstream.sinks.live.table import LiveTable, LiveTableError
from txstream.sinks.live.viewport import Window, sorted_view
from txstream.updates import TableUpdate
from txstream.viewports import Viewport, ViewportError

QUEUE_CAPACITY = 256


class UnknownTableError(KeyError):
    """A request names a table that is not served."""


class UnknownSubscriptionError(KeyError):
    """A request names a subscription that is not open (or not a viewport's)."""


class Subscriber:
    """One subscription's queue of updates; `window` for a viewport's."""

    def __init__(self, capacity: int, window: Window | None = None) -> None:
        self._capacity = capacity
        self.window = window
        self._queue: deque[TableUpdate] = deque()
        self._ready = threading.Condition()
        self._resync = False
        self.closed = False
        self.resyncs = 0

    def offer(self, update: TableUpdate) -> None:
        with self._ready:
            if len(self._queue) >= self._capacity:
                self._queue.clear()
                self._resync = True
                self.resyncs += 1
            elif not self._resync:
                self._queue.append(update)
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify()

    def next(self, served: ServedTable, timeout: float) -> TableUpdate | None:
        """The next update, a fresh snapshot after an overflow, or None after `timeout`
        seconds without one (or once closed)."""
        with self._ready:
            if not self._queue and not self._resync and not self.closed:
                self._ready.wait(timeout)
            if self.closed:
                return None
            if not self._resync:
                return self._queue.popleft() if self._queue else None
        # The table's lock first, as `LiveTables.publish` takes them: an update published
        # meanwhile was not queued (we are resyncing) and is in this snapshot.
        with served.lock:
            with self._ready:
                self._resync = False
                self._queue.clear()
            return self.snapshot(served)

    def snapshot(self, served: ServedTable) -> TableUpdate:
        """What the subscriber sees now (call with the table's lock held)."""
        return served.table.snapshot() if self.window is None else self.window.snapshot()

    def follow(self, update: TableUpdate, views: dict[tuple[tuple[str, str], ...], TableUpdate]
               ) -> None:
        """Queue the subscriber's part of a transaction: `update` of the table, `views` the
        updates of its sorted views."""
        if self.window is None:
            self.offer(update)
        else:
            self.offer(self.window.follow(views[self.window.sort]))


class ServedTable:
    """A live table, its lock and its subscribers."""

    def __init__(self, table: LiveTable) -> None:
        self.table = table
        self.lock = threading.Lock()
        self.subscribers: list[Subscriber] = []
        self.by_id: dict[str, Subscriber] = {}
        # Sorted views by sort order, each kept while a subscriber reads it; the empty order
        # is the table's own.
        self.views: dict[tuple[tuple[str, str], ...], LiveTable] = {}

    def view(self, viewport: Viewport) -> LiveTable:
        if not viewport.sort:
            return self.table
        if viewport.sort not in self.views:
            self.views[viewport.sort] = sorted_view(self.table, viewport)
        return self.views[viewport.sort]

    def drop(self, subscriber: Subscriber) -> None:
        if subscriber in self.subscribers:
            self.subscribers.remove(subscriber)
        self.by_id = {k: s for k, s in self.by_id.items() if s is not subscriber}
        used = {s.window.sort for s in self.subscribers if s.window is not None}
        self.views = {sort: v for sort, v in self.views.items() if sort in used}

    def snapshot(self) -> TableUpdate:
        with self.lock:
            return self.table.snapshot()


class LiveTables:
    """The served tables by output name."""

    def __init__(self, tables: Mapping[str, LiveTable], capacity: int = QUEUE_CAPACITY) -> None:
        self._served = {name: ServedTable(t) for name, t in tables.items()}
        self._capacity = capacity

    @property
    def names(self) -> list[str]:
        return sorted(self._served)

    def table(self, name: str) -> LiveTable:
        return self._get(name).table

    def _get(self, name: str) -> ServedTable:
        try:
            return self._served[name]
        except KeyError:
            raise UnknownTableError(f"no live table {name!r}; served: "
                                    f"{', '.join(self.names) or 'none'}") from None

    def publish(self, name: str, changes: pa.Table) -> list[TableUpdate]:
        """Apply `changes` (consolidated, one or more transactions, sorted by time) to table
        `name`, one transaction at a time, and queue each update for its subscribers."""
        served = self._get(name)
        times = changes.column(TIME).to_numpy()
        if len(times) and not (np.diff(times) >= 0).all():
            raise LiveTableError(f"output {name!r}: changes are not sorted by time")
        cuts = [*(np.flatnonzero(np.diff(times)) + 1).tolist(), len(times)]
        updates = []
        with served.lock:
            start = 0
            for end in cuts:
                if end == start:
                    continue
                chunk, t = changes.slice(start, end - start), int(times[start])
                update = served.table.apply(chunk, t)
                views = {sort: view.apply(chunk, t) for sort, view in served.views.items()}
                views[()] = update
                for subscriber in served.subscribers:
                    subscriber.follow(update, views)
                updates.append(update)
                start = end
        return updates

    def snapshot(self, name: str) -> TableUpdate:
        return self._get(name).snapshot()

    def served(self, name: str) -> ServedTable:
        return self._get(name)

    def subscribe(self, name: str, viewport: Viewport | None = None,
                  subscription: str | None = None) -> tuple[TableUpdate, Subscriber]:
        """A snapshot (of the whole table, or of `viewport`) and the queue of every later
        update; `subscription` names it for `move`."""
        served = self._get(name)
        with served.lock:
            if subscription is not None and subscription in served.by_id:
                raise ViewportError(f"subscription {subscription!r} is already open")
            window = None if viewport is None else Window(served.view(viewport), viewport)
            subscriber = Subscriber(self._capacity, window)
            snapshot = subscriber.snapshot(served)
            served.subscribers.append(subscriber)
            if subscription is not None:
                served.by_id[subscription] = subscriber
        return snapshot, subscriber

    def move(self, name: str, subscription: str, first: int, last: int) -> None:
        """Move a viewport subscription to positions `first`..`last`: what enters and leaves
        it is queued after the updates before it."""
        served = self._get(name)
        with served.lock:
            subscriber = served.by_id.get(subscription)
            if subscriber is None or subscriber.window is None:
                raise UnknownSubscriptionError(
                    f"no open viewport subscription {subscription!r} of table {name!r}")
            subscriber.offer(subscriber.window.move(first, last))

    def unsubscribe(self, name: str, subscriber: Subscriber) -> None:
        served = self._get(name)
        subscriber.close()
        with served.lock:
            served.drop(subscriber)

    def subscriber_count(self) -> int:
        return sum(len(s.subscribers) for s in self._served.values())

    def nbytes(self) -> int:
        return sum(s.table.nbytes for s in self._served.values())

    def close(self) -> None:
        for served in self._served.values():
            with served.lock:
                for subscriber in served.subscribers:
                    subscriber.close()
                served.subscribers.clear()
                served.by_id.clear()
                served.views.clear()
