/**
 * The narad console: sign-in, then the sessions list and one session,
 * live. Routes live in the address's fragment (`#/sessions`,
 * `#/sessions/<id>`), so the server serves one page.
 */
import { render } from "preact";
import { useEffect, useMemo, useState } from "preact/hooks";

import { NaradClient } from "../../clients/typescript/src/index.js";
import { ApprovalsPage } from "./approvals.js";
import { current, type Identity, signIn, signOut, takeTokenFromAddress } from "./auth.js";
import { Reachability } from "./live.js";
import { SessionPage } from "./session.js";
import { SessionsPage } from "./sessions.js";
import { useObservable } from "./hooks.js";

/** The route the fragment names. */
type Route = { page: "sessions" } | { page: "approvals" } | { page: "session"; sessionId: string; focus: string | undefined };

function route(): Route {
  const m = /^#\/sessions\/([^/]+)(?:\/events\/([^/]+))?$/.exec(location.hash);
  if (m?.[1] !== undefined) {
    return { page: "session", sessionId: decodeURIComponent(m[1]), focus: m[2] === undefined ? undefined : decodeURIComponent(m[2]) };
  }
  if (location.hash === "#/approvals") return { page: "approvals" };
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

function SignIn({ onSignedIn }: { onSignedIn: (id: Identity) => void }) {
  const [token, setToken] = useState("");
  const [problem, setProblem] = useState<string>();
  return (
    <main class="sign-in">
      <h1>narad console</h1>
      <p>
        Open the address <code>narad serve</code> printed at start to sign in with the development token, or paste a
        bearer token (a JWT this server accepts, e.g. from <code>narad token</code>).
      </p>
      <form
        onSubmit={(e) => {
          e.preventDefault();
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

function App() {
  const [identity, setIdentity] = useState<Identity | undefined>(() => {
    const fromAddress = takeTokenFromAddress();
    return fromAddress !== undefined ? signIn(fromAddress) : current();
  });
  const r = useRoute();
  const reachability = useMemo(() => new Reachability(), []);
  useObservable(reachability);
  const client = useMemo(
    () =>
      identity &&
      new NaradClient({ servers: location.origin, token: identity.token, fetch: reachability.wrap(globalThis.fetch.bind(globalThis)) }),
    [identity, reachability],
  );
  if (identity === undefined || client === undefined) return <SignIn onSignedIn={setIdentity} />;
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
          </a>
        </nav>
        <span class="who" title={`roles: ${identity.roles.join(", ")}`}>
          {identity.sub} · {identity.org}
        </span>
        <button
          type="button"
          class="quiet"
          onClick={() => {
            signOut();
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
      {r.page === "approvals" && <ApprovalsPage client={client} identity={identity} />}
      {r.page === "sessions" && <SessionsPage client={client} identity={identity} />}
    </>
  );
}

const root = document.getElementById("app") as HTMLElement;
root.textContent = ""; // the "Loading" placeholder
render(<App />, root);
