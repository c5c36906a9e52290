import assert from "node:assert/strict";
import { chmod, lstat, mkdir, mkdtemp, readFile, readdir, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, beforeEach, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import type { PluginEnvironmentLease, PluginEnvironmentSyncResult, PluginSyncOperation } from "@paperclipai/plugin-sdk";
import { FakeExecReplica } from "../test/support/fake-exec.js";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";
import { readOperations } from "./sync.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
let n = 0;
const newRun = (): string => `2e8b6f4a-5a7c-4c1e-9f0b-${String(++n).padStart(12, "0")}`;

/**
 * The fake exec service runs commands on this machine, so "sandbox" paths here are local
 * directories, and /kubeclip/bin/sandboxd is KUBECLIP_SANDBOXD (the real binary) or a stand-in
 * built on the plugin's tar module (test/support/fake-sandboxd.ts).
 */
async function sandboxdPath(dir: string): Promise<string> {
  const real = process.env.KUBECLIP_SANDBOXD;
  if (real) return real;
  const script = fileURLToPath(new URL("../test/support/fake-sandboxd.js", import.meta.url));
  const p = path.join(dir, "sandboxd");
  await writeFile(p, `#!/bin/sh\nexec "${process.execPath}" "${script}" "$@"\n`);
  await chmod(p, 0o755);
  return p;
}

async function eventually(cond: () => boolean, what: string, ms = 5_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) assert.fail(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function listTree(dir: string, rel = ""): Promise<string[]> {
  const out: string[] = [];
  for (const name of (await readdir(path.join(dir, rel))).sort()) {
    const r = rel ? `${rel}/${name}` : name;
    const st = await lstat(path.join(dir, r));
    if (st.isDirectory()) out.push(`${r}/`, ...(await listTree(dir, r)));
    else out.push(st.isSymbolicLink() ? `${r}@` : r);
  }
  return out;
}

describe("native sync hooks", () => {
  let env: Env;
  let h: Harnessed;
  let tmp: string;
  const cfg = { backend: "pod", streamRunLogs: false };

  before(async () => {
    env = await startEnv();
    h = await harnessed(undefined, { natsUrl: env.server.url, maxSyncOutFiles: 50 });
    tmp = await mkdtemp(path.join(tmpdir(), "kubeclip-sync-"));
    env.sandbox.sandboxd = await sandboxdPath(tmp);
  });
  after(async () => {
    await h.shutdown();
    await env.close();
    await rm(tmp, { recursive: true, force: true });
  });
  beforeEach(() => {
    assert.deepEqual(env.sandbox.invalid.splice(0), []);
  });

  async function acquire(): Promise<PluginEnvironmentLease> {
    const runId = newRun();
    env.sandbox.addLease(C, runId, `pc-${runId.slice(0, 8)}`);
    return h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, runId, agentId: "agent-1", adapterType: "claude_local" });
  }

  const hooks = () => {
    const d = h.plugin.definition;
    const syncIn = d.onEnvironmentSyncIn?.bind(d);
    const syncOut = d.onEnvironmentSyncOut?.bind(d);
    assert.ok(syncIn && syncOut);
    return { syncIn, syncOut };
  };

  async function syncIn(lease: PluginEnvironmentLease, operations: PluginSyncOperation[]): Promise<PluginEnvironmentSyncResult> {
    return hooks().syncIn({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, operations });
  }
  async function syncOut(lease: PluginEnvironmentLease, operations: PluginSyncOperation[]): Promise<PluginEnvironmentSyncResult> {
    return hooks().syncOut({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, operations });
  }

  it("sync in: a directory replaced, a file with its mode, then the commands in order, exactly as given; one exec each", async () => {
    const lease = await acquire();
    const host = path.join(tmp, "in-host");
    const pod = path.join(tmp, "in-pod");
    await mkdir(path.join(host, "proj/src"), { recursive: true });
    await mkdir(path.join(host, "proj/node_modules/x"), { recursive: true });
    await writeFile(path.join(host, "proj/src/a.ts"), "export {};\n");
    await writeFile(path.join(host, "proj/node_modules/x/i.js"), "heavy");
    await writeFile(path.join(host, "creds.json"), "{\"k\":1}", { mode: 0o644 });
    await mkdir(path.join(pod, "rt/project-1"), { recursive: true });
    await writeFile(path.join(pod, "rt/project-1/stale"), "from an earlier run");
    const starts = env.sandbox.startRequests.length;
    const r = await syncIn(lease, [
      {
        operationId: "sync-op-1",
        files: [
          { sourcePath: path.join(host, "proj"), targetPath: path.join(pod, "rt/project-1"), kind: "directory", exclude: ["node_modules"] },
          { sourcePath: path.join(host, "creds.json"), targetPath: path.join(pod, "rt/creds.json"), kind: "file", mode: 0o600 },
        ],
        postUploadCommands: [
          { command: `pwd > order.txt && echo 'one "quoted" $HOME-less' >> order.txt` },
          { command: "echo two >> ../order.txt; pwd >> ../order.txt", cwd: path.join(pod, "rt/project-1"), timeoutMs: 5_000 },
        ],
      },
    ]);
    assert.deepEqual(r, { operations: [{ operationId: "sync-op-1", filesTransferred: 2, bytesTransferred: 11 + 7 }] });
    assert.deepEqual(await listTree(path.join(pod, "rt")), ["creds.json", "order.txt", "project-1/", "project-1/src/", "project-1/src/a.ts"]);
    assert.equal((await stat(path.join(pod, "rt/creds.json"))).mode & 0o777, 0o600);
    // The first ran in the operation's root (the common directory of its targets), the second where it said.
    assert.equal(await readFile(path.join(pod, "rt/order.txt"), "utf8"), `${path.join(pod, "rt")}\none "quoted" $HOME-less\ntwo\n${path.join(pod, "rt/project-1")}\n`);
    const sent = env.sandbox.startRequests.slice(starts);
    assert.equal(sent.length, 4, "one exec per mapping and per command");
    assert.deepEqual(sent[2]?.args, ["-c", `pwd > order.txt && echo 'one "quoted" $HOME-less' >> order.txt`]);
    assert.deepEqual(
      sent.map((s) => s.stdinBytes ?? 0),
      [-1, -1, 0, 0],
    );
    assert.deepEqual(sent[1]?.args, ["untar", "--root", path.join(pod, "rt")]);
    assert.deepEqual(sent.map((s) => s.env), [{}, {}, {}, {}], "no host env reaches a sync exec");
  });

  it("a tree round-trips in and out: long and non-ASCII names, links, empty directories, modes", async () => {
    const lease = await acquire();
    const host = path.join(tmp, "rt-host");
    const long = `${"d".repeat(120)}/${"n".repeat(180)}.txt`;
    await mkdir(path.join(host, "d".repeat(120)), { recursive: true });
    await mkdir(path.join(host, "empty"));
    await writeFile(path.join(host, long), "long");
    await writeFile(path.join(host, "ünïcødé ☃.txt"), "snow");
    await writeFile(path.join(host, "run.sh"), "#!/bin/sh\n", { mode: 0o755 });
    await writeFile(path.join(host, "big"), Buffer.alloc(3 << 20, 9));
    await symlink("run.sh", path.join(host, "link"));
    const pod = path.join(tmp, "rt-pod/tree");
    const back = path.join(tmp, "rt-back");
    await syncIn(lease, [{ operationId: "in", files: [{ sourcePath: host, targetPath: pod, kind: "directory" }] }]);
    const out = await syncOut(lease, [{ operationId: "out", files: [{ sourcePath: pod, targetPath: back, kind: "directory" }] }]);
    assert.deepEqual(out.operations, [{ operationId: "out", filesTransferred: 4, bytesTransferred: 4 + 4 + 10 + (3 << 20) }]);
    assert.deepEqual(await listTree(back), await listTree(host));
    assert.equal((await stat(path.join(back, "run.sh"))).mode & 0o777, 0o755);
    assert.equal(await readFile(path.join(back, long), "utf8"), "long");
  });

  it("sync in: the first failing command stops the rest and names itself", async () => {
    const lease = await acquire();
    const pod = path.join(tmp, "fail-pod");
    await mkdir(path.join(tmp, "fail-host"), { recursive: true });
    await writeFile(path.join(tmp, "fail-host/f"), "x");
    await assert.rejects(
      syncIn(lease, [
        {
          operationId: "sync-op-9",
          files: [{ sourcePath: path.join(tmp, "fail-host/f"), targetPath: path.join(pod, "f"), kind: "file" }],
          postUploadCommands: [{ command: "echo nope >&2; exit 3" }, { command: "touch ran-second" }],
        },
      ]),
      /^SyncError: operations\[0\]\.postUploadCommands\[0\] \(sync-op-9\) failed with exit code 3:\nstderr: nope$/,
    );
    assert.deepEqual(await readdir(pod), ["f"]);
  });

  it("a release with cancelActiveWork cancels a sync's command, and the sync says so", async () => {
    const lease = await acquire();
    await writeFile(path.join(tmp, "c"), "x");
    const t0 = Date.now();
    const sync = syncIn(lease, [
      { operationId: "op", files: [{ sourcePath: path.join(tmp, "c"), targetPath: path.join(tmp, "cancel-pod/c"), kind: "file" }], postUploadCommands: [{ command: "sleep 30" }] },
    ]);
    const refused = assert.rejects(sync, /postUploadCommands\[0\] \(op\) failed with exit code null \(cancelled: the lease is being released\)/);
    await eventually(() => env.sandbox.startRequests.some((q) => Array.isArray(q.args) && q.args.includes("sleep 30")), "the command started");
    const runtime = { ...cfg, ...lease.metadata };
    await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: runtime, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata, cancelActiveWork: true });
    await refused;
    assert.ok(Date.now() - t0 < 10_000);
  });

  it("sync in: a command cwd outside the operation's targets is refused before anything runs", async () => {
    const lease = await acquire();
    const starts = env.sandbox.startRequests.length;
    await writeFile(path.join(tmp, "g"), "x");
    await assert.rejects(
      syncIn(lease, [
        {
          operationId: "op",
          files: [{ sourcePath: path.join(tmp, "g"), targetPath: path.join(tmp, "cwd-pod/rt/g"), kind: "file" }],
          postUploadCommands: [{ command: "true", cwd: path.join(tmp, "elsewhere") }],
        },
      ]),
      /postUploadCommands\[0\]\.cwd: .* is outside the operation's target roots/,
    );
    assert.equal(env.sandbox.startRequests.length, starts + 1, "only the upload ran");
  });

  it("sync out: a directory with exclude and a file with its mode exactly, onto the host", async () => {
    const lease = await acquire();
    const pod = path.join(tmp, "out-pod");
    const host = path.join(tmp, "out-host");
    await mkdir(path.join(pod, "ws/src"), { recursive: true });
    await mkdir(path.join(pod, "ws/.git"), { recursive: true });
    await writeFile(path.join(pod, "ws/src/main.go"), "package main\n");
    await writeFile(path.join(pod, "ws/.git/HEAD"), "ref");
    await symlink("src/main.go", path.join(pod, "ws/alias"));
    await writeFile(path.join(pod, "bundle"), Buffer.alloc(100_000, 1));
    const r = await syncOut(lease, [
      { operationId: "sync-op-2", files: [{ sourcePath: path.join(pod, "ws"), targetPath: path.join(host, "workspace"), kind: "directory", exclude: [".git", ".git/*"] }] },
      { operationId: "sync-op-3", files: [{ sourcePath: path.join(pod, "bundle"), targetPath: path.join(host, "git-delta.bundle"), kind: "file", mode: 0o600 }] },
    ]);
    assert.deepEqual(r.operations, [
      { operationId: "sync-op-2", filesTransferred: 1, bytesTransferred: 13 },
      { operationId: "sync-op-3", filesTransferred: 1, bytesTransferred: 100_000 },
    ]);
    assert.deepEqual(await listTree(host), ["git-delta.bundle", "workspace/", "workspace/alias@", "workspace/src/", "workspace/src/main.go"]);
    assert.equal((await stat(path.join(host, "git-delta.bundle"))).mode & 0o777, 0o600);
  });

  it("sync out survives its exec-worker dying mid-archive: the tree lands whole", async () => {
    const lease = await acquire();
    const pod = path.join(tmp, "die-pod");
    await mkdir(path.join(pod, "d"), { recursive: true });
    const data = Buffer.alloc(3 << 20);
    for (let i = 0; i < data.byteLength; i++) data[i] = (i * 7) % 251;
    await writeFile(path.join(pod, "d/data.bin"), data);
    for (const r of env.replicas.splice(0)) r.die();
    const dying = new FakeExecReplica(env.nc, env.sandbox, "ew-dying", { dieAfterChunks: 5 });
    env.replicas.push(dying);
    await env.nc.flush();
    const host = path.join(tmp, "die-host");
    const attaches = env.sandbox.attachRequests.length;
    const out = syncOut(lease, [{ operationId: "op", files: [{ sourcePath: pod, targetPath: host, kind: "directory" }] }]);
    // The survivor joins once the dying one serves the archive (so the start is the dying one's).
    await eventually(() => dying.sentChunks > 0, "the dying replica streams");
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-survivor"));
    await env.nc.flush();
    const r = await out;
    assert.deepEqual(r.operations, [{ operationId: "op", filesTransferred: 1, bytesTransferred: 3 << 20 }]);
    assert.ok((await readFile(path.join(host, "d/data.bin"))).equals(data));
    assert.ok(env.sandbox.attachRequests.length > attaches, "it attached through the survivor");
  });

  it("sync out: a pod's symlink out of the target is refused, naming it, and nothing is left on the host", async () => {
    const lease = await acquire();
    const pod = path.join(tmp, "evil-pod");
    const host = path.join(tmp, "evil-host");
    await mkdir(path.join(pod, "ws"), { recursive: true });
    await writeFile(path.join(pod, "ws/a"), "a");
    await symlink("/etc/passwd", path.join(pod, "ws/steal"));
    await mkdir(host);
    await assert.rejects(
      syncOut(lease, [{ operationId: "op", files: [{ sourcePath: path.join(pod, "ws"), targetPath: host, kind: "directory" }] }]),
      /^SyncError: sync out operations\[0\]\.files\[0\] \(op\) .*: steal: a symlink to an absolute path: refused/,
    );
    assert.deepEqual(await readdir(host), []);
  });

  it("sync out: more entries than settings.maxSyncOutFiles are refused", async () => {
    const lease = await acquire();
    const pod = path.join(tmp, "many-pod");
    await mkdir(pod, { recursive: true });
    for (let i = 0; i < 60; i++) await writeFile(path.join(pod, `f${String(i).padStart(2, "0")}`), "x");
    await assert.rejects(
      syncOut(lease, [{ operationId: "op", files: [{ sourcePath: pod, targetPath: path.join(tmp, "many-host"), kind: "directory" }] }]),
      /f50: more than 50 entries \(settings\.maxSyncOutFiles\)/,
    );
    assert.deepEqual(await readdir(path.join(tmp, "many-host")), []);
  });

  it("a lease on a backend without exec says nativeFileSyncUnsupported, and its sync is refused", async () => {
    const runId = newRun();
    const previous = env.kubeclip.onAcquire;
    env.kubeclip.onAcquire = () => ({ kind: "created", extra: { backend: "job" } });
    try {
      const lease = await h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, runId, agentId: "agent-1" });
      assert.equal(lease.metadata?.nativeFileSyncUnsupported, true);
      await assert.rejects(syncIn(lease, []), /backend: job runs no commands/);
    } finally {
      env.kubeclip.onAcquire = previous;
    }
    const pod = await acquire();
    assert.equal(pod.metadata?.nativeFileSyncUnsupported, undefined);
  });

  it("settings.nativeSync: false keeps the host's base64 route for every lease", async () => {
    const off = await harnessed(undefined, { natsUrl: env.server.url, nativeSync: false });
    try {
      const runId = newRun();
      const lease = await off.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, runId, agentId: "agent-1" });
      assert.equal(lease.metadata?.nativeFileSyncUnsupported, true);
    } finally {
      await off.shutdown();
    }
  });
});

describe("readOperations", () => {
  it("names the field the host got wrong", () => {
    const bad: [unknown, RegExp][] = [
      [{}, /: operations: must be an array/],
      [[{ operationId: "o", files: [{ sourcePath: "/h", targetPath: "rel", kind: "file" }] }], /operations\[0\]\.files\[0\]\.targetPath: must be an absolute POSIX path/],
      [[{ operationId: "o", files: [{ sourcePath: "/h", targetPath: "/a/../etc", kind: "file" }] }], /targetPath: must be an absolute POSIX path without '\.\.'/],
      [[{ operationId: "o", files: [{ sourcePath: "/h", targetPath: "/t", kind: "socket" }] }], /files\[0\]\.kind/],
      [[{ operationId: "o", files: [{ sourcePath: "/h", targetPath: "/t", kind: "file", mode: 0o10000 }] }], /files\[0\]\.mode/],
      [[{ operationId: "o", files: [{ sourcePath: "/h", targetPath: "/", kind: "directory" }] }], /targetPath: the sandbox's \/ is not a sync target/],
      [[{ operationId: "o", files: [], postUploadCommands: [{ command: "" }] }], /postUploadCommands\[0\]\.command/],
      [[{ operationId: "o", files: [], postUploadCommands: [{ command: "x", cwd: "/a/../b" }] }], /postUploadCommands\[0\]\.cwd/],
    ];
    for (const [ops, re] of bad) assert.throws(() => readOperations(ops, "in"), re);
    assert.throws(() => readOperations([{ operationId: "o", files: [], postUploadCommands: [{ command: "x" }] }], "out"), /only sync in runs commands/);
  });
});
