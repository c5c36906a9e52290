import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, afterEach, before, beforeEach, describe, it } from "node:test";
import { headers as natsHeaders, type Msg } from "@nats-io/transport-node";
import { KubeclipError } from "./errors.js";
import { KILL_WAIT_MS, Output, newExecId, runExec, splitText, type ExecSpec, type Stream } from "./exec.js";
import { FakeExecReplica } from "../test/support/fake-exec.js";
import { startEnv, type Env } from "../test/support/harness.js";
import { execSchemaNames, schemaErrors } from "../test/support/schemas.js";

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

async function* chunks(parts: readonly Uint8Array[]): AsyncGenerator<Uint8Array> {
  for (const p of parts) {
    await Promise.resolve();
    yield p;
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
  afterEach(() => {
    // The fake checks every request against docs/schemas and every io message against the
    // protocol: nothing the plugin sent may have broken them.
    assert.deepEqual(env.sandbox.invalid.splice(0), []);
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

  it("writes kubeclip's notice (recording stopped, and why) into the live log, not the result", async () => {
    const message = "output recording stopped because company acme's recorded-output budget per company of 1024 bytes per day was reached";
    for (const r of env.replicas.splice(0)) r.die();
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-n", { notice: { reason: "recordingStopped", message } }));
    await env.nc.flush();
    const logs: { stream: Stream; text: string }[] = [];
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", "echo out"], { record: true }), {
      ...fast,
      onOutput: (stream, text) => logs.push({ stream, text }),
    });
    assert.equal(r.exitCode, 0);
    assert.deepEqual(logs.filter((l) => l.text.includes("[kubeclip:")), [{ stream: "stderr", text: `\n[kubeclip: ${message}]\n` }]);
    assert.equal(r.stdout, "out\n");
    assert.equal(r.stderr, "");
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
      // The command's 300 ms, the 300 ms grace, then SIGKILL and a brief wait for the exit.
      assert.ok(Date.now() - t0 < 300 + 300 + KILL_WAIT_MS + 1_000);
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
      holdBytes: size,
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

  it("holds the head and the tail of each stream, says what it dropped, and says truncated", async () => {
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", "head -c 100000 /dev/zero; head -c 5000 /dev/zero >&2"]), { ...fast, holdBytes: 1000 });
    const marker = "\n[kubeclip: 99000 bytes of output truncated here: the plugin holds at most 1000 bytes per stream (settings.maxExecuteOutputBytes)]\n";
    assert.equal(r.stdout, "\0".repeat(250) + marker + "\0".repeat(750));
    assert.equal(r.stderr, "\0".repeat(250) + marker.replace("99000", "4000") + "\0".repeat(750));
    assert.equal(r.metadata.truncated, true);
    assert.equal(env.sandbox.startRequests.at(-1)?.maxOutputBytes, 64 << 20, "kubeclip still sends up to the protocol's cap");
  });

  it("keeps the latest bytes however the chunks fall", () => {
    for (const sizes of [[1], [7], [13, 1, 250], [400], [3, 997, 2]]) {
      const o = new Output(40); // head 10, tail 30
      let all = "";
      let i = 0;
      for (let round = 0; round < 100; round++) {
        for (const n of sizes) {
          const piece = Array.from({ length: n }, () => String.fromCharCode(97 + (i++ % 26))).join("");
          all += piece;
          o.add(new TextEncoder().encode(piece));
        }
      }
      const text = o.text();
      // No line breaks: the head and tail are cut nowhere else.
      assert.equal(text.slice(0, 10), all.slice(0, 10), String(sizes));
      assert.equal(text.slice(-30), all.slice(-30), String(sizes));
      assert.equal(o.dropped, all.length - 40, String(sizes));
    }
  });

  it("keeps whole lines at the cuts", () => {
    const o = new Output(100);
    for (let i = 0; i < 50; i++) o.add(new TextEncoder().encode(`line ${String(i).padStart(3, "0")}\n`));
    const lines = o.text().split("\n");
    assert.equal(lines[0], "line 000");
    assert.match(lines.find((l) => l.startsWith("[kubeclip")) ?? "", /^\[kubeclip: \d+ bytes of output truncated here/);
    assert.equal(lines.at(-2), "line 049");
    for (const l of lines) assert.ok(l === "" || /^line \d{3}$/.test(l) || l.startsWith("[kubeclip"), l);
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

  it("streams stdin of unknown length (-1) from a source, holding only the unconfirmed chunk", async () => {
    const piece = Buffer.alloc(100_003, 0x61);
    // ~3 MB in pieces that do not line up with the 512 KiB stdin chunks
    const r = await runExec(env.nc, "paperclip", spec("sha256sum", [], { stdinStream: chunks(Array.from({ length: 30 }, () => piece)) }), fast);
    assert.equal(r.exitCode, 0);
    const want = createHash("sha256").update(Buffer.concat(Array.from({ length: 30 }, () => piece))).digest("hex");
    assert.equal(r.stdout.split(" ")[0], want);
    assert.equal(env.sandbox.startRequests.at(-1)?.stdinBytes, -1);
  });

  it("resends a streamed stdin chunk after an attach", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-stuck", { ignoreFirstStdin: true }));
    await env.nc.flush();
    const source = chunks([Buffer.alloc(700_000, 0x79), Buffer.alloc(5, 0x79)]);
    const r = await runExec(env.nc, "paperclip", spec("wc", ["-c"], { stdinStream: source }), { ...fast, stdinTimeoutMs: 300 });
    assert.equal(r.stdout.trim(), "700005");
    assert.ok((r.metadata.attaches ?? 0) >= 1);
  });

  it("an empty stdin stream is an eof", async () => {
    const r = await runExec(env.nc, "paperclip", spec("wc", ["-c"], { stdinStream: chunks([]) }), fast);
    assert.equal(r.stdout.trim(), "0");
  });

  it("hands stdout to a sink in order instead of holding it", async () => {
    const hash = createHash("sha256");
    let n = 0;
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", "head -c 5000000 /dev/urandom | tee /dev/stderr | cat; echo done >&2"]), {
      ...fast,
      stdoutSink: async (data) => {
        hash.update(data);
        n += data.byteLength;
        await new Promise((res) => setImmediate(res));
      },
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "");
    assert.equal(n, 5_000_000);
    assert.ok(r.stderr.endsWith("done\n"));
  });

  it("kills the command and throws when the sink throws", async () => {
    const t0 = Date.now();
    await assert.rejects(
      runExec(env.nc, "paperclip", spec("sh", ["-c", "yes | head -c 100000000; sleep 30"]), {
        ...fast,
        stdoutSink: () => Promise.reject(new Error("refused: bad entry")),
      }),
      /refused: bad entry/,
    );
    assert.ok(Date.now() - t0 < 10_000);
    await eventually(() => [...env.sandbox.execs.values()].every((j) => j.exit !== undefined), "the command killed");
  });

  it("kills the command and throws when the stdin source throws", async () => {
    async function* failing(): AsyncGenerator<Uint8Array> {
      yield Buffer.from("some");
      await new Promise((res) => setTimeout(res, 50));
      throw new Error("host file vanished");
    }
    await assert.rejects(runExec(env.nc, "paperclip", spec("sh", ["-c", "cat >/dev/null; sleep 30"], { stdinStream: failing() }), fast), /host file vanished/);
    await eventually(() => [...env.sandbox.execs.values()].every((j) => j.exit !== undefined), "the command killed");
  });

  it("kills the command when aborted", async () => {
    const ac = new AbortController();
    setTimeout(() => {
      ac.abort();
    }, 300);
    const t0 = Date.now();
    const closedBefore = env.sandbox.closed;
    const r = await runExec(env.nc, "paperclip", spec("sleep", ["30"]), { ...fast, signal: ac.signal });
    assert.equal(r.metadata.cancelled, true);
    assert.equal(r.exitCode, null);
    assert.equal(r.signal, "SIGKILL");
    assert.ok(Date.now() - t0 < 5_000);
    // The signal was answered by `signaled` (not an error ending the stream): the exit still
    // came, so the client closed the exec.
    assert.deepEqual(env.sandbox.signals.at(-1), { execId: r.metadata.execId, signal: "SIGKILL", delivered: true });
    assert.equal(r.metadata.clientTimeout, undefined);
    await eventually(() => env.sandbox.closed === closedBefore + 1, "the exit arrived and the client closed the exec");
  });

  it("stops sending stdin once kubeclip says closed (the command stopped reading)", async () => {
    const stdin = "z".repeat(16 << 20); // 32 chunks
    const r = await runExec(env.nc, "paperclip", spec("head", ["-c", "10"], { stdin }), fast);
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "z".repeat(10));
    // The first chunk does not fit the pipe of a command that reads 10 bytes: its write fails,
    // the answer says closed, and the client sends nothing more.
    assert.deepEqual(env.sandbox.stdinMessages.get(r.metadata.execId), { received: 1, closedReplies: 1 });
  });

  it("retries `unavailable` with the same exec id", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    const busy = new FakeExecReplica(env.nc, env.sandbox, "ew-busy", { unavailableFirst: 2 });
    env.replicas.push(busy);
    await env.nc.flush();
    const before = env.sandbox.startRequests.length;
    const r = await runExec(env.nc, "paperclip", spec("echo", ["served"]), { ...fast, retryMs: 100 });
    assert.equal(r.stdout, "served\n");
    assert.equal(busy.unavailableSent, 2);
    const starts = env.sandbox.startRequests.slice(before);
    assert.deepEqual(
      starts.map((s) => s.execId),
      [r.metadata.execId],
      "only the third start reached the sandbox, with the same exec id",
    );
  });

  it("gives up after unavailableMs of `unavailable`", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-full", { unavailableFirst: 1_000 }));
    await env.nc.flush();
    await assert.rejects(runExec(env.nc, "paperclip", spec("true", []), { ...fast, retryMs: 100, unavailableMs: 800 }), {
      name: "KubeclipError",
      message: /^unavailable: the exec-worker serves its maximum of streams/,
    });
  });

  it("attaches when a heartbeat names a seq it lacks", async () => {
    for (const r of env.replicas.splice(0)) r.die();
    env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-lossy", { dropSeq: 1 }));
    await env.nc.flush();
    const t0 = Date.now();
    const seen: { text: string; at: number }[] = [];
    // No silence resume: only the heartbeat (after 1 s) can reveal the lost chunk before "b".
    const r = await runExec(env.nc, "paperclip", spec("sh", ["-c", "echo a; sleep 2.5; echo b"]), {
      silenceMs: 60_000,
      graceMs: 2_000,
      onOutput: (_s, text) => seen.push({ text, at: Date.now() - t0 }),
    });
    assert.equal(r.stdout, "a\nb\n");
    assert.deepEqual(seen.map((x) => x.text), ["a\n", "b\n"]);
    assert.ok((seen[0]?.at ?? Infinity) < 2_400, `"a" arrived after ${seen[0]?.at} ms, want before "b" is printed`);
    assert.ok((r.metadata.attaches ?? 0) >= 1);
  });

  it("sends only messages that match docs/schemas and the io rules", async () => {
    assert.deepEqual(execSchemaNames(), [
      "exec-attach",
      "exec-error",
      "exec-exit",
      "exec-notice",
      "exec-resize-reply",
      "exec-signal",
      "exec-signaled",
      "exec-start",
      "exec-started",
      "exec-stdin-reply",
    ]);
    const sent: Msg[] = [];
    const spy = env.nc.subscribe("paperclip.exec.>", {
      callback: (_e, m) => {
        sent.push(m);
      },
    });
    await env.nc.flush();
    try {
      // A start with stdin, an attach after a replica dies mid-stream, a signal.
      for (const r of env.replicas.splice(0)) r.die();
      env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-dying", { dieAfterChunks: 2 }));
      await env.nc.flush();
      const run = runExec(env.nc, "paperclip", spec("sh", ["-c", "cat >/dev/null; for i in 1 2 3 4; do echo $i; sleep 0.1; done"], { stdin: "x".repeat(600_000), env: { A: "1" }, cwd: "/tmp" }), fast);
      env.replicas.push(new FakeExecReplica(env.nc, env.sandbox, "ew-b"));
      await env.nc.flush();
      assert.equal((await run).stdout, "1\n2\n3\n4\n");
      const ac = new AbortController();
      setTimeout(() => {
        ac.abort();
      }, 200);
      await runExec(env.nc, "paperclip", spec("sleep", ["30"]), { ...fast, signal: ac.signal });
      await env.nc.flush();
    } finally {
      spy.unsubscribe();
    }
    const kinds = new Map<string, number>();
    for (const m of sent) {
      const op = m.subject.split(".")[4] ?? "";
      if (op === "start" || op === "attach" || op === "signal") {
        const body: unknown = JSON.parse(new TextDecoder().decode(m.data));
        assert.equal(schemaErrors(`exec-${op}`, body), undefined, `${op} ${JSON.stringify(body).slice(0, 200)}`);
        assert.ok(m.reply?.startsWith("_INBOX_paperclip."), `${op} has the client's inbox as reply subject`);
        kinds.set(op, (kinds.get(op) ?? 0) + 1);
        continue;
      }
      assert.equal(op, "io", m.subject);
      assert.match(m.subject, /^paperclip\.exec\.[^.]+\.[^.]+\.io\.[0-9A-Z]{26}\.[0-9a-f]+$/, "io goes to a started.ioSubject");
      const h = m.headers ?? natsHeaders();
      const kind = h.get("Kubeclip-Exec");
      kinds.set(kind, (kinds.get(kind) ?? 0) + 1);
      switch (kind) {
        case "stdin":
          assert.match(h.get("Kubeclip-Exec-Offset"), /^\d+$/);
          assert.ok(["", "1"].includes(h.get("Kubeclip-Exec-Eof")));
          assert.ok(m.data.byteLength <= 512 << 10);
          assert.ok(m.reply, "stdin is a request");
          break;
        case "ack":
        case "close":
          assert.match(h.get("Kubeclip-Exec-Seq"), /^\d+$/);
          break;
        default:
          assert.fail(`io message of kind ${kind}`);
      }
    }
    for (const k of ["start", "attach", "signal", "stdin", "close"]) assert.ok((kinds.get(k) ?? 0) > 0, `no ${k} sent: ${JSON.stringify([...kinds])}`);
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
