// The plugin's exec client against kubeclip's REAL exec-workers: run by tests/paperclip
// (TestExecClientAgainstExecWorkers), which starts the worker binaries on a real JetStream
// server, acquires a pod lease on the local cluster and passes its coordinates here:
//
//   KUBECLIP_REAL_NATS_URL, KUBECLIP_REAL_COMPANY_ID, KUBECLIP_REAL_RUN_ID,
//   KUBECLIP_REAL_LEASE_ID (the created event's providerLeaseId)
//
// Without them this file fails: it has no meaning on its own (npm test does not run it). What
// the unit tests check against the fake exec service (src/exec.test.ts), this checks against
// pkg/execsvc and sandboxd: stdout/stderr apart, exit codes, cwd and env, stdin byte-exact,
// stdin refused once the command stopped reading (`closed`), a signal answered by `signaled`
// with the exit still coming, sandboxd's timeout, a large output complete; and every request
// the client sent matches docs/schemas.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, it } from "node:test";
import { connect, type Msg, type NatsConnection } from "@nats-io/transport-node";
import { runExec, type ExecSpec } from "../../src/exec.js";
import { schemaErrors } from "../support/schemas.js";

function need(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: this test runs from tests/paperclip (go test ./tests/paperclip), against a real lease`);
  return v;
}

const url = need("KUBECLIP_REAL_NATS_URL");
const C = need("KUBECLIP_REAL_COMPANY_ID");
const R = need("KUBECLIP_REAL_RUN_ID");
const LEASE = need("KUBECLIP_REAL_LEASE_ID");

function spec(command: string, args: string[], extra: Partial<ExecSpec> = {}): ExecSpec {
  return { companyId: C, runId: R, providerLeaseId: LEASE, command, args, env: {}, timeoutMs: 60_000, record: false, ...extra };
}

describe("the exec client against kubeclip's exec-workers", () => {
  let nc: NatsConnection;
  const sent: Msg[] = [];
  before(async () => {
    // The paperclip user's own inbox, as the plugin connects (src/nats.ts): the exec-worker answers
    // and takes stdin only from a client inbox.
    nc = await connect({ servers: url, inboxPrefix: "_INBOX_paperclip" });
    // Every request and io message of this lease's execs, to check them against the protocol.
    nc.subscribe(`paperclip.exec.${C}.${R}.>`, {
      callback: (_e, m) => {
        sent.push(m);
      },
    });
    await nc.flush();
  });
  after(async () => {
    await nc.close();
  });

  it("runs a command: stdout and stderr apart, cwd, env, the exit code", async () => {
    const logs: string[] = [];
    const r = await runExec(nc, "paperclip", spec("sh", ["-c", 'pwd; echo "$GREETING" >&2; exit 7'], { cwd: "/tmp", env: { GREETING: "hi" } }), {
      onOutput: (s, t) => logs.push(`${s}:${t}`),
    });
    assert.equal(r.exitCode, 7);
    assert.equal(r.stdout, "/tmp\n");
    assert.equal(r.stderr, "hi\n");
    assert.deepEqual(logs.sort(), ["stderr:hi\n", "stdout:/tmp\n"]);
    assert.match(r.metadata.replica ?? "", /^exec-worker-\d+$/);
  });

  it("sends stdin byte-exact", async () => {
    const unit = "kubeclip ✓ ünïcödé 😀\n";
    const stdin = unit.repeat(Math.ceil((3 << 20) / Buffer.byteLength(unit)));
    const r = await runExec(nc, "paperclip", spec("sha256sum", [], { stdin }));
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout.split(" ")[0], createHash("sha256").update(Buffer.from(stdin, "utf8")).digest("hex"));
  });

  it("stops sending stdin once the command stopped reading", async () => {
    const before = sent.length;
    const stdin = "z".repeat(16 << 20); // 32 chunks of 512 KiB
    const t0 = Date.now();
    const r = await runExec(nc, "paperclip", spec("head", ["-c", "10"], { stdin }));
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "z".repeat(10));
    const stdinMsgs = sent.slice(before).filter((m) => m.headers?.get("Kubeclip-Exec") === "stdin");
    assert.ok(stdinMsgs.length < 32, `${stdinMsgs.length} stdin messages for a command that read 10 bytes; want fewer than the 32 chunks`);
    assert.ok(Date.now() - t0 < 30_000);
  });

  it("answers an abort's SIGKILL with `signaled`, and the exit still comes", async () => {
    const ac = new AbortController();
    const before = sent.length;
    const run = runExec(nc, "paperclip", spec("sh", ["-c", "echo started; sleep 60"]), {
      signal: ac.signal,
      onOutput: () => {
        ac.abort();
      },
    });
    const r = await run;
    assert.equal(r.metadata.cancelled, true);
    assert.equal(r.signal, "SIGKILL");
    assert.equal(r.exitCode, null);
    assert.equal(r.metadata.clientTimeout, undefined);
    assert.equal(r.stdout, "started\n");
    // The exit came (the client closed the exec), so the stream outlived the signal.
    assert.ok(
      sent.slice(before).some((m) => m.headers?.get("Kubeclip-Exec") === "close"),
      "the client closed the exec after its exit",
    );
  });

  it("is killed by sandboxd at its timeout", async () => {
    const t0 = Date.now();
    const r = await runExec(nc, "paperclip", spec("sleep", ["60"], { timeoutMs: 1_500 }));
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, null);
    assert.equal(r.signal, "SIGKILL");
    assert.equal(r.metadata.clientTimeout, undefined, "sandboxd's exit, not the client's own give-up");
    assert.ok(Date.now() - t0 < 10_000);
  });

  it("returns 8 MiB of output complete", async () => {
    const size = 8 << 20;
    const r = await runExec(nc, "paperclip", spec("sh", ["-c", `yes 0123456789abcdef | head -c ${size}`]));
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout.length, size);
    assert.equal(r.stdout, "0123456789abcdef\n".repeat(Math.ceil(size / 17)).slice(0, size));
  });

  it("sent only what docs/schemas allow", () => {
    let requests = 0;
    for (const m of sent) {
      const op = m.subject.split(".")[4] ?? "";
      if (op === "io") continue; // headers and raw bytes, refused by the exec-worker if wrong
      if (op !== "start" && op !== "attach" && op !== "signal") assert.fail(`a message on ${m.subject}`);
      const body: unknown = JSON.parse(new TextDecoder().decode(m.data));
      assert.equal(schemaErrors(`exec-${op}`, body), undefined, `${op}: ${JSON.stringify(body).slice(0, 200)}`);
      requests++;
    }
    assert.ok(requests >= 6, `${requests} requests seen`);
  });
});
