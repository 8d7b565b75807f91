"""Reading wire objects (§5, §13): the profiles and their namespaces, the rule a
refused object breaks, and the classifier that decides whether an object is
accepted (valid against narad's JSON Schemas), ignored (a profile not
negotiated, or a type outside every negotiated namespace) or refused.

The schemas ship in the package (`narad/schema/`, copied from the
repository's `schema/` by `scripts/sync_schema.py`); the table of wire
types — each type's kind and owning profile (`x-narad-profile`) — is read
from them, and each type's validator (JSON Schema 2020-12, `format`
asserted, as `schema/README.md` asks) is built the first time the type is
met.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any, Final, Literal, TypeAlias, cast, get_args

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource

__all__ = [
    "ALL_PROFILES",
    "PROFILE_NAMESPACES",
    "PROTOCOL_VERSION",
    "WIRE_TYPE_INFO",
    "Accepted",
    "Classified",
    "Ignored",
    "ProfileId",
    "Violation",
    "WireKind",
    "WireObject",
    "WireTypeInfo",
    "claiming",
    "classify",
    "profile_set",
    "validate",
]

#: The protocol version this client speaks.
PROTOCOL_VERSION: Final = "narad/v1"

#: A profile id, e.g. `narad.conversation/v1`.
ProfileId: TypeAlias = Literal[
    "narad.core/v1",
    "narad.workflow/v1",
    "narad.conversation/v1",
    "narad.attachments/v1",
    "narad.state/v1",
    "narad.ui/v1",
    "narad.graph/v1",
    "narad.progress/v1",
    "narad.extensions/v1",
    "narad.workspace/v1",
    "narad.client-executor/v1",
]

#: Every profile of narad/v1 (§2.1) and the namespaces of type names it owns.
PROFILE_NAMESPACES: Final[Mapping[ProfileId, tuple[str, ...]]] = {
    "narad.core/v1": ("run.", "interrupt.", "tool.", "session."),
    "narad.workflow/v1": ("workflow.",),
    "narad.conversation/v1": ("message.", "messages.", "reasoning."),
    "narad.attachments/v1": ("attachment.", "artifact."),
    "narad.state/v1": ("state.",),
    "narad.ui/v1": ("ui.", "view."),
    "narad.graph/v1": ("graph.",),
    "narad.progress/v1": ("progress.",),
    "narad.extensions/v1": ("node.",),
    "narad.workspace/v1": ("workspace.", "node."),
    "narad.client-executor/v1": ("client.", "server."),
}

#: Every profile id, in the order of §2.1; core is always negotiated.
ALL_PROFILES: Final[tuple[ProfileId, ...]] = get_args(ProfileId)

#: Authority, watch, hydrate or control (§5).
WireKind: TypeAlias = Literal["authority", "watch", "hydrate", "control"]

#: A wire object as read off the wire: a JSON object.
WireObject: TypeAlias = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class WireTypeInfo:
    """A wire type's kind and the profile that owns it."""

    kind: WireKind
    profile: ProfileId


class Violation(Exception):
    """A broken rule (`docs/rules.md`): its id, the event that broke it and,
    when one field is at fault, that field's JSON Pointer."""

    def __init__(self, rule: str, message: str, pointer: str | None = None) -> None:
        super().__init__(message)
        #: The rule id, e.g. `run.terminal.open-work`.
        self.rule = rule
        #: What was wrong, for a person.
        self.message = message
        #: The JSON Pointer of the offending field, when one is at fault.
        self.pointer = pointer
        #: The offending event's eventId, when there is one.
        self.event_id: str | None = None

    def __repr__(self) -> str:
        return f"Violation({self.rule!r}, {self.message!r})"


@dataclass(frozen=True, slots=True)
class Accepted:
    """An object of a negotiated profile that passed its schema."""

    object: WireObject
    info: WireTypeInfo


@dataclass(frozen=True, slots=True)
class Ignored:
    """An object a reader passes over: a profile it did not negotiate, or a
    type outside every namespace it did."""

    type: str
    reason: Literal["not-negotiated", "unclaimed"]


#: What :func:`classify` made of an object.
Classified: TypeAlias = Accepted | Ignored

# --- the schemas ---------------------------------------------------------

_BASE = "https://schema.narad.invalid/"
_KINDS: Final[Mapping[str, WireKind]] = {
    "events": "authority",
    "watch": "watch",
    "hydrate": "hydrate",
    "control": "control",
}
_SHARED = ("defs.json", "envelopes.json")


def _read(*path: str) -> dict[str, Any]:
    text = files("narad").joinpath("schema", *path).read_text(encoding="utf-8")
    return cast("dict[str, Any]", json.loads(text))


def _load() -> tuple[dict[str, WireTypeInfo], dict[str, dict[str, Any]], Registry[Any]]:
    root = files("narad") / "schema"
    schemas: dict[str, dict[str, Any]] = {}
    types: dict[str, WireTypeInfo] = {}
    resources: list[tuple[str, Resource[Any]]] = []
    for name in _SHARED:
        uri = _BASE + name
        resources.append((uri, Resource.from_contents({**_read(name), "$id": uri})))
    for folder, kind in _KINDS.items():
        for entry in sorted((root / folder).iterdir(), key=lambda e: e.name):
            if not entry.name.endswith(".json"):
                continue
            type_name = entry.name.removesuffix(".json")
            uri = f"{_BASE}{folder}/{entry.name}"
            schema = {**_read(folder, entry.name), "$id": uri}
            profile = schema.get("x-narad-profile")
            if profile not in PROFILE_NAMESPACES:
                raise RuntimeError(f"narad/schema/{folder}/{entry.name}: no known x-narad-profile")
            types[type_name] = WireTypeInfo(kind, cast("ProfileId", profile))
            schemas[type_name] = schema
            resources.append((uri, Resource.from_contents(schema)))
    if not types:
        raise RuntimeError("narad/schema holds no wire types: run scripts/sync_schema.py")
    return types, schemas, Registry().with_resources(resources)


_TYPES, _SCHEMAS, _REGISTRY = _load()

#: The wire types of narad/v1, read from the schemas: each type's kind and owning profile.
WIRE_TYPE_INFO: Final[Mapping[str, WireTypeInfo]] = _TYPES

_FORMATS = Draft202012Validator.FORMAT_CHECKER
if "date-time" not in _FORMATS.checkers:  # pragma: no cover - a broken install
    raise ImportError("narad validates timestamps with rfc3339-validator: pip install it")


@cache
def _validator(type_name: str) -> Draft202012Validator:
    return Draft202012Validator(_SCHEMAS[type_name], registry=_REGISTRY, format_checker=_FORMATS)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _pointer(error: ValidationError) -> str:
    """The JSON Pointer of the field at fault: the instance path, and for a
    missing member the member itself (as Ajv's `missingProperty` names it)."""
    tokens = [str(p) for p in error.absolute_path]
    instance = error.instance
    if isinstance(instance, Mapping):
        if error.validator == "required" and isinstance(error.validator_value, list):
            missing = [m for m in error.validator_value if m not in instance]
            tokens += missing[:1]
        elif error.validator == "dependentRequired" and isinstance(error.validator_value, dict):
            for member, needs in error.validator_value.items():
                gone = [n for n in needs if member in instance and n not in instance]
                if gone:
                    tokens.append(gone[0])
                    break
    return "".join("/" + _escape(t) for t in tokens)


def validate(value: WireObject, type_name: str) -> None:
    """Checks `value` against the schema of the known wire type `type_name`;
    raises a `wire.invalid` :class:`Violation` with the pointer of the first problem."""
    error = best_match(_validator(type_name).iter_errors(value))
    if error is None:
        return
    pointer = _pointer(error)
    where = "(the object)" if pointer == "" else pointer
    raise Violation("wire.invalid", f"{where}: {error.message}", pointer)


# --- profiles and classification ----------------------------------------


def profile_set(profiles: Iterable[str]) -> frozenset[ProfileId]:
    """The negotiated profiles as a set, core always included; raises
    `ValueError` for an id that is no profile of narad/v1."""
    chosen: set[ProfileId] = {"narad.core/v1"}
    for p in profiles:
        if p not in PROFILE_NAMESPACES:
            raise ValueError(f"unknown profile {json.dumps(p)}")
        chosen.add(cast("ProfileId", p))
    return frozenset(chosen)


def claiming(profiles: AbstractSet[ProfileId], type_name: str) -> ProfileId | None:
    """The negotiated profile whose namespace holds `type_name`, if any."""
    for p in ALL_PROFILES:
        if p in profiles and type_name.startswith(PROFILE_NAMESPACES[p]):
            return p
    return None


def classify(value: object, profiles: AbstractSet[ProfileId]) -> Classified:
    """Classifies one object for a reader that negotiated `profiles` (§13).

    A version other than narad/v1 is refused (`wire.version`); an unknown
    type fails closed inside a negotiated namespace (`wire.unknown-type`)
    and is ignored outside; a known type of a profile not negotiated is
    ignored; anything else must match its schema (`wire.invalid`, with the
    pointer). Raises :class:`Violation` for a refused object.
    """
    if not isinstance(value, Mapping):
        raise Violation("wire.invalid", "a wire object must be a JSON object", "")
    o = cast("WireObject", value)
    if "protocolVersion" not in o:
        raise Violation("wire.invalid", "/protocolVersion: missing field", "/protocolVersion")
    version = o["protocolVersion"]
    if not isinstance(version, str):
        raise Violation(
            "wire.invalid",
            f'/protocolVersion: must be the string "{PROTOCOL_VERSION}"',
            "/protocolVersion",
        )
    if version != PROTOCOL_VERSION:
        raise Violation(
            "wire.version",
            f"unsupported protocol version {json.dumps(version)}: "
            f'this reader speaks "{PROTOCOL_VERSION}" only',
            "/protocolVersion",
        )
    type_name = o.get("type")
    if not isinstance(type_name, str):
        raise Violation("wire.invalid", "/type: missing or not a string", "/type")
    info = WIRE_TYPE_INFO.get(type_name)
    if info is None:
        profile = claiming(profiles, type_name)
        if profile is not None:
            raise Violation(
                "wire.unknown-type",
                f"unknown type {json.dumps(type_name)} in the namespace of negotiated profile "
                f"{profile}: an active profile's unknown types fail closed",
                "/type",
            )
        return Ignored(type_name, "unclaimed")
    if info.profile not in profiles:
        return Ignored(type_name, "not-negotiated")
    validate(o, type_name)
    return Accepted(o, info)
