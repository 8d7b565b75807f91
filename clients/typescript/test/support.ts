// What the tests against a server share.
import assert from "node:assert/strict";

/** Polls `check` every 100 ms until it gives a value; fails after `seconds`. */
export async function until<T>(what: string, check: () => Promise<T | undefined>, seconds = 20): Promise<T> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const got = await check();
    if (got !== undefined) {
      return got;
    }
    assert.ok(Date.now() < deadline, `no ${what} within ${seconds} s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
