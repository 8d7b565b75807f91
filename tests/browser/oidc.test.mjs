// The console signs a person in through a real OpenID Connect provider
// (the oidc-provider package, run here with its development login and
// consent pages): authorization code with PKCE from the page, an access
// token (a JWT for narad's audience, with the tenant and roles) that narad
// verifies against the provider's key set, and a console that works with it;
// and, when the provider issues refresh tokens, access tokens renewed
// before they expire (rotated refresh tokens kept), by the same client.
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { test } from "node:test";

import Provider, { errors } from "oidc-provider";

import { freePort, kill, launch, picture, startNarad } from "./harness.mjs";

const AUDIENCE = "https://narad.test/api";

/** A provider on `port` for a console at `redirect`; `refresh`: it issues refresh tokens; `ttl`: access tokens' lifetime (s). */
async function startProvider(port, redirect, { refresh = false, ttl = 600 } = {}) {
  const issuer = `http://127.0.0.1:${port}`;
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: "narad-console",
        redirect_uris: [redirect],
        token_endpoint_auth_method: "none",
        grant_types: refresh ? ["authorization_code", "refresh_token"] : ["authorization_code"],
        response_types: ["code"],
      },
    ],
    jwks: { keys: [{ ...privateKey.export({ format: "jwk" }), kid: "test-key", use: "sig", alg: "RS256" }] },
    scopes: ["openid", "narad"],
    features: {
      devInteractions: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => AUDIENCE,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, indicator) => {
          if (indicator !== AUDIENCE) throw new errors.InvalidTarget();
          return { scope: "narad", audience: AUDIENCE, accessTokenFormat: "jwt", accessTokenTTL: ttl, jwt: { sign: { alg: "RS256" } } };
        },
      },
    },
    extraTokenClaims: (ctx, token) =>
      token.kind === "AccessToken" ? { org: "browser", roles: ["reader", "writer", "approver"] } : undefined,
    // As providers that issue refresh tokens without offline_access (Keycloak) do.
    ...(refresh ? { issueRefreshToken: (ctx, client) => client.grantTypeAllowed("refresh_token") } : {}),
    clientBasedCORS: () => true,
    findAccount: (ctx, id) => ({ accountId: id, claims: () => ({ sub: id }) }),
    cookies: { keys: ["a-cookie-key-for-the-test-provider"] },
  });
  const server = provider.listen(port);
  await new Promise((resolve) => server.once("listening", resolve));
  return { issuer, server };
}

/** narad on `apiPort` trusting the provider at `issuer`, its console signing in there. */
function naradFor(apiPort, issuer) {
  return startNarad(apiPort, "http://127.0.0.1:1", {
    NARAD_JWKS: `${issuer}/jwks`,
    NARAD_JWT_ISSUER: issuer,
    NARAD_JWT_AUDIENCE: AUDIENCE,
    NARAD_CONSOLE_ISSUER: issuer,
    NARAD_CONSOLE_CLIENT_ID: "narad-console",
    NARAD_CONSOLE_SCOPES: "openid narad",
  });
}

/** Signs in as `login` through the provider's own pages (any password, then consent). */
async function signInAt(page, api, issuer, login) {
  await page.goto(`${api}/console/`);
  await page.getByRole("button", { name: `Sign in with 127.0.0.1:${new URL(issuer).port}` }).click();
  await page.locator('input[name="login"]').fill(login);
  await page.locator('input[name="password"]').fill("anything");
  await page.getByRole("button", { name: "Sign-in" }).click();
  await page.getByRole("button", { name: "Continue" }).click();
  await page.getByRole("heading", { name: "Sessions" }).waitFor({ timeout: 20_000 });
}

const tokenOf = (page) => page.evaluate(() => sessionStorage.getItem("narad.console.token"));
const expiryOf = (jwt) => JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString()).exp;

/**
 * A test of signing in: a provider (with `provider` options), narad trusting
 * it, and a Chromium page signed in as `login`; `body` gets the page. Any
 * error the page throws fails the test; everything is closed after.
 */
function signInTest(name, { login, provider = {} }, body) {
  test(name, { timeout: 120_000 }, async () => {
    const apiPort = await freePort();
    const api = `http://127.0.0.1:${apiPort}`;
    const { issuer, server } = await startProvider(await freePort(), `${api}/console/`, provider);
    const narad = await naradFor(apiPort, issuer);
    const browser = await launch();
    try {
      const page = await browser.newPage();
      const errors = [];
      page.on("pageerror", (e) => errors.push(String(e)));
      await signInAt(page, api, issuer, login);
      await body(page);
      assert.deepEqual(errors, []);
    } finally {
      await browser.close();
      await kill(narad);
      server.close();
    }
  });
}

signInTest("the console signs in with OpenID Connect (code + PKCE) against a real provider", { login: "ada" }, async (page) => {
  // Back in the console, signed in as the provider's subject, with the
  // tenant and roles of its token; the code is gone from the address.
  assert.match(await page.locator(".top .who").textContent(), /ada · browser/);
  assert.ok(!page.url().includes("code="), `the address keeps no code: ${page.url()}`);
  await page.getByRole("button", { name: "New session" }).click();
  await page.getByRole("tab", { name: "Conversation" }).waitFor({ timeout: 20_000 });
  await page.locator(".toolbar .dot.live").waitFor({ timeout: 20_000 });
  await picture(page, "console-oidc");
});

// Ten-second access tokens: the console renews each halfway.
signInTest(
  "an OpenID Connect sign-in renews its access token before it expires, by the same client",
  { login: "grace", provider: { refresh: true, ttl: 10 } },
  async (page) => {
    const first = await tokenOf(page);
    await page.waitForFunction((t) => sessionStorage.getItem("narad.console.token") !== t, first, { timeout: 20_000 });
    const second = await tokenOf(page);
    assert.ok(expiryOf(second) > expiryOf(first), "the renewed token lives longer");
    // The provider rotates refresh tokens: a second renewal works only if
    // the console kept the new one.
    await page.waitForFunction((t) => sessionStorage.getItem("narad.console.token") !== t, second, { timeout: 20_000 });
    const third = await tokenOf(page);
    // Requests carry the token of the moment, through the same client.
    const sent = page.waitForRequest((r) => r.url().endsWith("/v1/sessions") && r.method() === "POST");
    await page.getByRole("button", { name: "New session" }).click();
    const used = (await sent).headers()["authorization"];
    assert.ok([`Bearer ${third}`, `Bearer ${await tokenOf(page)}`].includes(used), "a request sent with the current token");
    await page.getByRole("tab", { name: "Conversation" }).waitFor({ timeout: 20_000 });
    assert.match(await page.locator(".top .who").textContent(), /grace · browser/);
    // Signing out forgets the refresh token too.
    await page.getByRole("button", { name: "Sign out" }).click();
    assert.deepEqual(
      await page.evaluate(() => [sessionStorage.getItem("narad.console.token"), sessionStorage.getItem("narad.console.refresh")]),
      [null, null],
    );
  },
);
