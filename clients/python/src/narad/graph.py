"""The run graphs of a session (`narad.graph/v1`, spec §9.7), kept from the
`graph.snapshot` and `graph.delta` hydrate records a stream sends to a client
of the graph profile. One graph per run journal (scope `run`, keyed by
`rootRunId`); the document model is `docs/graph.md`.

A snapshot replaces its graph unless it is older than the one held; a delta
applies only on top of the revision it names. A delta that does not fit (a
revision was missed) leaves the graph as it was and marks it stale: it is
drawn as last known until the next snapshot, which a stream sends again on
every (re)connection after history.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias, TypedDict, cast

from .jsonpatch import Json, PatchError, PatchOperation, apply_patch

__all__ = ["GraphDocument", "GraphEdge", "GraphNode", "GraphOutcome", "HeldGraph", "RunGraphs"]

#: A node of a run graph (a run, a tool call or an interrupt): `id`, `kind`
#: and the members `docs/graph.md` gives its kind (`status`, `runId`, …).
GraphNode: TypeAlias = dict[str, Json]

#: An edge of a run graph (`parent`, `tool.call` or `interrupt`, from the
#: owning run): `id`, `kind`, `from`, `to`.
GraphEdge: TypeAlias = dict[str, Json]


class GraphDocument(TypedDict):
    """The graph document deltas patch: the `rootNodeId`, `nodes` and `edges` of a snapshot."""

    rootNodeId: str
    nodes: list[GraphNode]
    edges: list[GraphEdge]


@dataclass(frozen=True, slots=True)
class HeldGraph:
    """One run journal's graph as held by the client."""

    #: The run journal.
    root_run_id: str
    #: The revision of `document`.
    revision: int
    document: GraphDocument
    #: A delta did not fit: `document` is the last known one until the next snapshot.
    stale: bool = False


#: What :meth:`RunGraphs.apply` did with a record.
GraphOutcome: TypeAlias = Literal["replaced", "patched", "old", "stale", "ignored"]


def _revision(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() else None


class RunGraphs:
    """The run graphs of one session, in the order their journals were first seen."""

    def __init__(self) -> None:
        """No graphs yet."""
        self._graphs: dict[str, HeldGraph] = {}

    def apply(self, record: Mapping[str, object]) -> GraphOutcome:
        """Applies a `graph.snapshot` or `graph.delta` (other records are ignored)."""
        root = record.get("rootRunId")
        revision = _revision(record.get("revision"))
        if record.get("scope") != "run" or not isinstance(root, str) or revision is None:
            return "ignored"
        held = self._graphs.get(root)
        kind = record.get("type")
        if kind == "graph.snapshot":
            if held is not None and not held.stale and revision < held.revision:
                return "old"
            root_node = record.get("rootNodeId")
            document: GraphDocument = {
                "rootNodeId": root_node if isinstance(root_node, str) else "",
                "nodes": cast("list[GraphNode]", _list(record.get("nodes"))),
                "edges": cast("list[GraphEdge]", _list(record.get("edges"))),
            }
            self._graphs[root] = HeldGraph(root, revision, document)
            return "replaced"
        patch = record.get("patch")
        if kind != "graph.delta" or not isinstance(patch, list):
            return "ignored"
        # A stream sends a journal's snapshot before its first delta: a delta
        # of a journal never seen has nothing to patch.
        if held is None:
            return "stale"
        if revision <= held.revision:
            return "old"
        if held.stale or _revision(record.get("baseRevision")) != held.revision:
            self._graphs[root] = dataclasses.replace(held, stale=True)
            return "stale"
        try:
            patched = apply_patch(cast("Json", held.document), cast("list[PatchOperation]", patch))
        except PatchError:
            self._graphs[root] = dataclasses.replace(held, stale=True)
            return "stale"
        self._graphs[root] = HeldGraph(root, revision, cast("GraphDocument", patched))
        return "patched"

    def get(self, root_run_id: str) -> HeldGraph | None:
        """The graph of one run journal."""
        return self._graphs.get(root_run_id)

    def all(self) -> list[HeldGraph]:
        """Every graph held, in the order their journals were first seen."""
        return list(self._graphs.values())


def _list(value: object) -> list[object]:
    return copy.deepcopy(value) if isinstance(value, list) else []
