import assert from "node:assert/strict";
import { appendFile, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { FileTokenStore } from "../src/node.js";

test("the file token store keeps tokens across instances, the last line winning", async () => {
  const dir = await mkdtemp(join(tmpdir(), "narad-tokens-"));
  try {
    const path = join(dir, "tokens.jsonl");
    const first = new FileTokenStore(path);
    assert.deepEqual(await first.all(), []);
    await first.put({ executionToken: "t1", leaseId: "L1", toolCallId: "c1" });
    await first.put({ executionToken: "t2", leaseId: "L1", toolCallId: "c2" });
    await first.put({
      executionToken: "t1",
      leaseId: "L1",
      toolCallId: "c1",
      result: { outcome: "success", response: { ok: true } },
    });
    // A crash mid-write leaves a torn line: skipped, the rest kept.
    await appendFile(path, '{"executionToken":"t3","lea');
    await new FileTokenStore(path).put({ executionToken: "t4", leaseId: "L2", toolCallId: "c4" });

    const again = new FileTokenStore(path);
    const t1 = await again.get("t1");
    assert.deepEqual(t1?.result, { outcome: "success", response: { ok: true } });
    assert.equal((await again.get("t2"))?.result, undefined);
    assert.equal(await again.get("t3"), undefined);
    assert.equal((await again.get("t4"))?.leaseId, "L2", "a put after a torn line is whole");
    assert.deepEqual((await again.all()).map((e) => e.executionToken).sort(), ["t1", "t2", "t4"]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
