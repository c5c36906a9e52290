// A fake kubeclip exec service speaking docs/exec.md "NATS protocol", for the plugin's tests.
// (The real exec-worker serves the plugin in tests/paperclip, the end-to-end suite.)
//
// FakeSandbox plays sandboxd and the lease records: it runs commands with child_process and
// journals their output by seq; the journal outlives any replica. FakeExecReplica plays one
// exec-worker replica in the queue group "kubeclip-exec", as pkg/execsvc does:
//   - requests are checked against docs/schemas/exec-*.json (invalid_request naming the field;
//     every refusal is kept in FakeSandbox.invalid, which the tests expect empty);
//   - every start/attach gets a session of its own: `started` names its io subject
//     `<prefix>.exec.<c>.<r>.io.<execId>.<session>`, and a newer session for the same client
//     inbox (on any replica) takes the stream over: the older one stops without a word;
//   - stdin is answered {offset, closed}: closed once eof went through or the command exited;
//   - a heartbeat after a second of silence carries the last seq sent (none before the first);
//   - signal is answered with one `signaled` and never ends the stream.
// A replica can be told to die after N chunks (it stops answering anything, like a crashed
// process), to skip a seq (a lost message), to leave the first stdin chunk unanswered, or to
// answer its first requests `unavailable`.

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { headers, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { isObject, type JsonObject } from "../../src/json.js";
import { schemaErrors, schemaField, type ExecSchema } from "./schemas.js";

interface Chunk {
  seq: number;
  stream: "stdout" | "stderr";
  data: Uint8Array;
}

interface ExitFrame {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  stdoutBytes: number;
  stderrBytes: number;
  truncated: boolean;
  lastSeq: number;
  error?: string;
}

/** Where kubeclip's pods have sandboxd (policy.SandboxdBinary). */
const SANDBOXD_PATH = "/kubeclip/bin/sandboxd";

export class Journal {
  readonly chunks: Chunk[] = [];
  exit: ExitFrame | undefined;
  stdinOffset = 0;
  stdinClosed: boolean;
  readonly spec: JsonObject;
  readonly child: ChildProcess;
  private readonly waiters = new Set<() => void>();
  private stdoutBytes = 0;
  private stderrBytes = 0;
  private timedOut = false;

  /** sandboxd: what runs for /kubeclip/bin/sandboxd, the command or any argument (native sync). */
  constructor(spec: JsonObject, sandboxd?: string) {
    this.spec = spec;
    const env: Record<string, string> = { ...(process.env as Record<string, string>) };
    if (isObject(spec.env)) for (const [k, v] of Object.entries(spec.env)) env[k] = String(v);
    const swap = (a: string): string => (sandboxd && a === SANDBOXD_PATH ? sandboxd : a);
    const args = Array.isArray(spec.args) ? spec.args.map((a) => swap(String(a))) : [];
    this.child = spawn(swap(String(spec.command)), args, {
      cwd: typeof spec.cwd === "string" && spec.cwd !== "" ? spec.cwd : undefined,
      env,
      detached: true,
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.child.stdin?.on("error", () => undefined);
    // stdinBytes 0 or absent: /dev/null; > 0 or -1 (unknown length): a pipe until eof.
    this.stdinClosed = Number(spec.stdinBytes ?? 0) === 0;
    if (this.stdinClosed) this.child.stdin?.end();
    const add = (stream: "stdout" | "stderr") => (b: Buffer) => {
      if (stream === "stdout") this.stdoutBytes += b.byteLength;
      else this.stderrBytes += b.byteLength;
      this.chunks.push({ seq: this.chunks.length + 1, stream, data: new Uint8Array(b) });
      this.notify();
    };
    this.child.stdout?.on("data", add("stdout"));
    this.child.stderr?.on("data", add("stderr"));
    const timeoutMs = Number(spec.timeoutMs ?? 0);
    const timer =
      timeoutMs > 0
        ? setTimeout(() => {
            this.timedOut = true;
            this.kill("SIGKILL");
          }, timeoutMs)
        : undefined;
    this.child.on("error", (err) => {
      clearTimeout(timer);
      this.finish(127, null, err.message);
    });
    // sandboxd takes no more stdin once the command exited (its output may still be draining).
    this.child.on("exit", () => {
      this.stdinClosed = true;
      this.child.stdin?.destroy();
    });
    this.child.on("close", (code, signal) => {
      clearTimeout(timer);
      this.finish(code, signal, "");
    });
  }

  private finish(code: number | null, signal: NodeJS.Signals | null, error: string): void {
    if (this.exit) return;
    this.stdinClosed = true;
    this.exit = {
      exitCode: this.timedOut || signal ? null : code,
      signal: this.timedOut ? "SIGKILL" : (signal ?? null),
      timedOut: this.timedOut,
      stdoutBytes: this.stdoutBytes,
      stderrBytes: this.stderrBytes,
      truncated: false,
      lastSeq: this.chunks.length,
      ...(error ? { error } : {}),
    };
    this.notify();
  }

  /** Signals the process group; false when it is gone. */
  kill(signal: NodeJS.Signals): boolean {
    if (this.child.pid === undefined || this.exit) return false;
    try {
      process.kill(-this.child.pid, signal);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * sandboxd's stdin endpoint: the offset it holds afterwards, and whether stdin is closed. Like
   * sandboxd, it answers once the bytes are in the command's pipe (the write callback), so a
   * command that stops reading (`head -c 10`) makes the write fail: closed. Writes run one at a
   * time, so a chunk sent again meanwhile finds the offset moved on.
   */
  async writeStdin(offset: number, data: Uint8Array, eof: boolean): Promise<{ offset: number; closed: boolean }> {
    const write = async (): Promise<{ offset: number; closed: boolean }> => {
      if (this.stdinClosed) return { offset: this.stdinOffset, closed: true };
      if (offset !== this.stdinOffset) return { offset: this.stdinOffset, closed: false };
      const stdin = this.child.stdin;
      const ok = await new Promise<boolean>((resolve) => {
        if (!stdin || stdin.destroyed) {
          resolve(false);
          return;
        }
        stdin.write(data, (err) => {
          resolve(!err);
        });
      });
      if (!ok) {
        this.stdinClosed = true;
        return { offset: this.stdinOffset, closed: true };
      }
      this.stdinOffset += data.byteLength;
      if (eof) {
        stdin?.end();
        this.stdinClosed = true;
      }
      // An eof that went through is answered like any write: the client sees its offset.
      return { offset: this.stdinOffset, closed: false };
    };
    const result = this.stdinChain.then(write);
    this.stdinChain = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }
  private stdinChain: Promise<void> = Promise.resolve();

  /** Resolves on new output or exit, or after ms. */
  async changed(ms: number): Promise<void> {
    await new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(t);
        this.waiters.delete(done);
        resolve();
      };
      const t = setTimeout(done, ms);
      this.waiters.add(done);
    });
  }

  private notify(): void {
    for (const w of [...this.waiters]) w();
  }
}

/** A request the fake refused as invalid: what the plugin sent wrong. */
export interface Invalid {
  schema: ExecSchema | "io";
  errors: string;
}

/** sandboxd and the lease records: shared by every replica. */
export class FakeSandbox {
  readonly execs = new Map<string, Journal>();
  /** `<companyId>/<runId>` → providerLeaseId of exec-capable leases. */
  readonly leases = new Map<string, string>();
  readonly startRequests: JsonObject[] = [];
  readonly attachRequests: JsonObject[] = [];
  readonly signals: { execId: string; signal: string; delivered: boolean }[] = [];
  /** Per exec id: stdin messages received, and how many of them were answered closed. */
  readonly stdinMessages = new Map<string, { received: number; closedReplies: number }>();
  /** Requests and io messages that broke the protocol (the tests expect none). */
  readonly invalid: Invalid[] = [];
  /** Client inbox → the session serving it (the takeover rule: one stream per inbox). */
  readonly sessionOf = new Map<string, string>();
  closed = 0;
  /** The sandboxd binary that stands in for /kubeclip/bin/sandboxd (native sync tests). */
  sandboxd: string | undefined;

  addLease(companyId: string, runId: string, providerLeaseId: string): void {
    this.leases.set(`${companyId}/${runId}`, providerLeaseId);
  }

  killAll(): void {
    for (const j of this.execs.values()) j.kill("SIGKILL");
  }
}

export interface ReplicaOptions {
  prefix?: string;
  /** Die (stop answering everything) after sending this many out frames. */
  dieAfterChunks?: number;
  /** Never send this seq on the first pass (a lost message). */
  dropSeq?: number;
  /** Leave the first stdin chunk unanswered and unwritten (a stuck replica). */
  ignoreFirstStdin?: boolean;
  /** Answer this many start/attach requests `unavailable` first (a replica at capacity). */
  unavailableFirst?: number;
  /** Send this notice (exec-notice.json's reason and message) right after `started`. */
  notice?: { reason: string; message: string };
}

export class FakeExecReplica {
  readonly name: string;
  alive = true;
  sentChunks = 0;
  unavailableSent = 0;
  private readonly nc: NatsConnection;
  private readonly sandbox: FakeSandbox;
  private readonly opts: ReplicaOptions;
  private readonly subs: Subscription[] = [];
  private readonly acked = new Map<string, number>();
  private dropped = false;
  private ignoredStdin = false;

  constructor(nc: NatsConnection, sandbox: FakeSandbox, name: string, opts: ReplicaOptions = {}) {
    this.nc = nc;
    this.sandbox = sandbox;
    this.name = name;
    this.opts = opts;
    const prefix = opts.prefix ?? "paperclip";
    for (const op of ["start", "attach", "signal"] as const) {
      this.subs.push(
        nc.subscribe(`${prefix}.exec.*.*.${op}`, {
          queue: "kubeclip-exec",
          callback: (_e, m) => {
            if (this.alive) this.handle(op, m);
          },
        }),
      );
    }
  }

  async ready(): Promise<void> {
    await this.nc.flush();
  }

  die(): void {
    this.alive = false;
    for (const s of this.subs) s.unsubscribe();
  }

  private send(reply: string, kind: string, body: Uint8Array | string, extra: Record<string, string> = {}): void {
    if (!this.alive) return;
    const h = headers();
    h.set("Kubeclip-Exec", kind);
    for (const [k, v] of Object.entries(extra)) h.set(k, v);
    this.nc.publish(reply, body, { headers: h });
  }

  private handle(op: "start" | "attach" | "signal", m: Msg): void {
    const t = m.subject.split(".");
    const companyId = t[2] ?? "";
    const runId = t[3] ?? "";
    const reply = m.reply;
    if (!reply) return;
    const fail = (code: string, message: string, field?: string): void => {
      this.send(reply, op === "signal" ? "signaled" : "error", JSON.stringify(op === "signal" ? { execId: "", delivered: false, code, message } : { code, message, ...(field ? { field } : {}) }));
    };
    let body: unknown;
    try {
      body = JSON.parse(new TextDecoder().decode(m.data));
    } catch {
      this.sandbox.invalid.push({ schema: `exec-${op}`, errors: "not JSON" });
      fail("invalid_request", "the request is not JSON");
      return;
    }
    const schema: ExecSchema = `exec-${op}`;
    const bad = schemaErrors(schema, body);
    if (bad !== undefined || !isObject(body)) {
      this.sandbox.invalid.push({ schema, errors: bad ?? "not an object" });
      fail("invalid_request", bad ?? "not an object", schemaField(schema, body));
      return;
    }
    const execId = String(body.execId);
    const lease = this.sandbox.leases.get(`${companyId}/${runId}`);
    if (lease === undefined) {
      fail("lease_not_found", `no lease for run ${runId} of company ${companyId}`);
      return;
    }
    if (body.providerLeaseId !== lease) {
      fail("lease_mismatch", `providerLeaseId ${String(body.providerLeaseId)} is not the run's lease`, "providerLeaseId");
      return;
    }
    let journal = this.sandbox.execs.get(execId);
    if (op === "signal") {
      const delivered = journal?.kill(String(body.signal) as NodeJS.Signals) ?? false;
      this.sandbox.signals.push({ execId, signal: String(body.signal), delivered });
      this.send(reply, "signaled", JSON.stringify(delivered ? { execId, delivered } : { execId, delivered, code: "exited", message: "the command and its process group are gone" }));
      return;
    }
    if (this.unavailableSent < (this.opts.unavailableFirst ?? 0)) {
      this.unavailableSent++;
      fail("unavailable", "the exec-worker serves its maximum of streams; try again");
      return;
    }
    let from = 1;
    if (op === "start") {
      this.sandbox.startRequests.push(body);
      if (!journal) {
        journal = new Journal(body, this.sandbox.sandboxd);
        this.sandbox.execs.set(execId, journal);
      } else if (JSON.stringify(journal.spec) !== JSON.stringify(body)) {
        fail("invalid_request", `exec ${execId} exists with another spec`, "execId");
        return;
      }
    } else {
      this.sandbox.attachRequests.push(body);
      if (!journal) {
        fail("exec_not_found", `no exec ${execId}`, "execId");
        return;
      }
      from = Number(body.fromSeq);
      if (from > journal.chunks.length + 1) {
        fail("invalid_request", `fromSeq ${from} is beyond the journal`, "fromSeq");
        return;
      }
    }
    const session = randomBytes(8).toString("hex");
    const ioSubject = `${t.slice(0, 4).join(".")}.io.${execId}.${session}`;
    // The takeover: from now on this session serves the inbox; an older one stops.
    this.sandbox.sessionOf.set(reply, session);
    this.serveIO(ioSubject, execId, journal, reply, session);
    const started = { execId, replica: this.name, ioSubject, stdinOffset: journal.stdinOffset, ...(journal.stdinClosed ? { stdinClosed: true } : {}) };
    const startedBad = schemaErrors("exec-started", started);
    if (startedBad) throw new Error(`the fake's own started breaks the schema: ${startedBad}`);
    this.send(reply, "started", JSON.stringify(started));
    if (this.opts.notice) {
      const notice = { execId, ...this.opts.notice };
      const noticeBad = schemaErrors("exec-notice", notice);
      if (noticeBad) throw new Error(`the fake's own notice breaks the schema: ${noticeBad}`);
      this.send(reply, "notice", JSON.stringify(notice));
    }
    void this.stream(reply, session, execId, journal, from);
  }

  private serveIO(ioSubject: string, execId: string, journal: Journal, inbox: string, session: string): void {
    const current = (): boolean => this.alive && this.sandbox.sessionOf.get(inbox) === session;
    const sub = this.nc.subscribe(ioSubject, {
      callback: (_e, m) => {
        if (!this.alive) return;
        const kind = m.headers?.get("Kubeclip-Exec");
        if (kind === "stdin") {
          if (!current()) return;
          if (this.opts.ignoreFirstStdin && !this.ignoredStdin) {
            this.ignoredStdin = true;
            return;
          }
          const offsetHeader = m.headers?.get("Kubeclip-Exec-Offset") ?? "";
          if (!/^\d+$/.test(offsetHeader) || m.data.byteLength > 512 << 10) {
            this.sandbox.invalid.push({ schema: "io", errors: `stdin with offset ${JSON.stringify(offsetHeader)} and ${m.data.byteLength} bytes` });
            return;
          }
          const eof = m.headers?.get("Kubeclip-Exec-Eof") === "1";
          const stats = this.sandbox.stdinMessages.get(execId) ?? { received: 0, closedReplies: 0 };
          stats.received++;
          this.sandbox.stdinMessages.set(execId, stats);
          void journal.writeStdin(Number(offsetHeader), m.data, eof).then((r) => {
            if (r.closed) stats.closedReplies++;
            if (this.alive) m.respond(JSON.stringify(r.closed ? r : { offset: r.offset }));
          });
        } else if (kind === "ack") {
          this.acked.set(execId, Math.max(this.acked.get(execId) ?? 0, Number(m.headers?.get("Kubeclip-Exec-Seq"))));
        } else if (kind === "close") {
          if (!journal.exit) {
            this.sandbox.invalid.push({ schema: "io", errors: `close of exec ${execId} before its exit` });
          }
          this.sandbox.execs.delete(execId);
          this.sandbox.closed++;
          sub.unsubscribe();
        } else {
          this.sandbox.invalid.push({ schema: "io", errors: `unknown io kind ${String(kind)}` });
        }
      },
    });
    this.subs.push(sub);
  }

  private async stream(reply: string, session: string, execId: string, journal: Journal, from: number): Promise<void> {
    const current = (): boolean => this.alive && this.sandbox.sessionOf.get(reply) === session;
    let pos = from;
    let lastSent = Date.now();
    let lastSeqSent = 0;
    while (current()) {
      const chunk = journal.chunks[pos - 1];
      if (chunk) {
        // At most 8 MiB unacknowledged.
        let unacked = 0;
        for (let s = (this.acked.get(execId) ?? 0) + 1; s < pos; s++) unacked += journal.chunks[s - 1]?.data.byteLength ?? 0;
        if (unacked > 8 << 20) {
          await new Promise((r) => setTimeout(r, 10));
          continue;
        }
        if (this.opts.dropSeq === chunk.seq && !this.dropped) {
          this.dropped = true;
        } else {
          this.send(reply, "out", chunk.data, { "Kubeclip-Exec-Seq": String(chunk.seq), "Kubeclip-Exec-Stream": chunk.stream });
          this.sentChunks++;
          if (this.opts.dieAfterChunks !== undefined && this.sentChunks >= this.opts.dieAfterChunks) {
            this.die();
            return;
          }
        }
        // A dropped chunk counts as sent: the heartbeat then names a seq the client lacks.
        lastSeqSent = chunk.seq;
        lastSent = Date.now();
        pos++;
        continue;
      }
      if (journal.exit && pos > journal.exit.lastSeq) {
        const exit = journal.exit;
        const bad = schemaErrors("exec-exit", exit);
        if (bad) throw new Error(`the fake's own exit breaks the schema: ${bad}`);
        this.send(reply, "exit", JSON.stringify(exit));
        return;
      }
      if (Date.now() - lastSent >= 1_000) {
        this.send(reply, "heartbeat", "", lastSeqSent > 0 ? { "Kubeclip-Exec-Seq": String(lastSeqSent) } : {});
        lastSent = Date.now();
      }
      await journal.changed(250);
    }
  }
}
