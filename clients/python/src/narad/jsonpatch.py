"""JSON Patch (RFC 6902) over JSON Pointers (RFC 6901), as narad/v1's state, UI,
view and graph documents use it (§9.6, §9.7).

The operations are the `jsonpatch` package's (python-json-patch, which
compares values the RFC's way: `true` is not `1`). What this module adds is
the contract the reducer needs: applying is atomic — a patch that fails at
any operation leaves nothing changed, and the document given is never
changed — and a failure is one :class:`PatchError` naming the operation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TypeAlias

import jsonpatch as _jsonpatch
import jsonpointer as _jsonpointer

__all__ = ["Json", "PatchError", "PatchOperation", "apply_patch"]

#: A JSON value.
Json: TypeAlias = "bool | int | float | str | list[Json] | dict[str, Json] | None"

#: One operation of a patch, as it comes off the wire
#: (`{"op": "add", "path": "/a", "value": 1}`).
PatchOperation: TypeAlias = Mapping[str, object]


class PatchError(Exception):
    """Why a patch does not apply: the index of the failing operation and the reason."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"operation {index}: {message}")
        #: The index of the operation that failed.
        self.index = index


def apply_patch(document: Json, patch: Sequence[PatchOperation]) -> Json:
    """`document` with `patch` applied; `document` itself is not changed.

    Raises :class:`PatchError` naming the first operation that does not apply.
    """
    if isinstance(patch, (str, bytes)) or not isinstance(patch, Sequence):
        raise PatchError(0, "a patch is an array of operations")
    doc: Json = copy.deepcopy(document)
    for index, op in enumerate(patch):
        if not isinstance(op, Mapping):
            raise PatchError(index, "an operation is an object")
        if not isinstance(op.get("path"), str):
            raise PatchError(index, "an operation needs a path")
        if op.get("op") in ("move", "copy") and not isinstance(op.get("from"), str):
            raise PatchError(index, f"{op.get('op')} needs from")
        try:
            # One operation at a time, in place on our own copy: the index
            # of a failure is known, and a failure discards the copy.
            doc = _jsonpatch.JsonPatch([op]).apply(doc, in_place=True)
        except (
            _jsonpatch.JsonPatchException,
            _jsonpointer.JsonPointerException,
            KeyError,
            IndexError,
            TypeError,
            ValueError,
        ) as e:
            raise PatchError(index, str(e) or type(e).__name__) from e
    return doc
