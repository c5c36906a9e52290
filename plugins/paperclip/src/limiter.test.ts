import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Output } from "./exec.js";
import { ByteBudget } from "./limiter.js";

describe("ByteBudget", () => {
  it("bounds the total and each key's share, and takes nothing past either", () => {
    const b = new ByteBudget(100, 60);
    assert.ok(b.take("a", 60));
    assert.equal(b.take("a", 1), false, "a's share is full");
    assert.ok(b.take("b", 40));
    assert.equal(b.take("c", 1), false, "the total is full");
    assert.deepEqual([b.held(), b.held("a"), b.held("b"), b.held("c")], [100, 60, 40, 0]);
    b.give("a", 60);
    assert.ok(b.take("c", 60));
    b.give("b", 40);
    b.give("c", 60);
    assert.equal(b.held(), 0);
  });
});

describe("execute output within the plugin's process-wide budget (issue 26 item 9)", () => {
  const lines = (o: Output, n: number): void => {
    for (let i = 0; i < n; i++) o.add(new TextEncoder().encode(`line ${String(i).padStart(5, "0")}\n`));
  };

  it("holds no more than the budget across companies, a company no more than its share, and keeps each stream's last line", () => {
    // Each stream would hold 1,000 bytes; the process 3,000, a company 1,500, and a stream's
    // tail 100 past its company's share.
    const budget = new ByteBudget(3_000, 1_500, 100);
    const a = [0, 1, 2, 3].map(() => new Output(1_000, { bytes: budget, company: "A" }));
    for (const o of a) {
      lines(o, 1_000);
      assert.ok(budget.held("A") <= 1_500 + 4 * 100, `company A holds ${budget.held("A")}`);
    }
    const b = new Output(1_000, { bytes: budget, company: "B" });
    lines(b, 1_000);
    assert.ok(budget.held() <= 3_000, `the plugin holds ${budget.held()}`);
    assert.equal(budget.held("B"), 1_000, "company A's executes left company B its whole hold");
    assert.doesNotMatch(b.text(), /output budget/);
    const starved = a.at(-1)?.text() ?? "";
    assert.match(starved, /the plugin's output budget for all executes .* was full/);
    for (const o of [...a, b]) assert.ok(o.text().endsWith("line 00999\n"), "the tail (an agent's result line) is kept");
    // A starved stream handed its output in one chunk still keeps the floor's worth of tail.
    const big = new Output(1_000, { bytes: budget, company: "A" });
    big.add(new TextEncoder().encode(Array.from({ length: 90 }, (_, i) => `line ${String(i).padStart(5, "0")}\n`).join("")));
    assert.ok(big.text().endsWith("line 00089\n"), big.text());
    big.release();
    for (const o of [...a, b]) o.release();
    assert.equal(budget.held(), 0, "an ended execute gives back all it held");
  });
});
