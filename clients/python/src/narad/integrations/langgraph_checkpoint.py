"""A LangGraph checkpointer that keeps a graph's checkpoints in the narad run's journal.

``NaradSaver`` is a ``BaseCheckpointSaver``: compile the graph with it and
serve it with :func:`narad.integrations.langgraph.handler`::

    graph = builder.compile(checkpointer=NaradSaver())
    runtime = Runtime(client, handler(graph), queue="agents")

During a claimed run it writes each checkpoint, and each task's writes, to the
run's own journal as ``run.custom`` extension events (names
``langgraph.checkpoint``, ``langgraph.blobs``, ``langgraph.writes``,
``langgraph.thread.deleted``), appended under the run's lease; it reads them back from
the journal the run's holder has read. A runtime that takes the run over
(the first one killed mid-run) reads the same journal, finds the last
checkpoint and its pending writes there, and the graph goes on from it: no
other store is needed for a run to survive a takeover, a release while a
person decides an ``interrupt()``, or a restart.

What is written per superstep is what resuming needs, not the whole state
again: the checkpoint (its channel versions, ``versions_seen``, pending
sends; no channel values), its metadata, the value of each channel whose
version changed, and each finished task's writes. A list value (the
``messages`` channel) is written as the items that changed since the
channel's previous version — ``base`` (that version), ``keep`` (how many of
its items stay) and the new items — so that a conversation that grows by one
message per step writes that message, not the conversation. Values are
serialised with the saver's ``serde`` (LangGraph's ``JsonPlusSerializer`` by
default, ``dumps_typed``) and base64-encoded. An event larger than
``max_event_bytes`` is split: channel values go first in ``langgraph.blobs``
events, and the ``langgraph.checkpoint`` event that names them comes last.

Outside a narad run (no :class:`~narad.RunContext` bound; ``handler`` binds
it for the graph's run, :func:`checkpoints_in` binds it by hand) the saver
raises :class:`NotInARun`. ``NaradSaver(journal=events)`` reads the
checkpoints of events already read (a run's history), e.g. to inspect a
finished run's graph state; it does not write.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import contextvars
import json
import random
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..client import Event
from ..runtime import RunContext

__all__ = [
    "BLOBS",
    "CHECKPOINT",
    "DELETED",
    "WRITES",
    "NaradSaver",
    "NotInARun",
    "checkpoints_in",
]

#: The ``run.custom`` names the saver writes.
CHECKPOINT = "langgraph.checkpoint"
BLOBS = "langgraph.blobs"
WRITES = "langgraph.writes"
DELETED = "langgraph.thread.deleted"
_NAMES = frozenset({CHECKPOINT, BLOBS, WRITES, DELETED})

#: The largest event the saver writes, unless a single value is larger
#: (the server refuses a request body above ``NARAD_MAX_BODY_BYTES``, 1 MiB by default).
MAX_EVENT_BYTES = 256 * 1024

Typed = tuple[str, bytes]
Version = Any  # str (ours), int or float


class NotInARun(RuntimeError):
    """The saver was used where no narad run is bound."""


def _encode(typed: Typed) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode("ascii")]


def _decode(encoded: Any) -> Typed:
    kind, data = encoded
    return str(kind), base64.b64decode(data)


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


@dataclass
class _Blob:
    """A channel's value at one version: whole, empty, or a list as
    ``base[:keep] + items`` (``base`` another version of the channel)."""

    value: Typed | None = None
    empty: bool = False
    base: Version = None
    keep: int = 0
    items: list[Typed] | None = None


@dataclass
class _Saved:
    checkpoint: Typed
    metadata: Typed
    parent: str | None


#: (thread, namespace, checkpoint id) -> (task id, index) -> (task id, channel, value, task path)
_Writes = dict[tuple[str, int], tuple[str, str, Typed, str]]


class _Store:
    """The checkpoints of a journal, folded from its ``run.custom`` events."""

    def __init__(self, ctx: RunContext | None, events: Iterable[Event] = ()) -> None:
        self.ctx = ctx
        self.checkpoints: dict[tuple[str, str], dict[str, _Saved]] = {}
        self.writes: dict[tuple[str, str, str], _Writes] = {}
        self.blobs: dict[tuple[str, str, str, Version], _Blob] = {}
        #: The version of each channel written last (the base of its next list value).
        self.latest: dict[tuple[str, str, str], Version] = {}
        self.seen: set[str] = set()
        self.read = 0
        self._items: dict[tuple[str, str, str, Version], list[Typed]] = {}
        for event in events:
            self.fold(event)

    def refresh(self) -> None:
        """Folds what the run's holder read or wrote since the last refresh."""
        if self.ctx is None:
            return
        events = self.ctx.journal
        for event in events[self.read :]:
            self.fold(event)
        self.read = len(events)

    def fold(self, event: Mapping[str, Any]) -> None:
        name = event.get("name")
        if event.get("type") != "run.custom" or name not in _NAMES:
            return
        event_id = str(event.get("eventId"))
        if event_id in self.seen:
            return
        self.seen.add(event_id)
        value = event.get("value")
        if not isinstance(value, Mapping):
            return
        thread, ns = str(value.get("thread")), str(value.get("ns") or "")
        if name == DELETED:
            self._forget(thread)
        elif name == WRITES:
            self._fold_writes(thread, ns, value)
        else:
            for record in value.get("channels") or ():
                self._fold_blob(thread, ns, record)
            if name == CHECKPOINT:
                parent = value.get("parent")
                self.checkpoints.setdefault((thread, ns), {})[str(value["id"])] = _Saved(
                    checkpoint=_decode(value["checkpoint"]),
                    metadata=_decode(value["metadata"]),
                    parent=str(parent) if parent is not None else None,
                )

    def _fold_blob(self, thread: str, ns: str, record: Mapping[str, Any]) -> None:
        channel, version = str(record["channel"]), record["version"]
        if record.get("empty"):
            blob = _Blob(empty=True)
        elif "items" in record:
            blob = _Blob(
                base=record.get("base"),
                keep=int(record.get("keep") or 0),
                items=[_decode(i) for i in record["items"]],
            )
        else:
            blob = _Blob(value=_decode(record["value"]))
        self.blobs[(thread, ns, channel, version)] = blob
        self.latest[(thread, ns, channel)] = version

    def _fold_writes(self, thread: str, ns: str, value: Mapping[str, Any]) -> None:
        key = (thread, ns, str(value["checkpoint"]))
        task, path = str(value["task"]), str(value.get("path") or "")
        stored = self.writes.setdefault(key, {})
        for index, channel, typed in value.get("writes") or ():
            inner = (task, int(index))
            if inner[1] >= 0 and inner in stored:
                continue
            stored[inner] = (task, str(channel), _decode(typed), path)

    def _forget(self, thread: str) -> None:
        tables: list[dict[Any, Any]] = [
            self.checkpoints,
            self.writes,
            self.blobs,
            self.latest,
            self._items,
        ]
        for table in tables:
            for key in [k for k in table if k[0] == thread]:
                del table[key]

    def items(self, thread: str, ns: str, channel: str, version: Version) -> list[Typed] | None:
        """The serialised items of a list value, ``None`` when it is no list."""
        key = (thread, ns, channel, version)
        if key in self._items:
            return self._items[key]
        chain: list[_Blob] = []
        at: Version = version
        found: list[Typed] = []
        while True:
            blob = self.blobs.get((thread, ns, channel, at))
            if blob is None or blob.items is None:
                return None
            chain.append(blob)
            if not blob.keep or blob.base is None:
                break
            cached = self._items.get((thread, ns, channel, blob.base))
            if cached is not None:
                found = cached
                break
            at = blob.base
        for blob in reversed(chain):
            found = found[: blob.keep] + list(blob.items or ())
        if len(self._items) > 64:
            self._items.clear()
        self._items[key] = found
        return found

    def value(self, thread: str, ns: str, channel: str, version: Version, serde: Any) -> Any:
        """The channel's value at ``version`` (``_MISSING`` when empty or unknown)."""
        blob = self.blobs.get((thread, ns, channel, version))
        if blob is None or blob.empty:
            return _MISSING
        if blob.value is not None:
            return serde.loads_typed(blob.value)
        items = self.items(thread, ns, channel, version)
        if items is None:
            raise ValueError(f"the journal lacks a value of channel {channel!r} ({version})")
        return [serde.loads_typed(i) for i in items]

    def ordered_writes(self, thread: str, ns: str, checkpoint_id: str) -> list[Any]:
        stored = self.writes.get((thread, ns, checkpoint_id), {})
        return [stored[k] for k in sorted(stored, key=lambda k: writes_sort_key(stored[k][3], *k))]


_MISSING = object()

#: The run whose journal holds the checkpoints of the graph running now.
_CURRENT: contextvars.ContextVar[_Store | None] = contextvars.ContextVar(
    "narad_langgraph_checkpoints", default=None
)


@contextlib.contextmanager
def checkpoints_in(ctx: RunContext) -> Iterator[None]:
    """Binds ``ctx``'s run for the ``NaradSaver`` s used within (``handler`` does
    this for the graph it runs; use it when a handler of your own runs a graph)."""
    token = _CURRENT.set(_Store(ctx))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _common_prefix(before: list[Typed], after: list[Typed]) -> int:
    n = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        n += 1
    return n


class NaradSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose store is the narad run's journal (see the module).

    - ``serde``: LangGraph's serializer (default ``JsonPlusSerializer``);
    - ``max_event_bytes``: the largest event it writes (values above it go in
      events of their own);
    - ``journal``: events already read (a run's history): a saver that reads
      their checkpoints, outside a run, and does not write.
    """

    def __init__(
        self,
        *,
        serde: SerializerProtocol | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        journal: Iterable[Event] | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.max_event_bytes = max_event_bytes
        self._journal = _Store(None, journal) if journal is not None else None

    # --- where the checkpoints are --------------------------------------------

    def _store(self) -> _Store:
        if self._journal is not None:
            return self._journal
        store = _CURRENT.get()
        if store is None:
            raise NotInARun(
                "NaradSaver keeps a graph's checkpoints in a narad run's journal and works only "
                "inside a claimed narad run: serve the graph with "
                "narad.integrations.langgraph.handler(graph) (or bind a run with "
                "checkpoints_in(ctx)); no narad run is active here"
            )
        store.refresh()
        return store

    def _writer(self) -> tuple[_Store, RunContext]:
        store = self._store()
        if store.ctx is None:
            raise NotInARun(
                "this NaradSaver reads the journal it was given; it writes only inside a "
                "claimed narad run"
            )
        return store, store.ctx

    async def _append(self, store: _Store, ctx: RunContext, events: list[Event]) -> None:
        """Appends ``events``, one request unless they are large, and folds them."""
        batches: list[list[Event]] = [events]
        if len(events) > 1 and sum(_size(e) for e in events) > self.max_event_bytes:
            batches = [[e] for e in events]
        for batch in batches:
            await ctx.append(batch)
            for event in batch:
                store.fold(event)

    def _events(
        self, ctx: RunContext, name: str, head: Mapping[str, Any], key: str, records: list[Any]
    ) -> list[Event]:
        """``records`` in events of ``name`` (``head`` + ``{key: records}``), each
        within ``max_event_bytes`` unless a record alone is larger."""
        groups: list[list[Any]] = [[]]
        room = self.max_event_bytes - _size(head) - 64
        used = 0
        for record in records:
            size = _size(record) + 1
            if groups[-1] and used + size > room:
                groups.append([])
                used = 0
            groups[-1].append(record)
            used += size
        return [ctx.event("run.custom", name=name, value={**head, key: g}) for g in groups]

    # --- LangGraph's contract ---------------------------------------------------

    def _tuple(
        self, store: _Store, thread: str, ns: str, checkpoint_id: str, saved: _Saved
    ) -> CheckpointTuple:
        checkpoint = cast("Checkpoint", self.serde.loads_typed(saved.checkpoint))
        values: dict[str, Any] = {}
        for channel, version in checkpoint["channel_versions"].items():
            value = store.value(thread, ns, channel, version, self.serde)
            if value is not _MISSING:
                values[channel] = value
        writes = store.ordered_writes(thread, ns, checkpoint_id)

        def config_of(checkpoint_id: str) -> RunnableConfig:
            return {
                "configurable": {
                    "thread_id": thread,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }
            }

        return CheckpointTuple(
            config=config_of(checkpoint_id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=cast("CheckpointMetadata", self.serde.loads_typed(saved.metadata)),
            parent_config=config_of(saved.parent) if saved.parent else None,
            pending_writes=[(t, c, self.serde.loads_typed(v)) for t, c, v, _ in writes],
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint of ``config`` (its ``checkpoint_id``, else the thread's latest)."""
        store = self._store()
        configurable = config["configurable"]
        thread, ns = str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))
        saved = store.checkpoints.get((thread, ns), {})
        checkpoint_id = get_checkpoint_id(config) or max(saved, default=None)
        if checkpoint_id is None or checkpoint_id not in saved:
            return None
        return self._tuple(store, thread, ns, checkpoint_id, saved[checkpoint_id])

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints of the journal, newest first (``InMemorySaver``'s filters)."""
        store = self._store()
        configurable = config["configurable"] if config else {}
        thread = configurable.get("thread_id")
        want_ns = configurable.get("checkpoint_ns")
        want_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        for (t, ns), saved in list(store.checkpoints.items()):
            if (thread is not None and t != str(thread)) or (want_ns is not None and ns != want_ns):
                continue
            for checkpoint_id in sorted(saved, reverse=True):
                if want_id and checkpoint_id != want_id:
                    continue
                if before_id and checkpoint_id >= before_id:
                    continue
                if filter:
                    metadata = self.serde.loads_typed(saved[checkpoint_id].metadata)
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                if limit is not None:
                    if limit <= 0:
                        break
                    limit -= 1
                yield self._tuple(store, t, ns, checkpoint_id, saved[checkpoint_id])

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        raise _synchronous()

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        raise _synchronous()

    def delete_thread(self, thread_id: str) -> None:
        raise _synchronous()

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in self.list(config, filter=filter, before=before, limit=limit):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Appends the checkpoint, with the values of the channels whose version changed."""
        store, ctx = self._writer()
        configurable = config["configurable"]
        thread, ns = str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))
        content = checkpoint.copy()
        values: dict[str, Any] = content.pop("channel_values")  # type: ignore[misc]
        records: builtins.list[Any] = []
        for channel, version in new_versions.items():
            if channel not in values:
                records.append({"channel": channel, "version": version, "empty": True})
            elif type(values[channel]) is list:
                records.extend(self._list_records(store, thread, ns, channel, version, values))
            else:
                value = _encode(self.serde.dumps_typed(values[channel]))
                records.append({"channel": channel, "version": version, "value": value})
        head = {
            "thread": thread,
            "ns": ns,
            "id": checkpoint["id"],
            "parent": configurable.get("checkpoint_id"),
            "checkpoint": _encode(self.serde.dumps_typed(content)),
            "metadata": _encode(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
        }
        events = self._events(ctx, CHECKPOINT, head, "channels", records)
        for event in events[:-1]:
            # Values that did not fit: in events of their own, before the checkpoint.
            event["name"] = BLOBS
            event["value"] = {"thread": thread, "ns": ns, "channels": event["value"]["channels"]}
        await self._append(store, ctx, events)
        return {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def _list_records(
        self,
        store: _Store,
        thread: str,
        ns: str,
        channel: str,
        version: Version,
        values: Mapping[str, Any],
    ) -> builtins.list[Any]:
        """A list value as what changed since the channel's last version; new items
        beyond ``max_event_bytes`` in pieces (versions ``{version}~{n}``)."""
        items = [self.serde.dumps_typed(v) for v in values[channel]]
        base = store.latest.get((thread, ns, channel))
        before = store.items(thread, ns, channel, base) if base is not None else None
        keep = _common_prefix(before, items) if before else 0
        new = [_encode(i) for i in items[keep:]]
        pieces: builtins.list[builtins.list[builtins.list[str]]] = [[]]
        used, room = 0, self.max_event_bytes // 2
        for item in new:
            size = _size(item)
            if pieces[-1] and used + size > room:
                pieces.append([])
                used = 0
            pieces[-1].append(item)
            used += size
        records: builtins.list[Any] = []
        at_base: Version = base if keep else None
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            at = version if last else f"{version}~{n}"
            records.append(
                {"channel": channel, "version": at, "base": at_base, "keep": keep, "items": piece}
            )
            at_base, keep = at, keep + len(piece)
        return records

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Appends a task's writes (those not written before: a replay writes nothing twice)."""
        store, ctx = self._writer()
        configurable = config["configurable"]
        thread, ns = str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))
        checkpoint_id = str(configurable["checkpoint_id"])
        stored = store.writes.get((thread, ns, checkpoint_id), {})
        records: builtins.list[Any] = []
        for n, (channel, value) in enumerate(writes):
            index = WRITES_IDX_MAP.get(channel, n)
            if index >= 0 and (task_id, index) in stored:
                continue
            records.append([index, channel, _encode(self.serde.dumps_typed(value))])
        if not records:
            return
        head = {
            "thread": thread,
            "ns": ns,
            "checkpoint": checkpoint_id,
            "task": task_id,
            "path": task_path,
        }
        await self._append(store, ctx, self._events(ctx, WRITES, head, "writes", records))

    async def adelete_thread(self, thread_id: str) -> None:
        """Forgets the thread's checkpoints (the events stay in the journal)."""
        store, ctx = self._writer()
        event = ctx.event("run.custom", name=DELETED, value={"thread": str(thread_id)})
        await self._append(store, ctx, [event])

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A channel's next version: a zero-padded counter (versions compare as
        strings) and a random tail, so that a fork's version of a channel never
        names another branch's value (``InMemorySaver``'s scheme, shorter: each
        checkpoint names every channel's version)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:010}.{random.getrandbits(32):08x}"


def _synchronous() -> RuntimeError:
    return RuntimeError(
        "NaradSaver writes through a narad run's journal, asynchronously: run the graph with "
        "its async API (astream / ainvoke), as narad.integrations.langgraph.handler does"
    )
