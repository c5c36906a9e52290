// Native sync through the plugin's hooks (the code Paperclip's host calls) against kubeclip's
// REAL exec-workers and a real pod's sandboxd: 200 MiB and a small tree in and back out
// byte-exact, a post-upload command run as given, and a symlink planted in the pod refused on
// the way out with nothing left on this host. Run by tests/paperclip
// (TestExecClientAgainstExecWorkers), which reads the figures from the line this prints:
//
//   KUBECLIP_SYNC bytes=… inMs=… outMs=… peakRSS=… baselineRSS=…
//
// A file of its own: node --test runs each file in its own process, so VmHWM is this one's.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import type { PluginEnvironmentSyncResult, PluginSyncOperation } from "@paperclipai/plugin-sdk";
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

function peakRSS(): number {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync("/proc/self/status", "utf8"));
  if (!m?.[1]) throw new Error("no VmHWM in /proc/self/status");
  return Number(m[1]) * 1024;
}

const sha = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

describe("native sync through the plugin's hooks against a real pod", () => {
  let h: Harnessed;
  let tmp: string;
  const lease = { providerLeaseId: LEASE, metadata: { remoteCwd: "/workspace", kubeclip: { runId: R, companyId: C, namespace: "", workloadName: "", backend: "pod" } } };
  const config = { backend: "pod", streamRunLogs: false, timeoutMs: 240_000, ...lease.metadata };
  const base = { driverKey: "kubernetes", companyId: C, environmentId: "e", config, lease };
  before(async () => {
    h = await harnessed({}, { natsUrl: url }, false);
    tmp = await mkdtemp(path.join(tmpdir(), "kubeclip-sync-real-"));
  });
  after(async () => {
    await h.shutdown();
    await rm(tmp, { recursive: true, force: true });
  });

  const syncIn = (operations: PluginSyncOperation[]): Promise<PluginEnvironmentSyncResult> => {
    const hook = h.plugin.definition.onEnvironmentSyncIn?.bind(h.plugin.definition);
    assert.ok(hook);
    return hook({ ...base, operations });
  };
  const syncOut = (operations: PluginSyncOperation[]): Promise<PluginEnvironmentSyncResult> => {
    const hook = h.plugin.definition.onEnvironmentSyncOut?.bind(h.plugin.definition);
    assert.ok(hook);
    return hook({ ...base, operations });
  };

  it("moves 200 MiB and a tree in and back out byte-exact, running the post-upload command as given, within a bounded RSS", async () => {
    const size = 200 << 20;
    const src = path.join(tmp, "src");
    await mkdir(path.join(src, "sub"), { recursive: true });
    const big = randomBytes(size);
    await writeFile(path.join(src, "big.bin"), big);
    await writeFile(path.join(src, "sub/a.txt"), "a\n");
    await symlink("sub/a.txt", path.join(src, "link"));
    const baseline = peakRSS();
    let t0 = Date.now();
    const into = await syncIn([
      {
        operationId: "in",
        files: [{ sourcePath: src, targetPath: "/workspace/sync-real/tree", kind: "directory" }],
        postUploadCommands: [{ command: "sha256sum big.bin > ../sum.txt && ls > ../names.txt" }],
      },
    ]);
    const inMs = Date.now() - t0;
    assert.deepEqual(into.operations, [{ operationId: "in", filesTransferred: 3, bytesTransferred: size + 2 }]);
    const back = path.join(tmp, "back");
    t0 = Date.now();
    const out = await syncOut([{ operationId: "out", files: [{ sourcePath: "/workspace/sync-real", targetPath: back, kind: "directory" }] }]);
    const outMs = Date.now() - t0;
    const peak = peakRSS(); // before this test reads the files back
    assert.equal(out.operations[0]?.bytesTransferred, size + 2 + (await readFile(path.join(back, "sum.txt"))).byteLength + (await readFile(path.join(back, "names.txt"))).byteLength);
    assert.equal(sha(await readFile(path.join(back, "tree/big.bin"))), sha(big));
    // The post-upload command ran in the operation's root (the mapping's target) on what landed.
    assert.equal((await readFile(path.join(back, "sum.txt"), "utf8")).split(" ")[0], sha(big));
    assert.equal(await readFile(path.join(back, "names.txt"), "utf8"), "big.bin\nlink\nsub\n");
    assert.deepEqual((await readdir(path.join(back, "tree"))).sort(), ["big.bin", "link", "sub"]);
    console.log(`KUBECLIP_SYNC bytes=${size} inMs=${inMs} outMs=${outMs} peakRSS=${peak} baselineRSS=${baseline}`);
    // Streams, not buffers: below the 200 MiB either way would take held once (what it grows by
    // is garbage the collector takes back in its own time: measured 89 MiB for 50 MiB, 100 for 200).
    assert.ok(peak - baseline < 150 << 20, `peak RSS grew by ${(peak - baseline) >> 20} MiB`);
  });

  it("refuses a symlink the pod planted to lead out, leaving nothing on the host", async () => {
    const hook = h.plugin.definition.onEnvironmentExecute?.bind(h.plugin.definition);
    assert.ok(hook);
    const r = await hook({ ...base, command: "sh", args: ["-c", "mkdir -p /workspace/evil && echo x > /workspace/evil/a && ln -sf /etc/passwd /workspace/evil/steal"], timeoutMs: 30_000 });
    assert.equal(r.exitCode, 0, r.stderr);
    const host = path.join(tmp, "evil");
    await mkdir(host);
    await assert.rejects(
      syncOut([{ operationId: "evil", files: [{ sourcePath: "/workspace/evil", targetPath: host, kind: "directory" }] }]),
      /steal: a symlink to an absolute path: refused/,
    );
    assert.deepEqual(await readdir(host), []);
  });
});
