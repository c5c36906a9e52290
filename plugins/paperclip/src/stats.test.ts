import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LeaseStats, MAX_LEASES, MAX_SAMPLES, StatsBook, percentile } from "./stats.js";

describe("lease stats", () => {
  it("takes nearest-rank percentiles", () => {
    const v = Array.from({ length: 100 }, (_, i) => i + 1);
    assert.equal(percentile(v, 0.5), 50);
    assert.equal(percentile(v, 0.99), 99);
    assert.equal(percentile([7], 0.99), 7);
    assert.equal(percentile([], 0.5), 0);
    assert.equal(percentile([1, 2, 3], 0.5), 2);
  });

  it("counts hooks and summarises execute durations", () => {
    const s = new LeaseStats();
    s.hook("acquireLease");
    s.hook("realizeWorkspace");
    for (const ms of [30, 10, 20, 400]) s.execute(ms);
    s.hook("syncIn");
    s.sync(3, 1000);
    s.sync(1, 24);
    assert.deepEqual(s.summary(), {
      hooks: { acquireLease: 1, realizeWorkspace: 1, execute: 4, syncIn: 1 },
      executes: 4,
      execP50Ms: 20,
      execP99Ms: 400,
      execMaxMs: 400,
      syncExecs: 4,
      syncBytes: 1024,
    });
  });

  it("keeps a bounded sample beyond MAX_SAMPLES, with the exact count and maximum", () => {
    let x = 0;
    const s = new LeaseStats(() => (x = (x * 9301 + 49297) % 233280) / 233280);
    for (let i = 0; i < MAX_SAMPLES * 3; i++) s.execute(i % 100);
    s.execute(5_000);
    const sum = s.summary();
    assert.equal(sum.executes, MAX_SAMPLES * 3 + 1);
    assert.equal(sum.execMaxMs, 5_000);
    assert.ok(sum.execP50Ms >= 40 && sum.execP50Ms <= 60, `p50 ${sum.execP50Ms} of a uniform 0..99`);
  });

  it("tracks at most MAX_LEASES leases, dropping the oldest", () => {
    const book = new StatsBook();
    for (let i = 0; i <= MAX_LEASES; i++) book.of(`pc-${i}`).hook("acquireLease");
    assert.equal(book.size, MAX_LEASES);
    assert.equal(book.take("pc-0"), undefined);
    assert.deepEqual(book.take(`pc-${MAX_LEASES}`)?.hooks, { acquireLease: 1 });
    assert.equal(book.take(`pc-${MAX_LEASES}`), undefined, "take removes");
  });
});
