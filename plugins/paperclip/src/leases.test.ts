import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { connect, headers } from "@nats-io/transport-node";
import { ANSWER_PULL_EXPIRES_MS } from "./answers.js";
import { KubeclipError, TimeoutError, UnreachableError } from "./errors.js";
import { Leases, rfc3339Nano } from "./leases.js";
import { startEnv, type Env } from "../test/support/harness.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
let n = 0;
const runId = (): string => `0e8b6f4a-5a7c-4c1e-9f0b-${String(++n).padStart(12, "0")}`;
const opts = { timeoutMs: 5_000, display: "nats://test" };

describe("leases", () => {
  let env: Env;
  let leases: Leases;
  before(async () => {
    env = await startEnv();
    leases = new Leases(env.nc, "paperclip", () => new Date("2026-08-24T10:30:00.412Z"));
  });
  after(async () => {
    await env.close();
  });

  it("publishes an acquire with the contract's headers and returns created", async () => {
    const r = runId();
    const created = await leases.acquire(
      { runId: r, companyId: C, environmentId: "env-1", agentId: "agent-1", issueId: "PAP-1", adapterType: "claude_local", config: { backend: "pod" } },
      opts,
    );
    assert.deepEqual(created, {
      providerLeaseId: `pc-${r.slice(0, 8)}`,
      namespace: `paperclip-${C}`,
      workloadName: `pc-${r.slice(0, 8)}`,
      backend: "pod",
      phase: "Pending",
      expiresAt: null,
    });
    const req = env.kubeclip.requests.find((q) => q.payload.runId === r);
    assert.ok(req);
    assert.equal(req.subject, `paperclip.lease.${C}.acquire`);
    assert.deepEqual(req.payload, { runId: r, companyId: C, environmentId: "env-1", agentId: "agent-1", issueId: "PAP-1", adapterType: "claude_local", config: { backend: "pod" } });
    assert.deepEqual(req.headers, {
      "Nats-Msg-Id": `${C}.${r}.acquire`,
      "ce-specversion": "1.0",
      "ce-type": "io.paperclip.lease.acquire.v1",
      "ce-source": `/companies/${C}/runs/${r}`,
      "ce-id": `${C}.${r}.acquire`,
      "ce-time": "2026-08-24T10:30:00.412000000Z",
      "ce-subject": `paperclip.lease.${C}.acquire`,
      "ce-datacontenttype": "application/json",
      "Nats-Expected-Stream": "PAPERCLIP_LEASES",
    });
  });

  it("passes expiresAt through", async () => {
    env.kubeclip.onAcquire = () => ({ kind: "created", extra: { expiresAt: "2026-08-24T12:30:00Z", phase: "Running" } });
    try {
      const created = await leases.acquire({ runId: runId(), companyId: C, environmentId: "e", agentId: "a", config: {} }, opts);
      assert.equal(created.expiresAt, "2026-08-24T12:30:00Z");
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("takes no forged answer for a failed: JetStream's reply stored on the run subject is no event", async () => {
    const r = runId();
    // A client that names this run's failed subject as the reply of its own publish: JetStream
    // stores its ack there, with no header.
    const failed = `paperclip.run.${C}.${r}.failed`;
    env.nc.publish("paperclip.lease.attacker.release", "{}", { reply: failed });
    await env.nc.flush();
    const jsm = await jetstreamManager(env.nc);
    for (let i = 0; ; i++) {
      const info = await jsm.streams.info("PAPERCLIP_RUNS", { subjects_filter: failed });
      if ((info.state.subjects?.[failed] ?? 0) > 0) break;
      assert.ok(i < 100, "JetStream's ack was not stored on the failed subject");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const created = await leases.acquire({ runId: r, companyId: C, environmentId: "e", agentId: "a", config: {} }, opts);
    assert.equal(created.providerLeaseId, `pc-${r.slice(0, 8)}`);
  });

  it("finds an answer published before it listened (history is delivered)", async () => {
    const r = runId();
    await env.kubeclip.publishRun(C, r, "created", { providerLeaseId: "pc-early", namespace: "ns", workloadName: "pc-early", secretName: "s", backend: "pod", phase: "Pending" });
    env.kubeclip.onAcquire = () => ({ kind: "silent" });
    try {
      const created = await leases.acquire({ runId: r, companyId: C, environmentId: "e", agentId: "a", config: {} }, opts);
      assert.equal(created.providerLeaseId, "pc-early");
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("throws failed as <code>: <message> naming the field", async () => {
    env.kubeclip.onAcquire = () => ({ kind: "failed", code: "invalid_config", message: 'config.egressAllowCidrs[0]: "10.0.0.0/33" is not an IPv4 CIDR', field: "config.egressAllowCidrs[0]" });
    try {
      await assert.rejects(leases.acquire({ runId: runId(), companyId: C, environmentId: "e", agentId: "a", config: {} }, opts), (err: unknown) => {
        assert.ok(err instanceof KubeclipError);
        assert.equal(err.message, 'invalid_config: config.egressAllowCidrs[0]: "10.0.0.0/33" is not an IPv4 CIDR');
        assert.equal(err.field, "config.egressAllowCidrs[0]");
        return true;
      });
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("adds the field to a failed message that does not name it", async () => {
    env.kubeclip.onAcquire = () => ({ kind: "failed", code: "quota_exceeded", message: "exceeded quota", field: "config.defaultResources" });
    try {
      await assert.rejects(leases.acquire({ runId: runId(), companyId: C, environmentId: "e", agentId: "a", config: {} }, opts), {
        message: "quota_exceeded: config.defaultResources: exceeded quota",
      });
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("times out when kubeclip never answers", async () => {
    env.kubeclip.onAcquire = () => ({ kind: "silent" });
    try {
      const t0 = Date.now();
      await assert.rejects(leases.acquire({ runId: runId(), companyId: C, environmentId: "e", agentId: "a", config: {} }, { ...opts, timeoutMs: 700 }), (err: unknown) => {
        assert.ok(err instanceof TimeoutError);
        assert.match(err.message, /no answer to acquire of run .* within 700 ms/);
        return true;
      });
      assert.ok(Date.now() - t0 < 3_000);
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("releases and destroys with receipts, passing cancelActiveWork", async () => {
    const r = runId();
    const released = await leases.release({ runId: r, companyId: C, providerLeaseId: "pc-1", cancelActiveWork: true }, "release", opts);
    assert.deepEqual(released, { providerLeaseId: "pc-1", state: "stopped" });
    const req = env.kubeclip.requests.find((q) => q.payload.runId === r && q.kind === "release");
    assert.ok(req);
    assert.deepEqual(req.payload, { runId: r, companyId: C, providerLeaseId: "pc-1", cancelActiveWork: true });
    assert.equal(req.headers["ce-type"], "io.paperclip.lease.release.v1");
    assert.equal(req.headers["Nats-Msg-Id"], `${C}.${r}.release`);
    const r2 = runId();
    const destroyed = await leases.release({ runId: r2, companyId: C, providerLeaseId: "pc-2", cancelActiveWork: false }, "destroy", opts);
    assert.deepEqual(destroyed, { providerLeaseId: "pc-2", state: "destroyed" });
    const d = env.kubeclip.requests.find((q) => q.payload.runId === r2);
    assert.ok(d);
    assert.equal(d.subject, `paperclip.lease.${C}.destroy`);
    assert.equal("cancelActiveWork" in d.payload, false);
  });

  it("throws a release kubeclip could not do", async () => {
    env.kubeclip.onRelease = () => ({ kind: "failed", code: "backend_unavailable", message: "Kubernetes API unreachable" });
    try {
      await assert.rejects(leases.release({ runId: runId(), companyId: C, providerLeaseId: "pc-1", cancelActiveWork: false }, "release", opts), {
        message: "backend_unavailable: Kubernetes API unreachable",
      });
    } finally {
      env.kubeclip.onRelease = (req) => ({ kind: "released", state: req.kind === "destroy" ? "destroyed" : "stopped" });
    }
  });

  it("resumes a reusable lease and takes only the answer carrying its resumeId", async () => {
    const r = runId();
    // An earlier run's resume answered, and another request's failure: neither is this one's.
    await env.kubeclip.publishRun(C, r, "resumed", { providerLeaseId: "pc-1", from: "retained", generation: 0, resumes: 1, resumeId: "earlier" });
    await env.kubeclip.publishRun(C, r, "failed", { code: "lease_not_found", message: "gone", request: "resume", requestId: "other" });
    env.kubeclip.onResume = () => ({ kind: "resumed", from: "suspended", generation: 1, resumes: 2, expiresAt: "2026-08-24T12:05:03Z" });
    try {
      const resumed = await leases.resume({ runId: r, companyId: C, providerLeaseId: "pc-1", resumeId: "this-one" }, opts);
      assert.deepEqual(resumed, { providerLeaseId: "pc-1", from: "suspended", generation: 1, resumes: 2, expiresAt: "2026-08-24T12:05:03Z" });
    } finally {
      env.kubeclip.onResume = () => ({ kind: "resumed" });
    }
    const req = env.kubeclip.requests.find((q) => q.payload.runId === r && q.kind === "resume");
    assert.ok(req);
    assert.equal(req.subject, `paperclip.lease.${C}.resume`);
    assert.deepEqual(req.payload, { runId: r, companyId: C, providerLeaseId: "pc-1", resumeId: "this-one" });
    assert.equal(req.headers["Nats-Msg-Id"], `${C}.${r}.resume.this-one`);
    assert.equal(req.headers["ce-type"], "io.paperclip.lease.resume.v1");
  });

  it("throws the failure of its own resume (lease_not_found for a lease kubeclip no longer has)", async () => {
    env.kubeclip.onResume = () => ({ kind: "failed", code: "lease_not_found", message: "lease pc-1 is gone (collected); acquire a new one", field: "providerLeaseId" });
    try {
      await assert.rejects(leases.resume({ runId: runId(), companyId: C, providerLeaseId: "pc-1", resumeId: "x" }, opts), (err: unknown) => {
        assert.ok(err instanceof KubeclipError);
        assert.equal(err.code, "lease_not_found");
        return true;
      });
    } finally {
      env.kubeclip.onResume = () => ({ kind: "resumed" });
    }
  });

  it("a named release is answered by the released carrying its releaseId, not an earlier run's", async () => {
    const r = runId();
    await env.kubeclip.publishRun(C, r, "released", { providerLeaseId: "pc-1", state: "stopped", releaseId: "0" });
    let answered = false;
    env.kubeclip.onRelease = async (req) => {
      await new Promise((res) => setTimeout(res, 200));
      answered = true;
      return { kind: "released", state: req.kind === "destroy" ? "destroyed" : "stopped" };
    };
    try {
      const released = await leases.release({ runId: r, companyId: C, providerLeaseId: "pc-1", cancelActiveWork: false, releaseId: "1" }, "release", opts);
      assert.deepEqual(released, { providerLeaseId: "pc-1", state: "stopped" });
      assert.ok(answered, "took the earlier run's released as its answer");
    } finally {
      env.kubeclip.onRelease = (req) => ({ kind: "released", state: req.kind === "destroy" ? "destroyed" : "stopped" });
    }
    const req = env.kubeclip.requests.find((q) => q.payload.runId === r && q.kind === "release");
    assert.ok(req);
    assert.equal(req.headers["Nats-Msg-Id"], `${C}.${r}.release.1`);
    assert.equal(req.payload.releaseId, "1");
  });

  it("reports missing streams as kubeclip unreachable", async () => {
    const other = new Leases(env.nc, "nostreams");
    await assert.rejects(other.acquire({ runId: runId(), companyId: C, environmentId: "e", agentId: "a", config: {} }, opts), /kubeclip unreachable at nats:\/\/test: streams NOSTREAMS_LEASES\/NOSTREAMS_RUNS not found/);
  });

  it("shares one consumer among its requests and keeps no wait after them", async () => {
    const jsm = await jetstreamManager(env.nc);
    const before = (await jsm.streams.info("PAPERCLIP_RUNS")).state.consumer_count;
    let waiting = 0;
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    env.kubeclip.onAcquire = async () => {
      if (++waiting === 20) open();
      await gate;
      return { kind: "created" };
    };
    try {
      const runs = Array.from({ length: 20 }, () => runId());
      const all = Promise.all(runs.map((r) => leases.acquire({ runId: r, companyId: C, environmentId: "e", agentId: "a", config: {} }, opts)));
      await gate;
      assert.equal(leases.answers.waiting, 20);
      assert.equal((await jsm.streams.info("PAPERCLIP_RUNS")).state.consumer_count, before);
      // Each takes its own run's answer.
      assert.deepEqual((await all).map((c) => c.providerLeaseId), runs.map((r) => `pc-${r.slice(0, 8)}`));
      assert.equal(leases.answers.waiting, 0);
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("skips an answer it cannot read and takes the next", async () => {
    const r = runId();
    env.kubeclip.onAcquire = async () => {
      const h = headers();
      h.set("ce-type", "io.paperclip.run.created.v1");
      await jetstream(env.nc).publish(`paperclip.run.${C}.${r}.created`, "{not json", { headers: h });
      return { kind: "created" };
    };
    try {
      const created = await leases.acquire({ runId: r, companyId: C, environmentId: "e", agentId: "a", config: {} }, opts);
      assert.equal(created.providerLeaseId, `pc-${r.slice(0, 8)}`);
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("gets its answer through a consumer the server dropped while it waited", async () => {
    const jsm = await jetstreamManager(env.nc);
    env.kubeclip.onAcquire = async () => {
      for await (const c of jsm.consumers.list("PAPERCLIP_RUNS")) await jsm.consumers.delete("PAPERCLIP_RUNS", c.name);
      // After the request's own read of the history: the answer comes through the consumer.
      await new Promise((resolve) => setTimeout(resolve, 300));
      return { kind: "created" };
    };
    try {
      const r = runId();
      const t0 = Date.now();
      const created = await leases.acquire({ runId: r, companyId: C, environmentId: "e", agentId: "a", config: {} }, { ...opts, timeoutMs: 30_000 });
      assert.equal(created.providerLeaseId, `pc-${r.slice(0, 8)}`);
      // Recreated after two missed heartbeats, not found by the last read of the history (29 s).
      assert.ok(Date.now() - t0 < 3 * ANSWER_PULL_EXPIRES_MS, `answered after ${Date.now() - t0} ms`);
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("fails at once, not at its deadline, when its connection closes while it waits", async () => {
    const nc = await connect({ servers: env.server.url });
    const own = new Leases(nc, "paperclip");
    env.kubeclip.onAcquire = () => ({ kind: "silent" });
    try {
      const r = runId();
      const p = own.acquire({ runId: r, companyId: C, environmentId: "e", agentId: "a", config: {} }, { ...opts, timeoutMs: 30_000 });
      // Published: the request waits on the consumer alone.
      while (!env.kubeclip.requests.some((q) => q.payload.runId === r)) await new Promise((resolve) => setTimeout(resolve, 5));
      const t0 = Date.now();
      await nc.close();
      await assert.rejects(p, (err: unknown) => {
        assert.ok(err instanceof UnreachableError, String(err));
        return true;
      });
      assert.ok(Date.now() - t0 < 5_000, `failed after ${Date.now() - t0} ms`);
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("fails at once when its connection closes while its publish is retried", async (t) => {
    // No stream takes this prefix's requests: every publish is answered "no responders" and
    // retried, as in a JetStream leader election, until the connection closes.
    const jsm = await jetstreamManager(env.nc);
    await jsm.streams.add({ name: "NOSTREAM_RUNS", subjects: ["nostream.run.>"] });
    t.after(() => jsm.streams.delete("NOSTREAM_RUNS"));
    const nc = await connect({ servers: env.server.url });
    const own = new Leases(nc, "nostream");
    const p = own.acquire({ runId: runId(), companyId: C, environmentId: "e", agentId: "a", config: {} }, { ...opts, timeoutMs: 30_000 });
    p.catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 300));
    const t0 = Date.now();
    await nc.close();
    await assert.rejects(p, (err: unknown) => {
      assert.ok(err instanceof UnreachableError, String(err));
      return true;
    });
    assert.ok(Date.now() - t0 < 5_000, `failed after ${Date.now() - t0} ms`);
  });

  it("stops waiting when its caller aborts", async () => {
    env.kubeclip.onAcquire = () => ({ kind: "silent" });
    try {
      const abort = new AbortController();
      const p = leases.acquire({ runId: runId(), companyId: C, environmentId: "e", agentId: "a", config: {} }, { ...opts, signal: abort.signal });
      while (leases.answers.waiting === 0) await new Promise((resolve) => setTimeout(resolve, 5));
      abort.abort(new Error("host cancelled"));
      await assert.rejects(p, /host cancelled/);
      assert.equal(leases.answers.waiting, 0);
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });

  it("formats ce-time with nanoseconds", () => {
    assert.equal(rfc3339Nano(new Date("2026-01-02T03:04:05.006Z")), "2026-01-02T03:04:05.006000000Z");
  });
});
