// Issue 29: Paperclip's host sweeps the leases its own restart stranded and releases or destroys
// each; a lease it gets no receipt for stays pending cleanup, retried and then left for an
// operator. So a release or destroy of a lease nothing of the company's runs under is answered at
// once with a receipt that nothing is there, and touches nothing: one whose metadata kubeclip
// never wrote, one of another company (neither asks kubeclip anything), and one kubeclip answers
// `released` unknown for (its id may be one of the company's live leases, misnamed: its commands
// go on). A resume of one is refused clearly, naming the field.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { PluginEnvironmentLease } from "@paperclipai/plugin-sdk";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
const OTHER = "0b7c4d1e-9a2f-4c3b-8e5d-6f1a2b3c4d5e";
let n = 0;
const newRun = (): string => `9c4d2a7e-5a7c-4c1e-9f0b-${String(++n).padStart(12, "0")}`;

describe("leases nothing of the company's runs under", () => {
  let env: Env;
  let h: Harnessed;
  const cfg = { backend: "pod", streamRunLogs: false };
  before(async () => {
    env = await startEnv();
    h = await harnessed(undefined, { natsUrl: env.server.url });
  });
  after(async () => {
    await h.shutdown();
    await env.close();
  });

  async function acquire(runId: string, companyId = C): Promise<PluginEnvironmentLease> {
    env.sandbox.addLease(companyId, runId, `pc-${runId.slice(0, 8)}`);
    return h.harness.acquireLease({ driverKey: "kubernetes", companyId, environmentId: "env-1", config: cfg, runId, agentId: "agent-1", adapterType: "claude_local" });
  }
  const base = { driverKey: "kubernetes", environmentId: "env-1", config: cfg };
  /** The hook's answer and how long it took. */
  async function end(kind: "release" | "destroy", params: Parameters<Harnessed["harness"]["releaseLease"]>[0]): Promise<{ receipt: unknown; ms: number }> {
    const t0 = Date.now();
    const receipt = kind === "release" ? await h.harness.releaseLease(params) : await h.harness.destroyLease(params);
    return { receipt, ms: Date.now() - t0 };
  }

  for (const kind of ["release", "destroy"] as const) {
    it(`answers a ${kind} of a lease with no kubeclip metadata with a receipt, asking kubeclip nothing`, async () => {
      const requests = env.kubeclip.requests.length;
      for (const leaseMetadata of [undefined, { remoteCwd: "/workspace" }, { kubeclip: { companyId: C } }]) {
        const { receipt, ms } = await end(kind, { ...base, companyId: C, providerLeaseId: "pc-stranded", ...(leaseMetadata ? { leaseMetadata } : {}) });
        assert.deepEqual(receipt, { providerLeaseId: "pc-stranded", state: "destroyed" }, JSON.stringify(leaseMetadata));
        assert.ok(ms < 1_000, `answered in ${ms} ms`);
      }
      assert.equal(env.kubeclip.requests.length, requests, "no request to kubeclip");
      assert.ok(h.harness.logs.some((l) => l.message === `lease ${kind}: nothing of this company's runs under this lease; answered with a receipt`));
    });

    it(`answers another company's ${kind} of a lease with a receipt, and the lease's commands go on`, async () => {
      const lease = await acquire(newRun(), OTHER);
      const exec = h.harness.execute({ ...base, companyId: OTHER, config: { ...cfg, ...lease.metadata }, lease, command: "sh", args: ["-c", "sleep 1; echo finished"], timeoutMs: 10_000 });
      await new Promise((r) => setTimeout(r, 300));
      const requests = env.kubeclip.requests.length;
      const { receipt, ms } = await end(kind, { ...base, companyId: C, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata, cancelActiveWork: true });
      assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
      assert.ok(ms < 1_000, `answered in ${ms} ms`);
      assert.equal(env.kubeclip.requests.length, requests, "no request to kubeclip");
      const r = await exec;
      assert.equal(r.metadata?.cancelled, undefined);
      assert.equal(r.stdout, "finished\n");
    });

    it(`answers a ${kind} kubeclip has no lease for with its receipt, cancelling none of the company's commands under that id`, async () => {
      const lease = await acquire(newRun());
      const exec = h.harness.execute({ ...base, companyId: C, config: { ...cfg, ...lease.metadata }, lease, command: "sh", args: ["-c", "sleep 1; echo finished"], timeoutMs: 10_000 });
      await new Promise((r) => setTimeout(r, 300));
      const saved = env.kubeclip.onRelease;
      env.kubeclip.onRelease = () => ({ kind: "released", state: "destroyed", unknown: true });
      // The lease's id under a run kubeclip does not know (a row the host misnamed).
      const kubeclip = { ...(lease.metadata?.kubeclip as object), runId: newRun() };
      try {
        const { receipt } = await end(kind, { ...base, companyId: C, providerLeaseId: lease.providerLeaseId, leaseMetadata: { ...lease.metadata, kubeclip }, cancelActiveWork: true });
        assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
      } finally {
        env.kubeclip.onRelease = saved;
      }
      assert.equal(env.kubeclip.requests.at(-1)?.kind, kind);
      const r = await exec;
      assert.equal(r.metadata?.cancelled, undefined, "the company's command was cancelled");
      assert.equal(r.stdout, "finished\n");
    });
  }

  it("refuses a resume of a lease with no kubeclip metadata, or of another company's, naming the field", async () => {
    const lease = await acquire(newRun(), OTHER);
    const requests = env.kubeclip.requests.length;
    await assert.rejects(
      h.harness.resumeLease({ ...base, companyId: C, providerLeaseId: "pc-stranded", leaseMetadata: { remoteCwd: "/workspace" } }),
      /^Error: leaseMetadata\.kubeclip\.runId: missing; this lease was not acquired by the kubeclip plugin$/,
    );
    await assert.rejects(
      h.harness.resumeLease({ ...base, companyId: C, providerLeaseId: lease.providerLeaseId ?? "", leaseMetadata: lease.metadata }),
      /leaseMetadata\.kubeclip\.companyId: the lease is company 0b7c4d1e-9a2f-4c3b-8e5d-6f1a2b3c4d5e's, not this call's company 7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13; refused/,
    );
    assert.equal(env.kubeclip.requests.length, requests, "no request to kubeclip");
  });
});
