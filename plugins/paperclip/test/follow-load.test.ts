// 1,500 acquires waiting at once through the plugin's acquire hook, against a nats-server at its
// default limits, which refuses a stream's 1,001st consumer: every one is answered, and the run
// stream holds one consumer while they wait (the plugin's, shared: answers.ts). With a consumer
// per waiting lease, 501 of them failed (maximum consumers limit reached). The 5,000 figure and
// the memory are the driver's (test/load/follow-load.ts, docs/architecture.md, Following thousands of leases).
//
// A file of its own: node --test runs each file in its own process.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { followLoad, formatLoad } from "./support/follow-load.js";

describe("followed leases past a stream's consumer limit", () => {
  it("answers 1,500 acquires waiting at once on one consumer", async (t) => {
    const r = await followLoad(1_500);
    t.diagnostic(formatLoad(r));
    assert.equal(r.failed, 0, r.firstError);
    assert.equal(r.acquired, 1_500);
    assert.equal(r.consumersWaiting, 1);
  });
});
