// A reusable lease through the plugin's hooks against the fake kubeclip: the acquire asks for
// reuse only when declared and the host can find the lease again, each release names the resume
// it follows, a resume answers with the lease's metadata (and no lease for one kubeclip no longer
// has), and a reusable lease the host cannot resume is destroyed on release.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { PluginEnvironmentLease } from "@paperclipai/plugin-sdk";
import { errorMessage } from "./errors.js";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
let n = 0;
const runId = (): string => `5a1c2e3f-5a7c-4c1e-9f0b-${String(++n).padStart(12, "0")}`;
const scope = { reusableSandboxLease: { companyId: C, executionWorkspaceId: "ew-1" } };

describe("reusable leases", () => {
  let env: Env;
  let h: Harnessed;
  let plain: Harnessed;
  const cfg = { backend: "pod", reuseLease: true };
  before(async () => {
    env = await startEnv();
    // h declares reuse as the manifest does (REUSABLE_LEASES); plain is a plugin that does not.
    h = await harnessed({ exec: { silenceMs: 500, graceMs: 2_000 } }, { natsUrl: env.server.url });
    plain = await harnessed({ reusableLeases: false }, { natsUrl: env.server.url });
  });
  after(async () => {
    await h.shutdown();
    await plain.shutdown();
    await env.close();
  });

  function acquire(s: Harnessed, run: string, executionWorkspaceId?: string): Promise<PluginEnvironmentLease> {
    return s.harness.acquireLease({
      driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, runId: run, agentId: "agent-1", adapterType: "claude_local",
      ...(executionWorkspaceId ? { executionWorkspaceId } : {}),
    });
  }
  const request = (run: string, kind: string) => env.kubeclip.requests.filter((q) => q.payload.runId === run && q.kind === kind);

  it("acquires, releases, resumes and releases again, each release named by the resume it follows", async () => {
    const run = runId();
    const lease = await acquire(h, run, "ew-1");
    assert.equal(request(run, "acquire")[0]?.payload.reuseLease, true);
    const kubeclip = (lease.metadata as { kubeclip: Record<string, unknown> }).kubeclip;
    assert.equal(kubeclip.reusable, true);
    assert.equal(kubeclip.resumes, 0);
    const leaseId = lease.providerLeaseId ?? "";
    const base = { driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: leaseId };

    const receipt = await h.harness.releaseLease({ ...base, leaseMetadata: { ...lease.metadata, ...scope } });
    assert.deepEqual(receipt, { providerLeaseId: leaseId, state: "stopped" });
    assert.equal(request(run, "release")[0]?.payload.releaseId, "0");

    env.kubeclip.onResume = () => ({ kind: "resumed", from: "retained", generation: 0, resumes: 1, expiresAt: "2026-08-24T12:30:00Z" });
    const resumed = await h.harness.resumeLease({ ...base, leaseMetadata: { ...lease.metadata, ...scope } });
    env.kubeclip.onResume = () => ({ kind: "resumed" });
    assert.equal(resumed.providerLeaseId, leaseId);
    // The host stores the answer's expiresAt on the lease's new row: the one the resume renewed.
    assert.equal(resumed.expiresAt, "2026-08-24T12:30:00Z");
    assert.deepEqual(resumed.metadata, { remoteCwd: (lease.metadata as { remoteCwd: string }).remoteCwd, kubeclip: { ...kubeclip, resumes: 1 } });
    const resume = request(run, "resume")[0];
    assert.ok(resume);
    assert.equal(resume.payload.providerLeaseId, leaseId);
    assert.match(String(resume.payload.resumeId), /^[0-9a-f-]{36}$/);

    const again = await h.harness.releaseLease({ ...base, leaseMetadata: { ...resumed.metadata, ...scope } });
    assert.deepEqual(again, { providerLeaseId: leaseId, state: "stopped" });
    assert.deepEqual(request(run, "release").map((q) => q.payload.releaseId), ["0", "1"]);
  });

  it("answers no lease for a lease kubeclip no longer has, so the host acquires afresh", async () => {
    const run = runId();
    const lease = await acquire(h, run, "ew-1");
    env.kubeclip.onResume = () => ({ kind: "failed", code: "lease_not_found", message: "lease is gone (collected); acquire a new one", field: "providerLeaseId" });
    try {
      const r = await h.harness.resumeLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId ?? "", leaseMetadata: lease.metadata });
      assert.deepEqual(r, { providerLeaseId: null, metadata: { expired: true } });
    } finally {
      env.kubeclip.onResume = () => ({ kind: "resumed" });
    }
  });

  it("throws a resume kubeclip could not do for another reason (the lease is kept)", async () => {
    const run = runId();
    const lease = await acquire(h, run, "ew-1");
    env.kubeclip.onResume = () => ({ kind: "failed", code: "backend_unavailable", message: "Kubernetes API unreachable" });
    try {
      await assert.rejects(
        h.harness.resumeLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId ?? "", leaseMetadata: lease.metadata }),
        /backend_unavailable/,
      );
    } finally {
      env.kubeclip.onResume = () => ({ kind: "resumed" });
    }
  });

  it("a resume whose agent another run holds throws what the host retries (the lease is kept)", async () => {
    const run = runId();
    const lease = await acquire(h, run, "ew-1");
    env.kubeclip.onResume = () => ({
      kind: "failed", code: "agent_busy", field: "agentId",
      message: "agent agent-1 is running run r-2; one run per agent at a time: lease pc-1 is kept, resume it once that run ends",
    });
    try {
      await assert.rejects(
        h.harness.resumeLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId ?? "", leaseMetadata: lease.metadata }),
        (err: unknown) => {
          const msg = errorMessage(err);
          // The host's transient test (environment-runtime.js transientSandboxResumeFailure), as it
          // reads the message: not matched, the run fails at once instead of waiting its minute.
          assert.match(msg.toLowerCase(), /\b(timeout|timed out|rate limit|temporar|network|connection reset|service unavailable)\b/);
          assert.match(msg, /^agent_busy: agentId: agent agent-1 is running run r-2/);
          return true;
        },
      );
    } finally {
      env.kubeclip.onResume = () => ({ kind: "resumed" });
    }
  });

  it("a resume kubeclip does not answer in time throws what the host retries (timed out)", async () => {
    const run = runId();
    const lease = await acquire(h, run, "ew-1");
    env.kubeclip.onResume = () => ({ kind: "silent" });
    try {
      await assert.rejects(
        h.harness.resumeLease({
          driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { ...cfg, timeoutMs: 500 },
          providerLeaseId: lease.providerLeaseId ?? "", leaseMetadata: lease.metadata,
        }),
        (err: unknown) => {
          // The host's transient test is /\b(timeout|timed out|...)\b/ on the message.
          assert.match(errorMessage(err), /\btimed out\b/);
          return true;
        },
      );
    } finally {
      env.kubeclip.onResume = () => ({ kind: "resumed" });
    }
  });

  it("refuses another company's lease and answers no lease for one that is not reusable", async () => {
    const run = runId();
    const lease = await acquire(h, run); // no execution workspace: not reusable
    assert.equal(request(run, "acquire")[0]?.payload.reuseLease, undefined);
    const base = { driverKey: "kubernetes", environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId ?? "", leaseMetadata: lease.metadata };
    assert.deepEqual(await h.harness.resumeLease({ ...base, companyId: C }), { providerLeaseId: null, metadata: { expired: true } });
    await assert.rejects(h.harness.resumeLease({ ...base, companyId: "other-company" }), /refused/);
    assert.equal(request(run, "resume").length, 0, "nothing was asked of kubeclip");
  });

  it("destroys a reusable lease on release when the host cannot resume it (no reuse scope)", async () => {
    const run = runId();
    const lease = await acquire(h, run, "ew-1");
    const receipt = await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId ?? "", leaseMetadata: lease.metadata });
    assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
    assert.equal(request(run, "release").length, 0);
    assert.equal(request(run, "destroy")[0]?.payload.releaseId, undefined);
  });

  it("destroys a reusable lease after its releases, answered as kubeclip answers a destroy (no releaseId)", async () => {
    const run = runId();
    const lease = await acquire(h, run, "ew-1");
    const base = { driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId: lease.providerLeaseId ?? "" };
    const kubeclip = (lease.metadata as { kubeclip: Record<string, unknown> }).kubeclip;
    const resumed = { ...lease.metadata, kubeclip: { ...kubeclip, resumes: 2 }, ...scope };
    assert.deepEqual(await h.harness.releaseLease({ ...base, leaseMetadata: resumed }), { providerLeaseId: lease.providerLeaseId, state: "stopped" });
    const receipt = await h.harness.destroyLease({ ...base, leaseMetadata: resumed });
    assert.deepEqual(receipt, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
    assert.deepEqual(request(run, "release").map((q) => q.payload.releaseId), ["2"]);
    assert.equal(request(run, "destroy")[0]?.payload.releaseId, undefined);
  });

  it("asks for no reuse when the plugin does not declare it", async () => {
    const run = runId();
    await acquire(plain, run, "ew-1");
    assert.equal(request(run, "acquire")[0]?.payload.reuseLease, undefined);
  });
});
