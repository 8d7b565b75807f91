/**
 * Reading wire objects (§5, §13): the profiles and their namespaces, the
 * rule a refused object breaks, and the classifier that decides whether an
 * object is accepted (valid against narad's JSON Schemas), ignored (a
 * profile not negotiated, or a type outside every negotiated namespace) or
 * refused.
 */
import { WIRE_TYPES, validateWire } from "./generated/wire.js";

/** The protocol version this client speaks. */
export const PROTOCOL_VERSION = "narad/v1";

/** Every profile of narad/v1 (§2.1) and the namespaces of type names it owns. */
export const PROFILE_NAMESPACES = {
  "narad.core/v1": ["run.", "interrupt.", "tool.", "session."],
  "narad.workflow/v1": ["workflow."],
  "narad.conversation/v1": ["message.", "messages.", "reasoning."],
  "narad.attachments/v1": ["attachment.", "artifact."],
  "narad.state/v1": ["state."],
  "narad.ui/v1": ["ui.", "view."],
  "narad.graph/v1": ["graph."],
  "narad.progress/v1": ["progress."],
  "narad.extensions/v1": ["node."],
  "narad.workspace/v1": ["workspace.", "node."],
  "narad.client-executor/v1": ["client.", "server."],
} as const;

/** A profile id, e.g. `narad.conversation/v1`. */
export type ProfileId = keyof typeof PROFILE_NAMESPACES;

/** Every profile id; core is always negotiated. */
export const ALL_PROFILES = Object.keys(PROFILE_NAMESPACES) as ProfileId[];

/** Authority, watch, hydrate or control (§5). */
export type WireKind = "authority" | "watch" | "hydrate" | "control";

/** A wire object's type, its kind and the profile that owns it. */
export interface WireTypeInfo {
  readonly kind: WireKind;
  readonly profile: ProfileId;
}

/** The wire types of narad/v1, generated from `schema/`. */
export const WIRE_TYPE_INFO = WIRE_TYPES as Readonly<Record<string, WireTypeInfo>>;

/** A wire object that passed its schema. */
export interface WireObject {
  readonly protocolVersion: string;
  readonly type: string;
  readonly [member: string]: unknown;
}

/**
 * A broken rule (`docs/rules.md`): the id, the event that broke it and,
 * when one field is at fault, its JSON Pointer.
 */
export class Violation extends Error {
  /** The rule id, e.g. `run.terminal.open-work`. */
  readonly rule: string;
  /** The offending event, when there is one. */
  eventId: string | undefined;
  /** The JSON Pointer of the offending field. */
  readonly pointer: string | undefined;
  constructor(rule: string, message: string, pointer?: string) {
    super(message);
    this.name = "Violation";
    this.rule = rule;
    this.pointer = pointer;
    this.eventId = undefined;
  }
}

/** What the classifier made of an object. */
export type Classified =
  | { readonly outcome: "accepted"; readonly object: WireObject; readonly info: WireTypeInfo }
  | { readonly outcome: "ignored"; readonly type: string; readonly reason: "not-negotiated" | "unclaimed" };

/** The negotiated profiles as a set, core always included. */
export function profileSet(profiles: Iterable<string>): ReadonlySet<ProfileId> {
  const set = new Set<ProfileId>(["narad.core/v1"]);
  for (const p of profiles) {
    if (!(p in PROFILE_NAMESPACES)) throw new Error(`unknown profile ${JSON.stringify(p)}`);
    set.add(p as ProfileId);
  }
  return set;
}

/** The negotiated profile whose namespace holds `type`, if any. */
export function claiming(profiles: ReadonlySet<ProfileId>, type: string): ProfileId | undefined {
  return ALL_PROFILES.find((p) => profiles.has(p) && PROFILE_NAMESPACES[p].some((ns) => type.startsWith(ns)));
}

const validate = validateWire;

/**
 * Classifies one object for a reader that negotiated `profiles` (§13): a
 * version other than narad/v1 is refused (`wire.version`); an unknown type
 * fails closed inside a negotiated namespace (`wire.unknown-type`) and is
 * ignored outside; a known type of a profile not negotiated is ignored;
 * anything else must match its schema (`wire.invalid`, with the pointer).
 */
export function classify(value: unknown, profiles: ReadonlySet<ProfileId>): Classified {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new Violation("wire.invalid", "a wire object must be a JSON object", "");
  }
  const o = value as Record<string, unknown>;
  if (!("protocolVersion" in o)) throw new Violation("wire.invalid", "/protocolVersion: missing field", "/protocolVersion");
  if (typeof o.protocolVersion !== "string") {
    throw new Violation("wire.invalid", `/protocolVersion: must be the string "${PROTOCOL_VERSION}"`, "/protocolVersion");
  }
  if (o.protocolVersion !== PROTOCOL_VERSION) {
    throw new Violation(
      "wire.version",
      `unsupported protocol version ${JSON.stringify(o.protocolVersion)}: this reader speaks "${PROTOCOL_VERSION}" only`,
      "/protocolVersion",
    );
  }
  if (typeof o.type !== "string") throw new Violation("wire.invalid", "/type: missing or not a string", "/type");
  const type = o.type;
  const info = WIRE_TYPE_INFO[type];
  if (info === undefined) {
    const profile = claiming(profiles, type);
    if (profile !== undefined) {
      throw new Violation(
        "wire.unknown-type",
        `unknown type ${JSON.stringify(type)} in the namespace of negotiated profile ${profile}: an active profile's unknown types fail closed`,
        "/type",
      );
    }
    return { outcome: "ignored", type, reason: "unclaimed" };
  }
  if (!profiles.has(info.profile)) return { outcome: "ignored", type, reason: "not-negotiated" };
  if (!validate(value)) {
    const e = validate.errors?.[0];
    const missing = e?.params.missingProperty as string | undefined;
    const pointer = (e?.instancePath ?? "") + (missing !== undefined ? `/${missing.replace(/~/g, "~0").replace(/\//g, "~1")}` : "");
    throw new Violation("wire.invalid", `${pointer === "" ? "(the object)" : pointer}: ${e?.message ?? "invalid"}`, pointer);
  }
  return { outcome: "accepted", object: value as WireObject, info };
}
