// What the browser tests share: narad started (and killed) as a process on
// a port of its own, a site of another origin serving the pages and the
// SDK, tokens, and Debian's chromium driven by playwright-core.
//
// Environment (.ci/browser sets it): NARAD_BIN, NARAD_DATABASE_URL (a fresh
// database), CHROMIUM (the browser binary; default /usr/bin/chromium),
// SCREENSHOTS (optional: a folder for pictures of the pages).
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

const here = fileURLToPath(new URL(".", import.meta.url));
const sdk = join(here, "../../clients/typescript/dist");
const secret = "browser-test-hs256-secret-of-32-bytes-or-more";

export function required(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`set ${name}`);
  }
  return value;
}

/** A port nothing listens on now. */
export async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Starts narad on `port` for pages of `origin` (and `env`); resolves once it serves. */
export async function startNarad(port, origin, env = {}) {
  const child = spawn(required("NARAD_BIN"), ["serve"], {
    env: {
      ...process.env,
      NARAD_LISTEN: `127.0.0.1:${port}`,
      NARAD_DATABASE_URL: required("NARAD_DATABASE_URL"),
      NARAD_JWT_HS256_SECRET: secret,
      NARAD_CORS_ORIGINS: origin,
      RUST_LOG: "warn",
      ...env,
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (chunk) => {
      out += chunk;
      if (out.includes("narad is serving on")) {
        resolve();
      }
    });
    child.on("exit", (code) => reject(new Error(`narad exited (${code}) before serving`)));
  });
  return child;
}

/** Kills narad with SIGKILL and waits until it is gone. */
export async function kill(child) {
  if (child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  const gone = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGKILL");
  await gone;
}

/** A token with `roles` (comma-separated), for `sub` of `org` (the test tenant by default). */
export function token(roles, sub = "tester", org = "browser") {
  return execFileSync(required("NARAD_BIN"), ["token", "--org", org, "--sub", sub, "--roles", roles], {
    env: { ...process.env, NARAD_JWT_HS256_SECRET: secret },
  })
    .toString()
    .trim();
}

/** A call to the API from Node; it must succeed. */
export async function call(api, jwt, method, path, body) {
  const res = await fetch(api + path, {
    method,
    headers: { Authorization: `Bearer ${jwt}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  assert.ok(res.ok, `${method} ${path}: ${res.status} ${text}`);
  return JSON.parse(text);
}

const types = { ".html": "text/html; charset=utf-8", ".js": "text/javascript", ".map": "application/json" };

/** The site of another origin: `/<page>.html` from here, `/sdk/…` the built SDK. */
export async function startSite() {
  const site = createServer((req, res) => {
    const path = normalize(new URL(req.url, "http://x").pathname);
    const file = path.startsWith("/sdk/") ? join(sdk, path.slice(5)) : join(here, path);
    if (!file.startsWith(here) && !file.startsWith(sdk)) {
      res.writeHead(403).end();
      return;
    }
    if (!existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "Content-Type": types[extname(file)] ?? "application/octet-stream" });
    res.end(readFileSync(file));
  });
  await new Promise((resolve) => site.listen(0, "127.0.0.1", resolve));
  return { site, origin: `http://127.0.0.1:${site.address().port}` };
}

/** Debian's chromium, headless. */
export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
}

/** Appends one `session.custom` note `i` (role backend). */
export function note(api, jwt, sessionId, i) {
  return call(api, jwt, "POST", `/v1/sessions/${sessionId}/events`, {
    events: [{ protocolVersion: "narad/v1", type: "session.custom", eventId: `${sessionId}-${i}`, name: "browser.note", value: { i } }],
  });
}

/** Saves a picture of the page when SCREENSHOTS names a folder. */
export async function picture(tab, name) {
  if (process.env.SCREENSHOTS) {
    await tab.screenshot({ path: join(process.env.SCREENSHOTS, `${name}.png`), fullPage: true });
  }
}
