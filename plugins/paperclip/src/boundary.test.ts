// The tenant boundary of issue 15, through the plugin's hooks: what a company's environment
// config may not choose (the connection), what of Paperclip's execute env never leaves, what
// one execute may cost the plugin process, whose company a lease hook acts for, and where
// kubeclip's answers come to.

import assert from "node:assert/strict";
import { createServer, type Server, type Socket } from "node:net";
import { after, before, describe, it } from "node:test";
import type { PluginEnvironmentLease } from "@paperclipai/plugin-sdk";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";
import { shippedConf } from "../test/support/shipped-conf.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
const OTHER = "0b7c4d1e-9a2f-4c3b-8e5d-6f1a2b3c4d5e";
let n = 0;
const newRun = (): string => `2e8b6f4a-5a7c-4c1e-9f0b-${String(++n).padStart(12, "0")}`;

/**
 * A TCP listener that plays a NATS server's first line (INFO), so that a client would send its
 * CONNECT with credentials; it records every connection and byte it receives.
 */
async function fakeNatsListener(): Promise<{ url: string; connections: number; received: () => string; close: () => Promise<void> }> {
  let received = "";
  const sockets = new Set<Socket>();
  const state = { connections: 0 };
  const server: Server = createServer((sock) => {
    state.connections++;
    sockets.add(sock);
    sock.on("data", (b: Buffer) => {
      received += b.toString("latin1");
    });
    sock.on("error", () => undefined);
    sock.write('INFO {"server_id":"FAKE","version":"2.10.0","proto":1,"max_payload":1048576,"auth_required":true}\r\n');
  });
  await new Promise<void>((resolve) => {
    server.listen(0, "127.0.0.1", resolve);
  });
  const addr = server.address();
  if (addr === null || typeof addr === "string") throw new Error("no port");
  return {
    url: `nats://127.0.0.1:${addr.port}`,
    get connections() {
      return state.connections;
    },
    received: () => received,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => {
        server.close(() => {
          resolve();
        });
      });
    },
  };
}

describe("the tenant boundary", () => {
  let env: Env;
  let h: Harnessed;
  const cfg = { backend: "pod", streamRunLogs: false };
  before(async () => {
    env = await startEnv();
    h = await harnessed(undefined, { natsUrl: env.server.url, natsUser: "paperclip", natsPassword: "operator-secret-pw" });
  });
  after(async () => {
    await h.shutdown();
    await env.close();
  });

  async function acquire(runId: string, hh = h, companyId = C): Promise<PluginEnvironmentLease> {
    env.sandbox.addLease(companyId, runId, `pc-${runId.slice(0, 8)}`);
    return hh.harness.acquireLease({ driverKey: "kubernetes", companyId, environmentId: "env-1", config: cfg, runId, agentId: "agent-1", adapterType: "claude_local" });
  }

  describe("item 1: the connection is the operator's", () => {
    it("refuses an environment natsUrl in validateConfig and acquireLease, and never connects there", async () => {
      const l = await fakeNatsListener();
      try {
        const r = await h.harness.validateConfig({ driverKey: "kubernetes", config: { ...cfg, natsUrl: l.url } });
        assert.equal(r.ok, false);
        assert.match(r.errors?.[0] ?? "", /^config\.natsUrl: connection settings are the operator's/);
        await assert.rejects(
          h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, natsUrl: l.url }, runId: newRun(), agentId: "a" }),
          /config\.natsUrl: connection settings are the operator's/,
        );
        await new Promise((r) => setTimeout(r, 300));
        assert.equal(l.connections, 0, `the company's listener got ${l.connections} connections: ${l.received().slice(0, 200)}`);
        assert.ok(!l.received().includes("operator-secret-pw"));
      } finally {
        await l.close();
      }
    });

    it("refuses every connection key, naming it", async () => {
      for (const [key, value] of [
        ["natsCredentials", "creds"],
        ["natsToken", "t0k3n"],
        ["natsUser", "paperclip"],
        ["natsPassword", "pw"],
        ["subjectPrefix", "other"],
        ["inboxPrefix", "_INBOX"],
      ] as const) {
        const r = await h.harness.validateConfig({ driverKey: "kubernetes", config: { ...cfg, [key]: value } });
        assert.equal(r.ok, false, key);
        assert.match(r.errors?.[0] ?? "", new RegExp(`^config\\.${key}: connection settings are the operator's`), key);
      }
    });
  });

  describe("item 2: Paperclip's server secrets never reach a pod", () => {
    const hostEnv = {
      PAPERCLIP_AGENT_JWT_SECRET: "jwt-secret-value-0001",
      PAPERCLIP_TOOL_ACTION_SIGNING_SECRET: "signing-secret-value-0002",
      BETTER_AUTH_SECRET: "better-auth-value-0003",
      DATABASE_URL: "postgres://u:db-password-0004@h/db",
      PAPERCLIP_SECRETS_MASTER_KEY: "master-key-value-0005",
      npm_config__authToken: "npm-token-value-0006",
      PAPERCLIP_API_URL: "http://127.0.0.1:4444",
      PAPERCLIP_API_KEY: "run-bridge-token",
      PAPERCLIP_RUN_ID: "run-1",
      PAPERCLIP_WAKE_REASON: "manual",
      PAPERCLIP_BRIDGE_TOKEN: "bridge",
      ANTHROPIC_API_KEY: "sk-ant-run",
      GH_TOKEN: "gh",
      CLAUDE_CONFIG_DIR: "/workspace/.claude",
    };

    it("drops the server's keys, keeps the agent's, logs only names", async () => {
      const lease = await acquire(newRun());
      const r = await h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, command: "env", env: hostEnv, timeoutMs: 10_000 });
      assert.equal(r.exitCode, 0);
      const agentNeeds = ["ANTHROPIC_API_KEY", "CLAUDE_CONFIG_DIR", "PAPERCLIP_API_KEY", "PAPERCLIP_API_URL", "PAPERCLIP_BRIDGE_TOKEN", "PAPERCLIP_RUN_ID", "PAPERCLIP_WAKE_REASON"];
      for (const [k, v] of Object.entries(hostEnv)) {
        const kept = agentNeeds.includes(k);
        assert.equal(r.stdout.includes(`${k}=${v}\n`), kept, `${k} ${kept ? "kept" : "dropped"}`);
      }
      const sent = env.sandbox.startRequests.at(-1)?.env as Record<string, string>;
      assert.deepEqual(Object.keys(sent).sort(), agentNeeds);
      const line = h.harness.logs.find((l) => l.message === "execute env keys dropped");
      assert.equal(line?.meta?.count, Object.keys(hostEnv).length - agentNeeds.length);
      assert.ok(!JSON.stringify(h.harness.logs).includes("value-000"), "no value is logged");
    });

    // Issue 26 item 8: a key the operator gives Paperclip's server reaches no pod by default.
    it("keeps the operator's server keys back by default; deny mode passes them", async () => {
      const operatorEnv = { DO_NOT_TRACK: "1", GITHUB_TOKEN: "ghp-operator-0007", SLACK_BOT_TOKEN: "xoxb-operator-0008", HF_TOKEN: "hf-operator-0009", PAPERCLIP_RUN_ID: "run-1", LANG: "C.UTF-8" };
      const lease = await acquire(newRun());
      await h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, command: "true", env: operatorEnv, timeoutMs: 10_000 });
      assert.deepEqual(Object.keys(env.sandbox.startRequests.at(-1)?.env as Record<string, string>).sort(), ["LANG", "PAPERCLIP_RUN_ID"]);
      const s = await harnessed(undefined, { natsUrl: env.server.url, executeEnv: { mode: "deny" } });
      try {
        const l = await acquire(newRun(), s);
        await s.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...l.metadata }, lease: l, command: "true", env: operatorEnv, timeoutMs: 10_000 });
        assert.deepEqual(Object.keys(env.sandbox.startRequests.at(-1)?.env as Record<string, string>).sort(), Object.keys(operatorEnv).sort());
      } finally {
        await s.shutdown();
      }
    });

    it("adds the operator's allow globs to what an agent needs, the deny lists still applying", async () => {
      const s = await harnessed(undefined, { natsUrl: env.server.url, executeEnv: { allow: ["PAPERCLIP_API_*", "PAPERCLIP_AGENT_JWT_SECRET", "GH_*"], deny: ["GH_TOKEN", "ANTHROPIC_API_KEY"] } });
      try {
        const lease = await acquire(newRun(), s);
        await s.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, command: "true", env: { ...hostEnv, GH_HOST: "github.com" }, timeoutMs: 10_000 });
        const sent = env.sandbox.startRequests.at(-1)?.env as Record<string, string>;
        assert.deepEqual(Object.keys(sent).sort(), ["CLAUDE_CONFIG_DIR", "GH_HOST", "PAPERCLIP_API_KEY", "PAPERCLIP_API_URL", "PAPERCLIP_BRIDGE_TOKEN", "PAPERCLIP_RUN_ID", "PAPERCLIP_WAKE_REASON"]);
      } finally {
        await s.shutdown();
      }
    });
  });

  describe("item 5: one execute holds a bounded amount", () => {
    it("keeps the head and the tail of a large output, whole lines, with a marker", async () => {
      const s = await harnessed(undefined, { natsUrl: env.server.url, maxExecuteOutputBytes: 1 << 20 });
      try {
        const lease = await acquire(newRun(), s);
        const script = 'echo \'{"type":"system","subtype":"init"}\'; yes 0123456789abcdef0123456789abcdef | head -c 19999980; echo \'{"type":"result","subtype":"success"}\'';
        const r = await s.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, command: "sh", args: ["-c", script], timeoutMs: 60_000 });
        assert.equal(r.exitCode, 0);
        assert.ok(r.stdout.length <= (1 << 20) + 200, `stdout holds ${r.stdout.length} characters`);
        const lines = r.stdout.split("\n");
        assert.equal(lines[0], '{"type":"system","subtype":"init"}');
        assert.equal(lines.at(-2), '{"type":"result","subtype":"success"}');
        assert.match(r.stdout, /\n\[kubeclip: \d+ bytes of output truncated here: the plugin holds at most 1048576 bytes per stream \(settings\.maxExecuteOutputBytes\)\]\n/);
        for (const l of lines) assert.ok(l === "" || l.startsWith("{") || l.startsWith("[kubeclip") || l === "0123456789abcdef0123456789abcdef", `a cut line: ${l.slice(0, 60)}`);
        assert.equal(r.metadata?.truncated, true);
      } finally {
        await s.shutdown();
      }
    });

    it("never crashes on control bytes", async () => {
      const s = await harnessed(undefined, { natsUrl: env.server.url, maxExecuteOutputBytes: 1 << 20 });
      try {
        const lease = await acquire(newRun(), s);
        const r = await s.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, command: "sh", args: ["-c", "head -c 16000000 /dev/zero | tr '\\000' '\\001'; echo; echo done"], timeoutMs: 60_000 });
        assert.equal(r.exitCode, 0);
        assert.ok(r.stdout.length <= (1 << 20) + 200, `stdout holds ${r.stdout.length} characters`);
        assert.ok(r.stdout.endsWith("\ndone\n"));
        assert.ok(JSON.stringify(r).length < 8 << 20, "the serialised result stays small");
      } finally {
        await s.shutdown();
      }
    });

    it("bounds one company's concurrent executes and refuses clearly after the wait", async () => {
      const s = await harnessed({ exec: { silenceMs: 500, graceMs: 2_000 }, executeSlotWaitMs: 500 }, { natsUrl: env.server.url, maxConcurrentExecutesPerCompany: 1 });
      try {
        const lease = await acquire(newRun(), s);
        const other = await acquire(newRun(), s, OTHER);
        const run = (l: PluginEnvironmentLease, companyId: string) =>
          s.harness.execute({ driverKey: "kubernetes", companyId, environmentId: "env-1", config: { ...cfg, ...l.metadata }, lease: l, command: "sleep", args: ["2"], timeoutMs: 10_000 });
        const first = run(lease, C);
        await new Promise((r) => setTimeout(r, 200));
        await assert.rejects(run(lease, C), /execute refused: company 7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13 already has 1 commands in flight \(settings\.maxConcurrentExecutesPerCompany = 1\)/);
        // Another company is not held up.
        assert.equal((await run(other, OTHER)).exitCode, 0);
        assert.equal((await first).exitCode, 0);
      } finally {
        await s.shutdown();
      }
    });
  });

  // Issue 26 item 12: every boundary test's run ids begin alike, so kubeclip's fake answers
  // every acquire with the same lease id, as a copied `created` would.
  describe("issue 26 item 12: a lease's state is its company's", () => {
    it("another company's release of the same lease id cancels none of this company's commands", async () => {
      const lease = await acquire(newRun());
      const exec = h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, command: "sh", args: ["-c", "sleep 1; echo finished"], timeoutMs: 10_000 });
      await new Promise((r) => setTimeout(r, 300));
      const foreign = await acquire(newRun(), h, OTHER);
      assert.equal(foreign.providerLeaseId, lease.providerLeaseId, "the other company holds the same lease id");
      const receipt = await h.harness.releaseLease({ driverKey: "kubernetes", companyId: OTHER, environmentId: "env-1", config: { ...cfg, ...foreign.metadata }, providerLeaseId: foreign.providerLeaseId, leaseMetadata: foreign.metadata, cancelActiveWork: true });
      assert.deepEqual(receipt, { providerLeaseId: foreign.providerLeaseId, state: "stopped" });
      const r = await exec;
      assert.equal(r.metadata?.cancelled, undefined);
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, "finished\n");
    });

    it("cancels a company's commands only after kubeclip answered its release", async () => {
      const lease = await acquire(newRun());
      const exec = h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, command: "sh", args: ["-c", "sleep 1; echo finished"], timeoutMs: 10_000 });
      await new Promise((r) => setTimeout(r, 300));
      const saved = env.kubeclip.onRelease;
      env.kubeclip.onRelease = () => ({ kind: "failed", code: "lease_not_found", message: "no such lease of this company" });
      try {
        await assert.rejects(
          h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata, cancelActiveWork: true }),
          /no such lease of this company/,
        );
      } finally {
        env.kubeclip.onRelease = saved;
      }
      const r = await exec;
      assert.equal(r.exitCode, 0, "a refused release cancels nothing");
      assert.equal(r.stdout, "finished\n");
    });
  });

  describe("item 13: the host's company wins", () => {
    it("refuses an execute whose lease metadata names another company, and answers its release with a receipt that ends nothing", async () => {
      const runId = newRun();
      const lease = await acquire(runId);
      // The same run id leased for another company: an exec there would run in its pod.
      env.sandbox.addLease(OTHER, runId, lease.providerLeaseId ?? "");
      const forged = { ...lease, metadata: { ...lease.metadata, kubeclip: { ...(lease.metadata?.kubeclip as object), companyId: OTHER } } };
      const starts = env.sandbox.startRequests.length;
      await assert.rejects(
        h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, lease: forged, command: "true", timeoutMs: 5_000 }),
        /lease\.metadata\.kubeclip\.companyId: the lease is company 0b7c4d1e-9a2f-4c3b-8e5d-6f1a2b3c4d5e's, not this call's company 7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13; refused/,
      );
      assert.equal(env.sandbox.startRequests.length, starts, "no exec request left");
      const releases = env.kubeclip.requests.length;
      // Issue 29: Paperclip's host keeps a lease it got no receipt for pending cleanup;
      // nothing of this company's runs under it, and nothing of the other company's is asked for.
      const receipt = await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId, leaseMetadata: forged.metadata });
      assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
      assert.equal(env.kubeclip.requests.length, releases, "no release request left");
    });
  });
});

describe("item 12: replies come to the paperclip user's own inbox", () => {
  // nats-auth.conf as shipped: the paperclip user subscribes only under _INBOX_paperclip, in the
  // CLIENTS account, which imports what it uses from KUBECLIP's (exec io comes back through the
  // exported inbox stream).
  const conf = shippedConf();
  let env: Env;
  let h: Harnessed;
  const cfg = { backend: "pod", streamRunLogs: false };
  before(async () => {
    env = await startEnv(conf);
    h = await harnessed(undefined, { natsUrl: env.server.url, natsUser: "paperclip", natsPassword: "pcpw" });
  });
  after(async () => {
    await h.shutdown();
    await env.close();
  });

  it("validates, acquires, executes and releases as a user that may subscribe only _INBOX_paperclip.>", async () => {
    const v = await h.harness.validateConfig({ driverKey: "kubernetes", config: cfg });
    assert.equal(v.ok, true, JSON.stringify(v));
    // JetStream's API (stream info) and the ping's replies come to the same inbox.
    const p = await h.harness.probe({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg });
    assert.ok(!JSON.stringify(p).includes("Permissions Violation"), JSON.stringify(p));
    assert.ok(Object.keys((p.metadata?.workers as object | undefined) ?? {}).length > 0, JSON.stringify(p));
    const runId = newRun();
    env.sandbox.addLease(C, runId, `pc-${runId.slice(0, 8)}`);
    const lease = await h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, runId, agentId: "a", adapterType: "claude_local" });
    const r = await h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, lease, command: "sh", args: ["-c", "cat"], stdin: "hello", timeoutMs: 10_000 });
    assert.equal(r.stdout, "hello");
    const start = env.sandbox.startRequests.at(-1);
    assert.ok(start, "a start request");
    const receipt = await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, ...lease.metadata }, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "stopped" });
  });
});
