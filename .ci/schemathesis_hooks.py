"""What JSON Schema cannot say about narad's API, taught to schemathesis.

A few rules of the API tie one part of a request to another, which JSON
Schema (and so OpenAPI) cannot express; the document says each in words and
the server answers 400 when one is broken. Cases meant to be valid are made
to keep them, or dropped when they cannot be; cases meant to break the
schema are left as they were generated:

- the HTTP form of a client executor's messages (`heartbeat`, `finish`)
  carries the protocol's control message whole, and its `clientExecutorId`
  must be the path's;
- a proposed event may name its `sessionId`, and it must be the path's (the
  events here leave it out: the path's is filled in);
- history takes one cursor at a time, a run-tree cursor (`afterSequence`)
  with its `rootRunId` and a workflow cursor (`afterWorkflowSequence`) with
  its `workflowId`.

A case meant to be valid whose body holds an integer no 64-bit integer
holds (Python's integers have no bound) is dropped too: the server refuses
it rather than keep the nearest float (400 NRD-0003, said in the document's
description), and no schema can say so, since JSON Schema counts
`18446744073709551616` and `1.8446744073709552e19` as one number, which
the server keeps as sent.

And a case meant to be valid whose body the document's own schema refuses
is dropped: schemathesis' coverage phase builds objects member by member
and overlooks a `dependentRequired` reached through `allOf` (it proposed a
`runId` without its `rootRunId`, which the document forbids).
"""

import jsonschema_rs
import schemathesis
from schemathesis.generation import GenerationMode

EXECUTOR_MESSAGES = (
    "/v1/executors/{clientExecutorId}/heartbeat",
    "/v1/executors/{clientExecutorId}/finish",
)
APPEND = "/v1/sessions/{sessionId}/events"
HISTORY_CURSORS = {
    "afterSessionSequence": None,
    "afterSequence": "rootRunId",
    "afterWorkflowSequence": "workflowId",
}


def _positive(case):
    return case.meta is None or case.meta.generation.mode == GenerationMode.POSITIVE


@schemathesis.hook
def map_case(context, case):
    if not _positive(case):
        return case
    path = case.operation.path
    parameters = case.path_parameters or {}
    if (
        path in EXECUTOR_MESSAGES
        and isinstance(case.body, dict)
        and "clientExecutorId" in case.body
        and "clientExecutorId" in parameters
    ):
        case.body["clientExecutorId"] = parameters["clientExecutorId"]
    if path == APPEND and isinstance(case.body, dict) and isinstance(case.body.get("events"), list):
        for event in case.body["events"]:
            if isinstance(event, dict):
                event.pop("sessionId", None)
    return case


_validators = {}


def _body_validator(operation):
    """A validator of the operation's JSON body, resolving the document's refs."""
    key = (operation.method, operation.path)
    if key not in _validators:
        document = operation.schema.raw_schema
        body = (
            document["paths"][operation.path][operation.method.lower()]
            .get("requestBody", {})
            .get("content", {})
            .get("application/json", {})
            .get("schema")
        )
        _validators[key] = (
            None if body is None else jsonschema_rs.Draft202012Validator({**document, **body})
        )
    return _validators[key]


def _holds_wide_integer(value):
    """Whether a JSON value holds an integer outside -2^63 .. 2^64 - 1."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -(2**63) <= value <= 2**64 - 1
    if isinstance(value, list):
        return any(_holds_wide_integer(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_wide_integer(v) for v in value.values())
    return False


def _keeps_history_rules(query):
    given = [name for name in HISTORY_CURSORS if name in query]
    return len(given) <= 1 and all(
        HISTORY_CURSORS[name] is None or HISTORY_CURSORS[name] in query for name in given
    )


@schemathesis.hook
def filter_case(context, case):
    if not _positive(case):
        return True
    operation = case.operation
    if operation.path in EXECUTOR_MESSAGES:
        # A value taken from an earlier answer may arrive percent-encoded in
        # the path, where the server decodes it: the two would differ. And
        # not every phase passes its cases through map_case.
        named = case.body.get("clientExecutorId") if isinstance(case.body, dict) else None
        path_id = str((case.path_parameters or {}).get("clientExecutorId", ""))
        if "%" in path_id or (named is not None and named != path_id):
            return False
    if operation.path == APPEND and operation.method.upper() == "GET":
        if not _keeps_history_rules(case.query or {}):
            return False
    if operation.path == APPEND and operation.method.upper() == "POST":
        # A stateful step may fill in a sessionId after map_case ran.
        events = case.body.get("events") if isinstance(case.body, dict) else None
        if isinstance(events, list) and any(isinstance(e, dict) and "sessionId" in e for e in events):
            return False
    if not isinstance(case.body, (dict, list)):
        # No body (schemathesis' NotSet), or one that is not JSON.
        return True
    if _holds_wide_integer(case.body):
        return False
    validator = _body_validator(operation)
    return validator is None or validator.is_valid(case.body)
