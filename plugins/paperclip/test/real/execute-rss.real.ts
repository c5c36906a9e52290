// One 64 MiB execute through the plugin's execute hook (the code Paperclip's host calls, with the
// result serialised as the SDK does) against kubeclip's REAL exec-workers and a real pod: the
// run's result lines survive, what the plugin holds stays within settings.maxExecuteOutputBytes,
// and the process's peak RSS stays bounded (issue 15 item 5: it was 455 MiB for 64 MiB of `A`
// per stream, and 1.1 GB with a RangeError for control bytes). Run by tests/paperclip
// (TestExecClientAgainstExecWorkers), which reads the figures from the line this prints:
//
//   KUBECLIP_BIG_EXEC outputBytes=… held=… peakRSS=… baselineRSS=…
//
// A file of its own: node --test runs each file in its own process, so VmHWM is this one's.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, it } from "node:test";
import { DEFAULT_EXECUTE_OUTPUT_BYTES } from "../../src/config.js";
import { harnessed, type Harnessed } from "../support/harness.js";

function need(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: this test runs from tests/paperclip (go test ./tests/paperclip), against a real lease`);
  return v;
}

const url = need("KUBECLIP_REAL_NATS_URL");
const C = need("KUBECLIP_REAL_COMPANY_ID");
const R = need("KUBECLIP_REAL_RUN_ID");
const LEASE = need("KUBECLIP_REAL_LEASE_ID");

/** VmHWM of this process, bytes. */
function peakRSS(): number {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync("/proc/self/status", "utf8"));
  if (!m?.[1]) throw new Error("no VmHWM in /proc/self/status");
  return Number(m[1]) * 1024;
}

describe("one 64 MiB execute through the plugin's hook", () => {
  let h: Harnessed;
  const lease = { providerLeaseId: LEASE, metadata: { remoteCwd: "/workspace", kubeclip: { runId: R, companyId: C, namespace: "", workloadName: "", backend: "pod" } } };
  const config = { backend: "pod", streamRunLogs: false, ...lease.metadata };
  before(async () => {
    h = await harnessed({}, { natsUrl: url }, false);
  });
  after(async () => {
    await h.shutdown();
  });

  it("returns the head and tail of each stream, its result line whole, within a bounded RSS", async () => {
    const baseline = peakRSS();
    // 63 MiB of output (sandboxd's cap is 64 MiB for both streams): a session line, lines of
    // `A`, control bytes, the result line.
    const size = 63 << 20;
    const script = `echo '{"type":"system","subtype":"init","session_id":"s1"}'; head -c ${size / 2} /dev/zero | tr '\\000' 'A' | fold -w 1000; head -c ${size / 2 - 4096} /dev/zero | tr '\\000' '\\001' | fold -w 1000; echo; echo '{"type":"result","subtype":"success","session_id":"s1"}'`;
    const t0 = Date.now();
    const r = await h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "e", config, lease, command: "sh", args: ["-c", script], timeoutMs: 240_000 });
    // What the SDK does with the result: one JSON-RPC message.
    const wire = JSON.stringify({ jsonrpc: "2.0", id: 1, result: r });
    const peak = peakRSS();
    assert.equal(r.exitCode, 0, r.stderr.slice(0, 500));
    const lines = r.stdout.split("\n");
    assert.equal(lines[0], '{"type":"system","subtype":"init","session_id":"s1"}');
    assert.equal(lines.at(-2), '{"type":"result","subtype":"success","session_id":"s1"}');
    assert.match(r.stdout, /\n\[kubeclip: \d+ bytes of output truncated here/);
    assert.equal(r.metadata?.truncated, true);
    const held = Buffer.byteLength(r.stdout);
    assert.ok(held <= DEFAULT_EXECUTE_OUTPUT_BYTES + 200, `held ${held} bytes`);
    console.log(`KUBECLIP_BIG_EXEC outputBytes=${size} held=${held} peakRSS=${peak} baselineRSS=${baseline} wireBytes=${wire.length} ms=${Date.now() - t0}`);
    // Bounded: the held output and its JSON (control bytes escape to 6 characters) over the
    // process's baseline, far below the 455 MiB to 1.1 GB of holding it whole.
    assert.ok(peak - baseline < 256 << 20, `peak RSS grew by ${(peak - baseline) >> 20} MiB`);
  });
});
