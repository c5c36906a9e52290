import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { PluginEnvironmentLease } from "@paperclipai/plugin-sdk";
import { assertLeaseLifecycle } from "@paperclipai/plugin-sdk/testing";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
let n = 0;
const newRun = (): string => `1e8b6f4a-5a7c-4c1e-9f0b-${String(++n).padStart(12, "0")}`;

describe("plugin hooks", () => {
  let env: Env;
  let h: Harnessed;
  let cfg: Record<string, unknown>;
  before(async () => {
    env = await startEnv();
    h = await harnessed(undefined, { natsUrl: env.server.url });
    cfg = { backend: "pod", streamRunLogs: false };
  });
  after(async () => {
    await h.shutdown();
    await env.close();
  });

  async function acquire(runId: string, config = cfg): Promise<PluginEnvironmentLease> {
    env.sandbox.addLease(C, runId, `pc-${runId.slice(0, 8)}`);
    return h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config, runId, agentId: "agent-1", adapterType: "claude_local" });
  }

  describe("validateConfig", () => {
    it("asks kubeclip, strips the plugin's and Paperclip's keys, keeps them in normalizedConfig", async () => {
      const r = await h.harness.validateConfig({ driverKey: "kubernetes", config: { ...cfg, inCluster: true, kubeconfig: "apiVersion: v1\nsecret", egressAllowFqdns: ["github.com"] } });
      assert.equal(r.ok, true, JSON.stringify(r));
      assert.deepEqual(env.kubeclip.validateRequests.at(-1), { backend: "pod", egressAllowFqdns: ["github.com"] });
      assert.deepEqual(r.normalizedConfig, { backend: "pod", egressAllowFqdns: ["github.com"], streamRunLogs: false });
      assert.ok(r.warnings?.some((w) => w.startsWith("config.inCluster is ignored")));
      assert.ok(r.warnings?.some((w) => w.startsWith("config.kubeconfig is ignored")));
      assert.ok(!JSON.stringify(r).includes("secret"), "never echoes a kubeconfig");
    });

    it("takes reuseLease without a warning (kubeclip keeps reusable leases)", async () => {
      const r = await h.harness.validateConfig({ driverKey: "kubernetes", config: { ...cfg, reuseLease: true } });
      assert.equal(r.ok, true, JSON.stringify(r));
      assert.ok(!(r.warnings ?? []).some((w) => w.includes("reuseLease")), JSON.stringify(r.warnings));
    });

    it("returns kubeclip's errors as config.x: message", async () => {
      env.kubeclip.onValidate = () => ({ ok: false, errors: [{ field: "config.egressAllowCidrs[0]", message: '"10.0.0.0/33" is not an IPv4 CIDR' }], warnings: [] });
      try {
        const r = await h.harness.validateConfig({ driverKey: "kubernetes", config: { ...cfg, egressAllowCidrs: ["10.0.0.0/33"] } });
        assert.deepEqual(r, { ok: false, errors: ['config.egressAllowCidrs[0]: "10.0.0.0/33" is not an IPv4 CIDR'], warnings: [] });
      } finally {
        env.kubeclip.onValidate = (config) => ({ ok: true, errors: [], warnings: [], normalizedConfig: config });
      }
    });

    it("refuses the job backend", async () => {
      const r = await h.harness.validateConfig({ driverKey: "kubernetes", config: { ...cfg, backend: "job" } });
      assert.equal(r.ok, false);
      assert.match(r.errors?.[0] ?? "", /^config\.backend: "job"/);
    });

    it("says kubeclip is unreachable, never with the credentials", async () => {
      const validate = async (settings: Record<string, unknown>) => {
        const s = await harnessed(undefined, settings);
        try {
          return await s.harness.validateConfig({ driverKey: "kubernetes", config: cfg });
        } finally {
          await s.shutdown();
        }
      };
      const r = await validate({ natsUrl: `nats://alice:pw-very-secret@127.0.0.1:1` });
      assert.equal(r.ok, false);
      assert.match(r.errors?.[0] ?? "", /^kubeclip unreachable at nats:\/\/127\.0\.0\.1:1: /);
      assert.ok(!JSON.stringify(r).includes("pw-very-secret"));
      const r2 = await validate({ natsUrl: env.server.url, subjectPrefix: "nobody" });
      assert.deepEqual(r2.errors, [`kubeclip unreachable at ${env.server.url}: no kubeclip worker answers nobody.api.validate`]);
      const r3 = await validate({});
      assert.match(r3.errors?.[0] ?? "", /^settings\.natsUrl: not set/);
    });
  });

  describe("probe", () => {
    it("reports streams and the workers that answer", async () => {
      const r = await h.harness.probe({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg });
      assert.equal(r.ok, true, JSON.stringify(r));
      assert.deepEqual(r.metadata?.workers, { "tenant-worker": 1, dispatcher: 1, "run-watcher": 1, "exec-worker": 1 });
      assert.match(r.summary ?? "", /streams present; workers answering: /);
    });

    it("fails without an exec-worker or streams", async () => {
      const saved = env.kubeclip.pingReplies;
      env.kubeclip.pingReplies = saved.filter((p) => p.worker !== "exec-worker");
      try {
        const r = await h.harness.probe({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg });
        assert.equal(r.ok, false);
        assert.ok(r.diagnostics?.some((d) => d.message === "no exec-worker answered paperclip.api.ping"));
      } finally {
        env.kubeclip.pingReplies = saved;
      }
      const other = await harnessed(undefined, { natsUrl: env.server.url, subjectPrefix: "other" });
      try {
        const r2 = await other.harness.probe({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg });
        assert.equal(r2.ok, false);
        assert.ok(r2.diagnostics?.some((d) => d.code === "stream_missing"));
      } finally {
        await other.shutdown();
      }
    });
  });

  describe("a run", () => {
    it("acquires, realizes, executes with live output, and releases with a receipt", async () => {
      const runId = newRun();
      const lease = await acquire(runId);
      assert.equal(lease.providerLeaseId, `pc-${runId.slice(0, 8)}`);
      assert.equal(lease.expiresAt, null);
      assert.deepEqual(lease.metadata, {
        remoteCwd: "/workspace",
        kubeclip: { runId, companyId: C, namespace: `paperclip-${C}`, workloadName: `pc-${runId.slice(0, 8)}`, backend: "pod", adapterType: "claude_local" },
      });
      const acq = env.kubeclip.requests.find((q) => q.payload.runId === runId);
      assert.deepEqual(acq?.payload.config, { backend: "pod" }, "only the provider config goes to kubeclip");

      const ws = await h.harness.realizeWorkspace({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, lease, workspace: { remotePath: " " } });
      assert.deepEqual(ws, { cwd: "/workspace", metadata: { remoteCwd: "/workspace" } });

      // Paperclip rebuilds config from lease metadata for everything after acquire.
      const runtime = { ...cfg, ...lease.metadata, agentId: "agent-1" };
      h.logs.length = 0;
      const r = await h.harness.execute({
        driverKey: "kubernetes",
        companyId: C,
        environmentId: "env-1",
        config: runtime,
        lease,
        command: "sh",
        args: ["-c", "cat; echo done >&2"],
        cwd: "/tmp",
        stdin: "## Paperclip Wake Payload\n",
        timeoutMs: 10_000,
      });
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, "## Paperclip Wake Payload\n");
      assert.equal(r.stderr, "done\n");
      assert.deepEqual(h.logs, [
        { stream: "stdout", chunk: "## Paperclip Wake Payload\n" },
        { stream: "stderr", chunk: "done\n" },
      ]);

      const agent = await h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: runtime, lease, command: "sh", args: ["-c", "claude() { echo agent; }; claude --print"], timeoutMs: 10_000 });
      assert.equal(agent.stdout, "agent\n");
      assert.equal(env.sandbox.startRequests.at(-1)?.record, true, "the agent command is recorded");

      const receipt = await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: runtime, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
      assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "stopped" });
      const rel = env.kubeclip.requests.find((q) => q.payload.runId === runId && q.kind === "release");
      assert.deepEqual(rel?.payload, { runId, companyId: C, providerLeaseId: lease.providerLeaseId });
      assertLeaseLifecycle(h.harness.environmentEvents, "env-1");
      // One log line tells what the lease cost: every hook call, the execute latencies.
      const released = h.harness.logs.find((l) => l.message === "lease released" && l.meta?.runId === runId);
      assert.ok(released, "a lease released line");
      const meta = released.meta ?? {};
      assert.deepEqual(meta.hooks, { acquireLease: 1, realizeWorkspace: 1, execute: 2, releaseLease: 1 });
      assert.equal(meta.executes, 2);
      assert.ok(typeof meta.execP50Ms === "number" && typeof meta.execP99Ms === "number" && meta.execP50Ms <= meta.execP99Ms, JSON.stringify(meta));
    });

    it("throws a failed acquire as <code>: <message> naming the field", async () => {
      env.kubeclip.onAcquire = () => ({ kind: "failed", code: "unknown_adapter", message: 'config.adapterType: "hermes_local" is not in the adapter registry', field: "config.adapterType" });
      try {
        await assert.rejects(acquire(newRun()), { message: 'unknown_adapter: config.adapterType: "hermes_local" is not in the adapter registry' });
      } finally {
        env.kubeclip.onAcquire = () => ({ kind: "created" });
      }
    });

    it("bounds acquire by timeoutMs", async () => {
      env.kubeclip.onAcquire = () => ({ kind: "silent" });
      try {
        await assert.rejects(acquire(newRun(), { ...cfg, timeoutMs: 600 }), /within 600 ms/);
      } finally {
        env.kubeclip.onAcquire = () => ({ kind: "created" });
      }
    });

    it("refuses case-variant keys in executionWorkspaceSettings before asking kubeclip", async () => {
      const runId = newRun();
      await assert.rejects(
        h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, runId, agentId: "a", executionWorkspaceSettings: { mode: "x", Mode: "y" } }),
        /^Error: executionWorkspaceSettings\.Mode \(and executionWorkspaceSettings\.mode\): keys differ only in case/,
      );
      assert.equal(env.kubeclip.requests.some((q) => q.payload.runId === runId), false);
    });

    it("refuses a job backend before asking kubeclip", async () => {
      const before = env.kubeclip.requests.length;
      await assert.rejects(acquire(newRun(), { ...cfg, backend: "job" }), /^Error: config\.backend: "job"/);
      assert.equal(env.kubeclip.requests.length, before);
    });

    it("cancels in-flight commands on release with cancelActiveWork, then returns the receipt", async () => {
      const runId = newRun();
      const lease = await acquire(runId);
      const runtime = { ...cfg, ...lease.metadata };
      const t0 = Date.now();
      const exec = h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: runtime, lease, command: "sleep", args: ["30"], timeoutMs: 60_000 });
      await new Promise((r) => setTimeout(r, 300));
      const receipt = await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: runtime, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata, cancelActiveWork: true });
      assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "stopped" });
      const r = await exec;
      assert.equal(r.exitCode, null);
      assert.equal(r.metadata?.cancelled, true);
      assert.ok(Date.now() - t0 < 10_000);
      const rel = env.kubeclip.requests.find((q) => q.payload.runId === runId && q.kind === "release");
      assert.equal(rel?.payload.cancelActiveWork, true);
    });

    it("leaves commands running on a plain release", async () => {
      const runId = newRun();
      const lease = await acquire(runId);
      const runtime = { ...cfg, ...lease.metadata };
      const exec = h.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: runtime, lease, command: "sh", args: ["-c", "sleep 0.5; echo finished"], timeoutMs: 10_000 });
      await new Promise((r) => setTimeout(r, 100));
      await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: runtime, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
      const r = await exec;
      assert.equal(r.stdout, "finished\n");
    });

    it("destroys with a destroyed receipt", async () => {
      const runId = newRun();
      const lease = await acquire(runId);
      const receipt = await h.harness.destroyLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
      assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
    });

    it("throws a failed release, and answers one of a lease it did not acquire with a receipt that nothing is there", async () => {
      const runId = newRun();
      const lease = await acquire(runId);
      env.kubeclip.onRelease = () => ({ kind: "failed", code: "backend_unavailable", message: "Kubernetes API unreachable" });
      try {
        await assert.rejects(
          h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata }),
          { message: "backend_unavailable: Kubernetes API unreachable" },
        );
      } finally {
        env.kubeclip.onRelease = (req) => ({ kind: "released", state: req.kind === "destroy" ? "destroyed" : "stopped" });
      }
      // Issue 29 (unknown.test.ts): Paperclip's host retries a lease it got no receipt for.
      assert.deepEqual(
        await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: "pc-x", leaseMetadata: { root: "/x" } }),
        { providerLeaseId: "pc-x", state: "destroyed" },
      );
    });

    it("reads the connection from the plugin settings and sends no plugin key to kubeclip", async () => {
      const s = await harnessed(undefined, { natsUrl: env.server.url });
      try {
        const runId = newRun();
        env.sandbox.addLease(C, runId, `pc-${runId.slice(0, 8)}`);
        const lease = await s.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { inCluster: true, backend: "pod" }, runId, agentId: "a" });
        assert.equal(lease.providerLeaseId, `pc-${runId.slice(0, 8)}`);
        const acq = env.kubeclip.requests.find((q) => q.payload.runId === runId);
        assert.deepEqual(acq?.payload.config, { backend: "pod" }, "inCluster is not sent");
      } finally {
        await s.shutdown();
      }
    });
  });
});
