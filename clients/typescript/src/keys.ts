/** Idempotency keys. */

/** A new idempotency key (or client-chosen id): a random UUID. */
export function newKey(): string {
  return globalThis.crypto.randomUUID();
}
