/**
 * The narad console: sign-in, then the sessions list and one session,
 * live. Routes live in the address's fragment (`#/sessions`,
 * `#/sessions/<id>`), so the server serves one page.
 */
import { render } from "preact";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";

import { NaradClient } from "../../clients/typescript/src/index.js";
import { ApprovalsPage, useApprovalNotifications } from "./approvals.js";
import { current, type Identity, may, signIn, signOut, takeTokenFromAddress } from "./auth.js";
import { LiveInbox, Reachability } from "./live.js";
import { OperationsPage } from "./operations.js";
import { type Prices, setPrices } from "./cost.js";
import { canRenew, finishSignIn, forgetRenewal, type OidcConfig, renew, renewalDelay, startSignIn } from "./oidc.js";
import { SessionPage } from "./session.js";
import { SessionsPage } from "./sessions.js";
import { useObservable } from "./hooks.js";

/** The route the fragment names. */
type Route = { page: "sessions" } | { page: "approvals" } | { page: "operations" } | { page: "session"; sessionId: string; focus: string | undefined };

function route(): Route {
  const m = /^#\/sessions\/([^/]+)(?:\/events\/([^/]+))?$/.exec(location.hash);
  if (m?.[1] !== undefined) {
    return { page: "session", sessionId: decodeURIComponent(m[1]), focus: m[2] === undefined ? undefined : decodeURIComponent(m[2]) };
  }
  if (location.hash === "#/approvals") return { page: "approvals" };
  if (location.hash === "#/operations") return { page: "operations" };
  return { page: "sessions" };
}

function useRoute(): Route {
  const [r, set] = useState(route);
  useEffect(() => {
    const on = () => set(route());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return r;
}

function SignIn({ oidc, problem: given, onSignedIn }: { oidc: OidcConfig | null; problem: string | undefined; onSignedIn: (id: Identity) => void }) {
  const [token, setToken] = useState("");
  const [problem, setProblem] = useState<string | undefined>(given);
  const [busy, setBusy] = useState(false);
  return (
    <main class="sign-in">
      <h1>narad console</h1>
      {oidc !== null && (
        <p>
          <button
            type="button"
            class="primary"
            disabled={busy}
            onClick={async () => {
              setBusy(true);
              try {
                await startSignIn(oidc);
              } catch (e) {
                setProblem(`The identity provider did not answer: ${e instanceof Error ? e.message : String(e)}`);
                setBusy(false);
              }
            }}
          >
            Sign in with {new URL(oidc.issuer).host}
          </button>
        </p>
      )}
      <p>
        {oidc !== null ? "Or paste" : "Open the address narad serve printed at start to sign in with the development token, or paste"} a
        bearer token (a JWT this server accepts, e.g. from <code>narad token</code>).
      </p>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          forgetRenewal();
          const id = signIn(token);
          if (id === undefined) setProblem("That is not a JWT: a token has three dot-separated parts.");
          else onSignedIn(id);
        }}
      >
        <label for="token">Bearer token</label>
        <textarea id="token" rows={4} value={token} onInput={(e) => setToken(e.currentTarget.value)} />
        {problem && (
          <p role="alert" class="problem">
            {problem}
          </p>
        )}
        <button type="submit">Sign in</button>
      </form>
    </main>
  );
}

function App({ oidc, problem: given }: { oidc: OidcConfig | null; problem: string | undefined }) {
  const [identity, setIdentity] = useState<Identity | undefined>(current);
  const [problem, setProblem] = useState(given);
  const r = useRoute();
  // Who is signed in: a renewed token of the same person keeps the client
  // and its streams (the client asks for the token at each request).
  const who = identity && `${identity.org}\n${identity.sub}\n${identity.roles.join(",")}`;
  const latest = useRef(identity?.token);
  latest.current = identity?.token;
  // A new reachability per person: a refusal belongs to the token refused.
  const reachability = useMemo(() => new Reachability(), [who]);
  useObservable(reachability);
  // A sign-in link opened in a tab already on the console signs in with its
  // token, and takes it out of the address bar and the history at once.
  useEffect(() => {
    const on = () => {
      const token = takeTokenFromAddress();
      if (token === undefined) return;
      forgetRenewal();
      const id = signIn(token);
      if (id === undefined) setProblem("The sign-in link's token is not a JWT.");
      else setProblem(undefined);
      setIdentity(id);
    };
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  // A token the server refuses (expired, badly signed, revoked) ends the
  // sign-in: back to signing in, with the server's reason.
  useEffect(() => {
    if (reachability.refused === undefined || identity === undefined) return;
    signOut();
    forgetRenewal();
    setProblem(`Sign in again: ${reachability.refused}`);
    setIdentity(undefined);
  }, [reachability.refused, identity]);
  const client = useMemo(
    () =>
      who === undefined
        ? undefined
        : new NaradClient({ servers: location.origin, token: () => latest.current ?? "", fetch: reachability.wrap(globalThis.fetch.bind(globalThis)) }),
    [who, reachability],
  );
  // An OpenID Connect sign-in with a refresh token renews its access token
  // before it expires; when the provider refuses, the token runs out and
  // the server's refusal leads back to signing in.
  useEffect(() => {
    if (oidc === null || identity === undefined || !canRenew()) return;
    let stopped = false;
    const t = setTimeout(async () => {
      try {
        const id = signIn(await renew(oidc));
        if (!stopped && id !== undefined) setIdentity(id);
      } catch (e) {
        console.warn("the access token could not be renewed", e);
      }
    }, renewalDelay(identity.expiresAt, Date.now()));
    return () => {
      stopped = true;
      clearTimeout(t);
    };
  }, [oidc, identity]);
  // One inbox for the whole console: its count on the navigation, the
  // notifications, and the Approvals page.
  const inbox = useMemo(() => (client !== undefined && identity !== undefined && may(identity, "read") ? new LiveInbox(client) : undefined), [client, who]);
  useEffect(() => () => inbox?.close(), [inbox]);
  useObservable(inbox);
  useApprovalNotifications(inbox);
  if (identity === undefined || client === undefined)
    return (
      <SignIn
        key={problem}
        oidc={oidc}
        problem={problem}
        onSignedIn={(id) => {
          setProblem(undefined);
          setIdentity(id);
        }}
      />
    );
  return (
    <>
      <header class="top">
        <a class="brand" href="#/sessions">
          narad
        </a>
        <nav aria-label="Main">
          <a href="#/sessions" aria-current={r.page === "sessions" ? "page" : undefined}>
            Sessions
          </a>
          <a href="#/approvals" aria-current={r.page === "approvals" ? "page" : undefined}>
            Approvals
            {inbox !== undefined && inbox.waiting.length > 0 && (
              <span class="count" data-waiting={inbox.waiting.length} aria-label={`, ${inbox.waiting.length} waiting`}>
                {inbox.waiting.length}
              </span>
            )}
          </a>
          {identity.roles.includes("admin") && (
            <a href="#/operations" aria-current={r.page === "operations" ? "page" : undefined}>
              Operations
            </a>
          )}
        </nav>
        <span class="who" title={`roles: ${identity.roles.join(", ")}`}>
          {identity.sub} · {identity.org}
        </span>
        <button
          type="button"
          class="quiet"
          onClick={() => {
            signOut();
            forgetRenewal();
            setIdentity(undefined);
          }}
        >
          Sign out
        </button>
      </header>
      {!reachability.reachable && (
        <div class="banner" role="status">
          The server does not answer; reconnecting…
        </div>
      )}
      {r.page === "session" && <SessionPage key={r.sessionId} client={client} identity={identity} sessionId={r.sessionId} focus={r.focus} />}
      {r.page === "approvals" && inbox !== undefined && <ApprovalsPage client={client} identity={identity} inbox={inbox} />}
      {r.page === "sessions" && <SessionsPage client={client} identity={identity} />}
      {r.page === "operations" && <OperationsPage client={client} />}
    </>
  );
}

/** Reads how people sign in here, finishes a sign-in the provider sent back, and shows the console. */
async function start(): Promise<void> {
  // The sign-in link's token is taken at once, before anything is awaited:
  // the address may change (a click, a script) while the settings load.
  const fromAddress = takeTokenFromAddress();
  if (fromAddress !== undefined) {
    forgetRenewal();
    signIn(fromAddress);
  }
  let oidc: OidcConfig | null = null;
  let problem: string | undefined;
  try {
    const config = (await (await fetch("config.json")).json()) as { oidc: OidcConfig | null; prices?: Prices | null };
    oidc = config.oidc;
    setPrices(config.prices ?? null);
  } catch {
    problem = "The server's console settings could not be read.";
  }
  try {
    const token = await finishSignIn(oidc);
    if (token !== undefined && signIn(token) === undefined) problem = "The identity provider's access token is not a JWT narad can verify.";
  } catch (e) {
    problem = `Signing in did not finish: ${e instanceof Error ? e.message : String(e)}`;
  }
  const root = document.getElementById("app") as HTMLElement;
  root.textContent = ""; // the "Loading" placeholder
  render(<App oidc={oidc} problem={problem} />, root);
}

void start();
