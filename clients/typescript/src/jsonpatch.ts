/**
 * JSON Patch (RFC 6902) over JSON Pointers (RFC 6901), as the state, UI and
 * view documents of narad/v1 use it (§9.6). Applying is atomic: a patch that
 * fails at any operation leaves nothing changed. Tested against the RFC's
 * published test suite (`json-patch-test-suite`).
 */

/** A JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** One operation of a patch. */
export type PatchOperation =
  | { op: "add" | "replace" | "test"; path: string; value: Json }
  | { op: "remove"; path: string }
  | { op: "move" | "copy"; from: string; path: string };

/** Why a patch does not apply. */
export class PatchError extends Error {
  /** The index of the operation that failed. */
  readonly index: number;
  constructor(index: number, message: string) {
    super(`operation ${index}: ${message}`);
    this.name = "PatchError";
    this.index = index;
  }
}

/** The tokens of a JSON Pointer; throws on a pointer that is not one. */
export function parsePointer(pointer: string): string[] {
  if (pointer === "") return [];
  if (!pointer.startsWith("/")) throw new Error(`${JSON.stringify(pointer)} is not a JSON Pointer`);
  return pointer
    .slice(1)
    .split("/")
    .map((t) => {
      if (/~[^01]|~$/.test(t)) throw new Error(`${JSON.stringify(pointer)} has an invalid ~ escape`);
      return t.replace(/~1/g, "/").replace(/~0/g, "~");
    });
}

/** Whether two JSON values are equal (object member order aside). */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a) && Array.isArray(b)) {
    return a.length === b.length && a.every((x, i) => jsonEqual(x, b[i]));
  }
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  const bo = b as Record<string, unknown>;
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(bo, k) && jsonEqual((a as Record<string, unknown>)[k], bo[k]));
}

function clone<T>(v: T): T {
  return v === undefined ? v : (JSON.parse(JSON.stringify(v)) as T);
}

const INDEX = /^(0|[1-9][0-9]*)$/;

type Container = Json[] | { [key: string]: Json };

/** Resolves the parent of `tokens` and the last token; throws when the parent does not exist. */
function parentOf(doc: { root: Json }, tokens: string[]): [Container | { root: Json }, string] {
  let here: Json | { root: Json } = doc;
  let key = "root";
  for (const t of tokens) {
    const next: Json | undefined = get(here as Container, key);
    if (next === undefined) throw new Error(`the path does not exist (at ${JSON.stringify(t)})`);
    if (typeof next !== "object" || next === null) throw new Error(`cannot descend into a scalar`);
    here = next;
    key = t;
  }
  return [here as Container, key];
}

function get(container: Container | { root: Json }, key: string): Json | undefined {
  if (Array.isArray(container)) {
    if (!INDEX.test(key)) return undefined;
    return container[Number(key)];
  }
  return Object.hasOwn(container, key) ? (container as Record<string, Json>)[key] : undefined;
}

function read(doc: { root: Json }, pointer: string): Json {
  const [parent, key] = parentOf(doc, parsePointer(pointer));
  const v = get(parent, key);
  if (v === undefined) throw new Error(`nothing at ${JSON.stringify(pointer)}`);
  return v;
}

function add(doc: { root: Json }, pointer: string, value: Json): void {
  const [parent, key] = parentOf(doc, parsePointer(pointer));
  if (Array.isArray(parent)) {
    if (key === "-") {
      parent.push(value);
      return;
    }
    if (!INDEX.test(key) || Number(key) > parent.length) {
      throw new Error(`${JSON.stringify(key)} is not an index of an array of ${parent.length}`);
    }
    parent.splice(Number(key), 0, value);
    return;
  }
  (parent as Record<string, Json>)[key] = value;
}

function remove(doc: { root: Json }, pointer: string): Json {
  const [parent, key] = parentOf(doc, parsePointer(pointer));
  const old = get(parent, key);
  if (old === undefined) throw new Error(`nothing at ${JSON.stringify(pointer)} to remove`);
  if (Array.isArray(parent)) parent.splice(Number(key), 1);
  else delete (parent as Record<string, Json>)[key];
  return old;
}

/**
 * `document` with `patch` applied; `document` itself is not changed.
 * Throws {@link PatchError} naming the operation that does not apply.
 */
export function applyPatch(document: Json, patch: readonly PatchOperation[]): Json {
  const doc = { root: clone(document) };
  patch.forEach((op, i) => {
    // Patches come off the wire: check the members the types promise.
    const raw = op as unknown as Record<string, unknown>;
    try {
      if (typeof raw.path !== "string") throw new Error("an operation needs a path");
      if ((raw.op === "add" || raw.op === "replace" || raw.op === "test") && !("value" in raw)) {
        throw new Error(`${raw.op} needs a value`);
      }
      if ((raw.op === "move" || raw.op === "copy") && typeof raw.from !== "string") throw new Error(`${raw.op} needs from`);
      switch (op.op) {
        case "add":
          add(doc, op.path, clone(op.value));
          break;
        case "remove":
          remove(doc, op.path);
          break;
        case "replace":
          remove(doc, op.path);
          add(doc, op.path, clone(op.value));
          break;
        case "move": {
          if (op.path !== op.from && op.path.startsWith(`${op.from}/`)) {
            throw new Error(`cannot move ${op.from} into its own child ${op.path}`);
          }
          add(doc, op.path, remove(doc, op.from));
          break;
        }
        case "copy":
          add(doc, op.path, clone(read(doc, op.from)));
          break;
        case "test":
          if (!jsonEqual(read(doc, op.path), op.value)) throw new Error(`test failed at ${JSON.stringify(op.path)}`);
          break;
        default:
          throw new Error(`unknown op ${JSON.stringify((op as { op: unknown }).op)}`);
      }
    } catch (e) {
      throw new PatchError(i, e instanceof Error ? e.message : String(e));
    }
  });
  return doc.root;
}
