/**
 * Signing in with an OpenID Connect provider: authorization code with PKCE
 * from the page itself (a public client), by `oauth4webapi`. The access
 * token the provider issues for narad's audience is the bearer token the
 * console uses: a JWT narad verifies like any other. When the provider
 * also issues a refresh token, it is kept beside the access token (this
 * tab's `sessionStorage`) and renews it before it expires ([`renew`]), so
 * that a person is not sent back to sign in every token lifetime.
 */
import * as oauth from "oauth4webapi";

/** What `/console/config.json` says of the provider. */
export interface OidcConfig {
  issuer: string;
  clientId: string;
  scopes: string;
  audience: string;
}

const PENDING = "narad.console.oidc";
const REFRESH = "narad.console.refresh";

/** Where the provider sends people back: the console itself. */
function redirectUri(): string {
  return `${location.origin}/console/`;
}

/** http is allowed for a provider on this machine's loopback only (development). */
function options(issuer: URL): { [oauth.allowInsecureRequests]?: boolean } {
  const loopback = ["127.0.0.1", "localhost", "[::1]"].includes(issuer.hostname);
  return issuer.protocol === "http:" && loopback ? { [oauth.allowInsecureRequests]: true } : {};
}

async function discover(config: OidcConfig): Promise<oauth.AuthorizationServer> {
  const issuer = new URL(config.issuer);
  return oauth.processDiscoveryResponse(issuer, await oauth.discoveryRequest(issuer, { algorithm: "oidc", ...options(issuer) }));
}

/** The audience as an RFC 8707 resource, when it is a URL. */
function resource(config: OidcConfig): string | undefined {
  try {
    return new URL(config.audience).href === config.audience ? config.audience : undefined;
  } catch {
    return undefined;
  }
}

/** What every token request sends besides its grant: narad's audience as the resource, when it is a URL. */
function tokenRequest(config: OidcConfig): oauth.TokenEndpointRequestOptions {
  const r = resource(config);
  return { ...options(new URL(config.issuer)), ...(r === undefined ? {} : { additionalParameters: { resource: r } }) };
}

/** Sends the browser to the provider's sign-in page. */
export async function startSignIn(config: OidcConfig): Promise<void> {
  const as = await discover(config);
  if (as.authorization_endpoint === undefined) throw new Error(`${config.issuer} names no authorization endpoint`);
  const verifier = oauth.generateRandomCodeVerifier();
  const state = oauth.generateRandomState();
  sessionStorage.setItem(PENDING, JSON.stringify({ verifier, state }));
  const url = new URL(as.authorization_endpoint);
  url.searchParams.set("client_id", config.clientId);
  url.searchParams.set("redirect_uri", redirectUri());
  url.searchParams.set("response_type", "code");
  url.searchParams.set("scope", config.scopes);
  url.searchParams.set("code_challenge", await oauth.calculatePKCECodeChallenge(verifier));
  url.searchParams.set("code_challenge_method", "S256");
  url.searchParams.set("state", state);
  const r = resource(config);
  if (r !== undefined) url.searchParams.set("resource", r);
  location.assign(url.href);
}

/**
 * Finishes a sign-in the provider sent the browser back from (`?code=…` or
 * `?error=…` on the console's address): the access token, or undefined when
 * the address is no such return. Clears the address either way.
 */
export async function finishSignIn(config: OidcConfig | null): Promise<string | undefined> {
  const here = new URL(location.href);
  if (!here.searchParams.has("code") && !here.searchParams.has("error")) return undefined;
  const pending = sessionStorage.getItem(PENDING);
  sessionStorage.removeItem(PENDING);
  history.replaceState(null, "", `${location.pathname}#/sessions`);
  if (config === null) throw new Error("this server has no identity provider configured (NARAD_CONSOLE_ISSUER)");
  if (pending === null) throw new Error("this sign-in was not started from this tab: sign in again");
  const { verifier, state } = JSON.parse(pending) as { verifier: string; state: string };
  const as = await discover(config);
  const client: oauth.Client = { client_id: config.clientId };
  const params = oauth.validateAuthResponse(as, client, here, state);
  const response = await oauth.authorizationCodeGrantRequest(as, client, oauth.None(), params, redirectUri(), verifier, tokenRequest(config));
  const result = await oauth.processAuthorizationCodeResponse(as, client, response);
  keepRefreshToken(result.refresh_token);
  return result.access_token;
}

function keepRefreshToken(token: string | undefined): void {
  if (token === undefined) sessionStorage.removeItem(REFRESH);
  else sessionStorage.setItem(REFRESH, token);
}

/** Whether this tab holds a refresh token from the provider. */
export function canRenew(): boolean {
  return sessionStorage.getItem(REFRESH) !== null;
}

/** Forgets the refresh token (signing out). */
export function forgetRenewal(): void {
  sessionStorage.removeItem(REFRESH);
}

/**
 * A new access token from the provider, by the refresh token this tab
 * holds (kept again when the provider rotates it). Throws when there is
 * none or the provider refuses it (expired, revoked): the person signs in
 * again when the current token runs out.
 */
export async function renew(config: OidcConfig): Promise<string> {
  const refresh = sessionStorage.getItem(REFRESH);
  if (refresh === null) throw new Error("no refresh token in this tab");
  const as = await discover(config);
  const client: oauth.Client = { client_id: config.clientId };
  const response = await oauth.refreshTokenGrantRequest(as, client, oauth.None(), refresh, tokenRequest(config));
  const result = await oauth.processRefreshTokenResponse(as, client, response);
  if (result.refresh_token !== undefined) keepRefreshToken(result.refresh_token);
  return result.access_token;
}

/**
 * When to renew a token that expires at `expiresAt` (ms): a minute before,
 * or halfway through what is left when that is less than two minutes.
 */
export function renewalDelay(expiresAt: number, now: number): number {
  const left = expiresAt - now;
  return Math.max(1000, left > 120_000 ? left - 60_000 : left / 2);
}
