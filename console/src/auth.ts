/**
 * Signing in: the console holds one bearer token (a JWT narad verifies) in
 * sessionStorage, for this tab only. `narad serve` on its embedded default
 * prints an address whose fragment carries the development token
 * (`/console/#token=…`): the fragment never reaches a server or a log, and
 * is removed from the address bar as soon as it is read.
 */

const KEY = "narad.console.token";

/** What the console shows of the signed-in caller (read from the token; the server verifies it). */
export interface Identity {
  token: string;
  sub: string;
  org: string;
  roles: string[];
  /** Expiry, ms since the epoch. */
  expiresAt: number;
}

/** The claims of a JWT, unverified (the server verifies every request). */
export function claimsOf(token: string): Record<string, unknown> | undefined {
  const payload = token.split(".")[1];
  if (payload === undefined) return undefined;
  try {
    const json = atob(payload.replace(/-/g, "+").replace(/_/g, "/"));
    const bytes = Uint8Array.from(json, (c) => c.charCodeAt(0));
    return JSON.parse(new TextDecoder().decode(bytes)) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

/** The identity a token names, or undefined for something that is no JWT. */
export function identityOf(token: string): Identity | undefined {
  const c = claimsOf(token);
  if (c === undefined || typeof c.sub !== "string" || typeof c.org !== "string") return undefined;
  const roles = Array.isArray(c.roles) ? c.roles.filter((r): r is string => typeof r === "string") : [];
  const exp = typeof c.exp === "number" ? c.exp * 1000 : Number.POSITIVE_INFINITY;
  return { token, sub: c.sub, org: c.org, roles, expiresAt: exp };
}

/** Takes a token from the address's fragment (`#token=…`), if there is one, and clears it from the address bar. */
export function takeTokenFromAddress(): string | undefined {
  const hash = new URLSearchParams(location.hash.replace(/^#/, ""));
  const token = hash.get("token");
  if (token === null) return undefined;
  history.replaceState(null, "", `${location.pathname}${location.search}#/sessions`);
  return token;
}

/** The signed-in identity of this tab, if any and not expired. */
export function current(): Identity | undefined {
  const token = sessionStorage.getItem(KEY);
  const id = token === null ? undefined : identityOf(token);
  return id !== undefined && id.expiresAt > Date.now() ? id : undefined;
}

/** Signs in with `token`; its identity, or undefined when it is no JWT. */
export function signIn(token: string): Identity | undefined {
  const id = identityOf(token.trim());
  if (id !== undefined) sessionStorage.setItem(KEY, id.token);
  return id;
}

/** Forgets the token. */
export function signOut(): void {
  sessionStorage.removeItem(KEY);
}

/** Whether the identity holds a role that grants `what` (as narad's permission table does). */
export function may(id: Identity, what: "read" | "command" | "approve"): boolean {
  const granted = { read: ["reader", "backend"], command: ["writer"], approve: ["approver"] }[what];
  return id.roles.some((r) => granted.includes(r));
}
