import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LiveLog, type Stream } from "./livelog.js";

const gap = (n: number): string =>
  `\n[kubeclip: ${n} characters of output left out of the live log here: Paperclip's host was not reading it as fast as the command printed; the command's result holds its head and tail]\n`;

describe("live log backpressure", () => {
  it("leaves chunks out while the host's backlog is over the bound, then says how much", () => {
    const sent: [Stream, string][] = [];
    let backlog = 0;
    const live = new LiveLog((s, c) => sent.push([s, c]), () => backlog, 100);
    live.write("stdout", "one\n");
    backlog = 101;
    live.write("stdout", "two\n");
    live.write("stdout", "three\n");
    live.write("stderr", "err\n");
    assert.deepEqual(live.pending, { stdout: 10, stderr: 4 });
    backlog = 100;
    live.write("stdout", "four\n");
    // stderr's gap is reported when the command ends.
    live.finish();
    assert.deepEqual(sent, [
      ["stdout", "one\n"],
      ["stdout", gap(10)],
      ["stdout", "four\n"],
      ["stderr", gap(4)],
    ]);
    assert.deepEqual(live.pending, { stdout: 0, stderr: 0 });
  });

  it("sends everything while the host keeps up", () => {
    const sent: string[] = [];
    const live = new LiveLog((_, c) => sent.push(c), () => 0, 100);
    for (let i = 0; i < 1000; i++) live.write("stdout", "x".repeat(1000));
    live.finish();
    assert.equal(sent.length, 1000);
  });
});
