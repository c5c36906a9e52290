import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, beforeEach, describe, it } from "node:test";
import { KubeclipError } from "./errors.js";
import { newExecId, runExec, splitText, type ExecSpec, type Stream } from "./exec.js";
import { FakeExecReplica } from "../test/support/fake-exec.js";
import { startEnv, type Env } from "../test/support/harness.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
const R = "0e8b6f4a-5a7c-4c1e-9f0b-2a9d7c3e1b44";
const LEASE = "pc-01k3b7r2m9x4c8v5n6t1q0w2ey";
const fast = { silenceMs: 400, graceMs: 2_000 };

async function eventually(cond: () => boolean, what: string, ms = 3_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) assert.fail(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

function spec(command: string, args: string[], extra: Partial<ExecSpec> = {}): ExecSpec {
  return { companyId: C, runId: R, providerLeaseId: LEASE, command, args, env: {}, timeoutMs: 20_000, record: false, ...extra };
}

describe("exec helpers", () => {
  it("makes 26-character ULIDs in time order", () => {
    const a = newExecId(1_000);
    const b = newExecId(2_000);
    assert.match(a, /^[0-9A-HJKMNP-TV-Z]{26}$/);
    assert.ok(a.slice(0, 10) < b.slice(0, 10));
  });

  it("splits text without breaking surrogate pairs", () => {
    assert.deepEqual(splitText("abcdef", 4), ["abcd", "ef"]);
    const s = "abc😀def";
    const parts = splitText(s, 4);
    assert.equal(parts.join(""), s);
    assert.ok(parts.every((p) => p.length <= 4));
    assert.equal(parts[0], "abc");
  });
});

describe("exec protocol", () => {
  let env: Env;
  before(async () => {
    env = await startEnv();
    env.sandbox.addLease(C, R, LEASE);
  });
  after(async () => {
    await env.close();
  });
  beforeEach(async () => {
    // One live replica per test; tests that need more add them.
    for (const r of env.replicas.splice(0)) r.die();
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-a"));
    await env.nc.flush();
  });

  it("keeps stdout and stderr apart, streams chunks in order and returns the exit code", async () => {
    const logs: { stream: Stream; text: string }[] = [];
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; exit 3"]), {
      ...fast,
      onOutput: (stream, text) => logs.push({ stream, text }),
    });
    assert.equal(r.exitCode, 3);
    assert.equal(r.timedOut, false);
    assert.equal(r.signal, null);
    assert.equal(r.stdout, "one\nthree\n");
    assert.equal(r.stderr, "two\n");
    assert.deepEqual(logs, [
      { stream: "stdout", text: "one\n" },
      { stream: "stderr", text: "two\n" },
      { stream: "stdout", text: "three\n" },
    ]);
    assert.equal(r.metadata.replica, "ew-a");
    const start = env.sandbox.startRequests.at(-1);
    assert.ok(start);
    assert.equal(start.execId, r.metadata.execId);
    assert.equal(start.stdinBytes, 0);
    assert.equal(start.record, false);
    await eventually(() => !env.sandbox.execs.has(r.metadata.execId), "close drops the journal");
  });

  it("passes cwd and env", async () => {
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", 'pwd; echo "$GREETING"'], { cwd: "/tmp", env: { GREETING: "hi" } }), fast);
    assert.equal(r.stdout, "/tmp\nhi\n");
  });

  it("reports a signal death", async () => {
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", "kill -9 $$"]), fast);
    assert.equal(r.exitCode, null);
    assert.equal(r.signal, "SIGKILL");
    assert.equal(r.timedOut, false);
  });

  it("times out: the server kills it and says so", async () => {
    const t0 = Date.now();
    const r = await runExec(env.nc, "paperclip", spec("sleep", ["30"], { timeoutMs: 500 }), fast);
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, null);
    assert.ok(Date.now() - t0 < 5_000);
  });

  it("times out client-side when no exit frame comes", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    const silent = env.nc.subscribe("paperclip.exec.*.*.>", { queue: "kubeclip-exec", callback: () => undefined });
    await env.nc.flush();
    try {
      const t0 = Date.now();
      const r = await runExec(env.nc, "paperclip", spec("true", [], { timeoutMs: 300 }), { silenceMs: 200, graceMs: 300 });
      assert.equal(r.timedOut, true);
      assert.equal(r.metadata.clientTimeout, true);
      assert.ok(Date.now() - t0 < 3_000);
    } finally {
      silent.unsubscribe();
    }
  });

  it("sends 8 MiB of stdin byte-exact", async () => {
    // Multi-byte characters so a chunk boundary falls inside one: bytes, not characters, count.
    const unit = "kubeclip ✓ ünïcödé 😀\n";
    const stdin = unit.repeat(Math.ceil((8 << 20) / Buffer.byteLength(unit)));
    const want = createHash("sha256").update(Buffer.from(stdin, "utf8")).digest("hex");
    const got = await runExec(env.nc, "paperclip", spec("sh", ["-c", "sha256sum | cut -d' ' -f1"], { stdin }), fast);
    assert.equal(got.exitCode, 0);
    assert.equal(got.stdout.trim(), want);
    const start = env.sandbox.startRequests.at(-1);
    assert.equal(start?.stdinBytes, Buffer.byteLength(stdin));
  });

  it("returns 16 MiB of stdout complete, streamed live in order", async () => {
    const size = 16 << 20;
    let streamed = 0;
    let streamedHash = createHash("sha256");
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", `yes 0123456789abcdef | head -c ${size}`]), {
      ...fast,
      onOutput: (stream, text) => {
        assert.equal(stream, "stdout");
        streamed += text.length;
        streamedHash = streamedHash.update(text);
      },
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout.length, size);
    assert.equal(r.stdout, "0123456789abcdef\n".repeat(Math.ceil(size / 17)).slice(0, size));
    assert.equal(streamed, size);
    assert.equal(streamedHash.digest("hex"), createHash("sha256").update(r.stdout).digest("hex"));
    assert.equal(r.metadata.truncated, undefined);
  });

  it("caps the kept output and says truncated", async () => {
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", "head -c 100000 /dev/zero"]), { ...fast, maxOutputBytes: 1000 });
    assert.equal(r.stdout.length, 1000);
    assert.equal(r.metadata.truncated, true);
  });

  it("resumes through another replica when one dies mid-stream, without gap or duplicate", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    const dying = new FakeExecReplica(env.nc, env.sandbox, "ew-dying", { dieAfterChunks: 3 });
    env.replicas.push(dying);
    await env.nc.flush();
    const logs: string[] = [];
    const run = runExec(env.nc, "paperclip", spec("sh", ["-c", "for i in $(seq 1 12); do echo line $i; sleep 0.1; done"]), {
      ...fast,
      onOutput: (_s, text) => logs.push(text),
    });
    // The survivor joins the queue group before the first one dies.
    const survivor = new FakeExecReplica(env.nc, env.sandbox, "ew-survivor");
    env.replicas.push(survivor);
    await env.nc.flush();
    const r = await run;
    const want = Array.from({ length: 12 }, (_, i) => `line ${i + 1}\n`).join("");
    assert.equal(r.stdout, want);
    assert.equal(logs.join(""), want);
    assert.equal(r.exitCode, 0);
    assert.equal(dying.alive, false);
    assert.ok((r.metadata.attaches ?? 0) >= 1);
    assert.ok(survivor.sentChunks > 0);
  });

  it("attaches on a seq gap and fills it", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-lossy", { dropSeq: 2 }));
    await env.nc.flush();
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", "for i in 1 2 3 4 5; do echo $i; sleep 0.1; done"]), fast);
    assert.equal(r.stdout, "1\n2\n3\n4\n5\n");
    assert.ok((r.metadata.attaches ?? 0) >= 1);
  });

  it("resends stdin from the offset a new replica reports", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    const dying = new FakeExecReplica(env.nc, env.sandbox, "ew-dying", { dieAfterChunks: 1 });
    env.replicas.push(dying);
    await env.nc.flush();
    const stdin = "x".repeat(3 << 20);
    const run = runExec(env.nc, "paperclip", spec("sh", ["-c", "echo started; wc -c"], { stdin }), fast);
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-b"));
    await env.nc.flush();
    const r = await run;
    assert.equal(r.stdout, `started\n${3 << 20}\n`);
  });

  it("attaches again when a stdin chunk gets no answer, and resends it", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-stuck", { ignoreFirstStdin: true }));
    await env.nc.flush();
    const r = await runExec(env.nc, "paperclip", spec("wc", ["-c"], { stdin: "y".repeat(700_000) }), { ...fast, stdinTimeoutMs: 300 });
    assert.equal(r.stdout.trim(), "700000");
    assert.ok((r.metadata.attaches ?? 0) >= 1);
  });

  it("kills the command when aborted", async () => {
    const ac = new AbortController();
    setTimeout(() => {
      ac.abort();
    }, 300);
    const t0 = Date.now();
    const r = await runExec(env.nc, "paperclip", spec("sleep", ["30"]), { ...fast, signal: ac.signal });
    assert.equal(r.metadata.cancelled, true);
    assert.equal(r.exitCode, null);
    assert.equal(r.signal, "SIGKILL");
    assert.ok(Date.now() - t0 < 5_000);
  });

  it("throws kubeclip's error frame as <code>: <message>", async () => {
    await assert.rejects(runExec(env.nc, "paperclip", spec("true", [], { providerLeaseId: "pc-other" }), fast), (err: unknown) => {
      assert.ok(err instanceof KubeclipError);
      assert.equal(err.code, "lease_mismatch");
      assert.equal(err.message, "lease_mismatch: providerLeaseId pc-other is not the run's lease");
      assert.equal(err.field, "providerLeaseId");
      return true;
    });
  });

  it("gives up when no exec-worker answers", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    await env.nc.flush();
    await assert.rejects(runExec(env.nc, "paperclip", spec("true", [], { timeoutMs: 60_000 }), { ...fast, noResponderMs: 1_000 }), {
      message: /^unavailable: no kubeclip exec-worker answers paperclip\.exec\..*\.start$/,
    });
  });
});
