// The TypeScript SDK under `narad conformance client`: for every trace the
// kit serves, read its stream with the SDK's SSE parser (resuming with
// Last-Event-ID when a connection breaks), deliver each object to the
// SDK's SessionReducer negotiated for the trace's profiles, and report the
// reduced state, or the object refused and why (conformance/README.md).
//
//   narad conformance client -- node clients/typescript/conformance/client.mjs
//
// Runs the built SDK (npm run build first).
import { SessionReducer, Violation, parseSse } from "../dist/index.js";

const base = process.env.NARAD_CONFORMANCE_URL;
if (!base) {
  console.error("run me under narad conformance client (NARAD_CONFORMANCE_URL)");
  process.exit(2);
}

/** Reads a trace's stream into `reducer`: the refusal, if one. */
async function follow(url, reducer) {
  let lastId = "";
  for (let attempt = 0; attempt < 50; attempt++) {
    let response;
    try {
      response = await fetch(url, { headers: lastId ? { "Last-Event-ID": lastId } : {} });
    } catch {
      continue;
    }
    try {
      for await (const frame of parseSse(response.body, lastId)) {
        let object;
        try {
          object = JSON.parse(frame.data);
        } catch {
          object = frame.data;
        }
        try {
          reducer.deliver(object);
        } catch (e) {
          if (!(e instanceof Violation)) throw e;
          return { object, rule: e.rule, message: e.message };
        }
        if (frame.ownId) lastId = frame.id;
      }
      return undefined;
    } catch (e) {
      if (e instanceof TypeError) continue; // the connection broke: resume
      throw e;
    }
  }
  throw new Error(`${url}: the stream broke 50 times`);
}

const { traces } = await (await fetch(`${base}/traces`)).json();
for (const trace of traces) {
  const reducer = new SessionReducer({ profiles: trace.profiles });
  const rejected = await follow(trace.stream, reducer);
  const report = rejected ? { rejected, state: reducer.state() } : { state: reducer.state() };
  const answer = await fetch(base + trace.report, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(report),
  });
  if (!answer.ok) throw new Error(`reporting ${trace.name}: ${answer.status}`);
}
