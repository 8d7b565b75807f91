// The console signs a person in through a real OpenID Connect provider
// (the oidc-provider package, run here with its development login and
// consent pages): authorization code with PKCE from the page, an access
// token (a JWT for narad's audience, with the tenant and roles) that narad
// verifies against the provider's key set, and a console that works with it.
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { test } from "node:test";

import Provider, { errors } from "oidc-provider";

import { freePort, kill, launch, picture, startNarad } from "./harness.mjs";

const AUDIENCE = "https://narad.test/api";

async function startProvider(port, redirect) {
  const issuer = `http://127.0.0.1:${port}`;
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: "narad-console",
        redirect_uris: [redirect],
        token_endpoint_auth_method: "none",
        grant_types: ["authorization_code"],
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
          return { scope: "narad", audience: AUDIENCE, accessTokenFormat: "jwt", accessTokenTTL: 600, jwt: { sign: { alg: "RS256" } } };
        },
      },
    },
    extraTokenClaims: (ctx, token) =>
      token.kind === "AccessToken" ? { org: "browser", roles: ["reader", "writer", "approver"] } : undefined,
    clientBasedCORS: () => true,
    findAccount: (ctx, id) => ({ accountId: id, claims: () => ({ sub: id }) }),
    cookies: { keys: ["a-cookie-key-for-the-test-provider"] },
  });
  const server = provider.listen(port);
  await new Promise((resolve) => server.once("listening", resolve));
  return { issuer, server };
}

test("the console signs in with OpenID Connect (code + PKCE) against a real provider", { timeout: 120_000 }, async () => {
  const apiPort = await freePort();
  const api = `http://127.0.0.1:${apiPort}`;
  const { issuer, server } = await startProvider(await freePort(), `${api}/console/`);
  const narad = await startNarad(apiPort, "http://127.0.0.1:1", {
    NARAD_JWKS: `${issuer}/jwks`,
    NARAD_JWT_ISSUER: issuer,
    NARAD_JWT_AUDIENCE: AUDIENCE,
    NARAD_CONSOLE_ISSUER: issuer,
    NARAD_CONSOLE_CLIENT_ID: "narad-console",
    NARAD_CONSOLE_SCOPES: "openid narad",
  });
  const browser = await launch();
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(`${api}/console/`);
    await page.getByRole("button", { name: `Sign in with 127.0.0.1:${new URL(issuer).port}` }).click();

    // The provider's own pages: any login, then consent.
    await page.locator('input[name="login"]').fill("ada");
    await page.locator('input[name="password"]').fill("anything");
    await page.getByRole("button", { name: "Sign-in" }).click();
    await page.getByRole("button", { name: "Continue" }).click();

    // Back in the console, signed in as the provider's subject, with the
    // tenant and roles of its token; the code is gone from the address.
    await page.getByRole("heading", { name: "Sessions" }).waitFor({ timeout: 20_000 });
    assert.match(await page.locator(".top .who").textContent(), /ada · browser/);
    assert.ok(!page.url().includes("code="), `the address keeps no code: ${page.url()}`);
    await page.getByRole("button", { name: "New session" }).click();
    await page.getByRole("tab", { name: "Conversation" }).waitFor({ timeout: 20_000 });
    await page.locator('.toolbar .dot.live').waitFor({ timeout: 20_000 });
    await picture(page, "console-oidc");
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
    await kill(narad);
    server.close();
  }
});
