// The shared consumer of the runs' answers under the users and accounts kubeclip ships
// (deploy/kustomize/base/nats-auth.conf: the `paperclip` user in the CLIENTS account, importing
// what it uses from KUBECLIP's): it is created, delivers, is recreated after the server dropped
// it, and a run's history is read, with nothing refused; and a message on a run's answer subject
// that names another run (a stored copy, issue 26 item 5) answers nothing.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { Leases } from "./leases.js";
import { startEnv, type Env } from "../test/support/harness.js";
import { shippedConf } from "../test/support/shipped-conf.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
let n = 0;
const runId = (): string => `1e8b6f4a-5a7c-4c1e-9f0b-${String(++n).padStart(12, "0")}`;
const opts = { timeoutMs: 10_000, display: "nats://test" };

describe("answers under the shipped permissions of the paperclip user", () => {
  let env: Env;
  let nc: NatsConnection;
  let leases: Leases;
  const refused: string[] = [];
  before(async () => {
    env = await startEnv(shippedConf());
    nc = await connect({ servers: env.server.url, user: "paperclip", pass: "pcpw", inboxPrefix: "_INBOX_paperclip" });
    void (async () => {
      for await (const s of nc.status()) if (s.type === "error") refused.push(String(s.error));
    })();
    leases = new Leases(nc, "paperclip");
  });
  after(async () => {
    await nc.close();
    await env.close();
  });

  it("acquires, releases and resumes through one consumer, reads history, refused nothing", async () => {
    // Stored before the request and before any consumer: found by the direct get of the run's
    // history.
    const early = runId();
    await env.kubeclip.publishRun(C, early, "released", { providerLeaseId: "pc-x", state: "stopped", releaseId: "3" });
    env.kubeclip.onRelease = () => ({ kind: "silent" });
    try {
      const t0 = Date.now();
      const released = await leases.release({ runId: early, companyId: C, providerLeaseId: "pc-x", cancelActiveWork: false, releaseId: "3" }, "release", opts);
      assert.deepEqual(released, { providerLeaseId: "pc-x", state: "stopped" });
      assert.ok(Date.now() - t0 < opts.timeoutMs / 2, "read at once, not by the last read before the deadline");
    } finally {
      env.kubeclip.onRelease = (req) => ({ kind: "released", state: req.kind === "destroy" ? "destroyed" : "stopped" });
    }
    const r = runId();
    const created = await leases.acquire({ runId: r, companyId: C, environmentId: "e", agentId: "a", config: {} }, opts);
    assert.equal(created.providerLeaseId, `pc-${r.slice(0, 8)}`);
    const resumed = await leases.resume({ runId: r, companyId: C, providerLeaseId: created.providerLeaseId, resumeId: "r1" }, opts);
    assert.equal(resumed.providerLeaseId, created.providerLeaseId);
    const jsm = await jetstreamManager(env.nc);
    assert.equal((await jsm.streams.info("PAPERCLIP_RUNS")).state.consumer_count, 1);
    await nc.flush();
    assert.deepEqual(refused, []);
  });

  it("takes no answer whose payload names another run", async () => {
    const r = runId();
    const foreign = { companyId: "other-company", runId: "other-run", code: "invalid_config", message: "copied", request: "acquire" };
    // Typed answers on the run's subject naming another run: one stored before the request (read
    // by the history), one while it waits (delivered by the consumer).
    await env.kubeclip.publishRun(C, r, "failed", foreign);
    env.kubeclip.onAcquire = async () => {
      await env.kubeclip.publishRun(C, r, "failed", foreign);
      await env.kubeclip.publishRun(C, r, "created", { ...foreign, providerLeaseId: "pc-foreign", namespace: "x", workloadName: "x", secretName: "x", backend: "pod", phase: "Pending" });
      return { kind: "created" };
    };
    try {
      const created = await leases.acquire({ runId: r, companyId: C, environmentId: "e", agentId: "a", config: {} }, opts);
      assert.equal(created.providerLeaseId, `pc-${r.slice(0, 8)}`);
    } finally {
      env.kubeclip.onAcquire = () => ({ kind: "created" });
    }
  });
});
