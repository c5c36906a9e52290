// A fake kubeclip exec service speaking docs/exec.md "NATS protocol", for the plugin's tests.
//
// FakeSandbox plays sandboxd: it runs commands with child_process and journals their output by
// seq; the journal outlives any replica. FakeExecReplica plays one exec-worker replica in the
// queue group "kubeclip-exec": it serves start/attach/signal, stdin, acks and close, and streams
// the journal to the client's inbox. A replica can be told to die after N chunks (it stops
// answering anything, like a crashed process) or to skip a seq (a lost message).

import { spawn, type ChildProcess } from "node:child_process";
import { headers, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { isObject, type JsonObject } from "../../src/json.js";

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
  error: string;
}

export class Journal {
  readonly chunks: Chunk[] = [];
  exit: ExitFrame | undefined;
  stdinOffset = 0;
  readonly spec: JsonObject;
  readonly child: ChildProcess;
  private readonly waiters = new Set<() => void>();
  private stdoutBytes = 0;
  private stderrBytes = 0;
  private timedOut = false;

  constructor(spec: JsonObject) {
    this.spec = spec;
    const env: Record<string, string> = { ...(process.env as Record<string, string>) };
    if (isObject(spec.env)) for (const [k, v] of Object.entries(spec.env)) env[k] = String(v);
    const args = Array.isArray(spec.args) ? spec.args.map(String) : [];
    this.child = spawn(String(spec.command), args, {
      cwd: typeof spec.cwd === "string" && spec.cwd !== "" ? spec.cwd : undefined,
      env,
      detached: true,
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.child.stdin?.on("error", () => undefined);
    if (Number(spec.stdinBytes ?? 0) === 0) this.child.stdin?.end();
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
    this.child.on("close", (code, signal) => {
      clearTimeout(timer);
      this.finish(code, signal, "");
    });
  }

  private finish(code: number | null, signal: NodeJS.Signals | null, error: string): void {
    if (this.exit) return;
    this.exit = {
      exitCode: this.timedOut || signal ? null : code,
      signal: signal ?? null,
      timedOut: this.timedOut,
      stdoutBytes: this.stdoutBytes,
      stderrBytes: this.stderrBytes,
      truncated: false,
      lastSeq: this.chunks.length,
      error,
    };
    this.notify();
  }

  kill(signal: NodeJS.Signals): void {
    if (this.child.pid === undefined || this.exit) return;
    try {
      process.kill(-this.child.pid, signal);
    } catch {
      // already gone
    }
  }

  writeStdin(offset: number, data: Uint8Array, eof: boolean): number {
    if (offset === this.stdinOffset) {
      this.stdinOffset += data.byteLength;
      this.child.stdin?.write(data);
      if (eof) this.child.stdin?.end();
    }
    return this.stdinOffset;
  }

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

/** sandboxd and the lease records: shared by every replica. */
export class FakeSandbox {
  readonly execs = new Map<string, Journal>();
  /** `<companyId>/<runId>` → providerLeaseId of exec-capable leases. */
  readonly leases = new Map<string, string>();
  readonly startRequests: JsonObject[] = [];
  closed = 0;

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
}

export class FakeExecReplica {
  readonly name: string;
  alive = true;
  sentChunks = 0;
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
    const body: unknown = JSON.parse(new TextDecoder().decode(m.data));
    const reply = m.reply;
    if (!isObject(body) || !reply) return;
    const execId = String(body.execId);
    const fail = (code: string, message: string, field?: string): void => {
      this.send(reply, "error", JSON.stringify({ code, message, ...(field ? { field } : {}) }));
    };
    const lease = this.sandbox.leases.get(`${companyId}/${runId}`);
    if (lease === undefined) {
      fail("lease_not_found", `no lease for run ${runId} of company ${companyId}`);
      return;
    }
    if (body.providerLeaseId !== lease) {
      fail("lease_mismatch", `providerLeaseId ${String(body.providerLeaseId)} is not the run's lease`, "providerLeaseId");
      return;
    }
    const ioSubject = `${t.slice(0, 4).join(".")}.io.${execId}`;
    let journal = this.sandbox.execs.get(execId);
    if (op === "signal") {
      journal?.kill(String(body.signal) as NodeJS.Signals);
      return;
    }
    let from = 1;
    if (op === "start") {
      if (!journal) {
        this.sandbox.startRequests.push(body);
        journal = new Journal(body);
        this.sandbox.execs.set(execId, journal);
      }
    } else {
      if (!journal) {
        fail("exec_not_found", `no exec ${execId}`, "execId");
        return;
      }
      from = Number(body.fromSeq ?? 1);
    }
    this.serveIO(ioSubject, execId, journal);
    this.send(reply, "started", JSON.stringify({ execId, replica: this.name, ioSubject, stdinOffset: journal.stdinOffset }));
    void this.stream(reply, execId, journal, from);
  }

  private serveIO(ioSubject: string, execId: string, journal: Journal): void {
    const sub = this.nc.subscribe(ioSubject, {
      callback: (_e, m) => {
        if (!this.alive) return;
        const kind = m.headers?.get("Kubeclip-Exec");
        if (kind === "stdin") {
          if (this.opts.ignoreFirstStdin && !this.ignoredStdin) {
            this.ignoredStdin = true;
            return;
          }
          const offset = Number(m.headers?.get("Kubeclip-Exec-Offset"));
          const eof = m.headers?.get("Kubeclip-Exec-Eof") === "1";
          m.respond(JSON.stringify({ offset: journal.writeStdin(offset, m.data, eof) }));
        } else if (kind === "ack") {
          this.acked.set(execId, Math.max(this.acked.get(execId) ?? 0, Number(m.headers?.get("Kubeclip-Exec-Seq"))));
        } else if (kind === "close") {
          this.sandbox.execs.delete(execId);
          this.sandbox.closed++;
          sub.unsubscribe();
        }
      },
    });
    this.subs.push(sub);
  }

  private async stream(reply: string, execId: string, journal: Journal, from: number): Promise<void> {
    let pos = from;
    let lastSent = Date.now();
    while (this.alive) {
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
          lastSent = Date.now();
          if (this.opts.dieAfterChunks !== undefined && this.sentChunks >= this.opts.dieAfterChunks) {
            this.die();
            return;
          }
        }
        pos++;
        continue;
      }
      if (journal.exit && pos > journal.exit.lastSeq) {
        this.send(reply, "exit", JSON.stringify(journal.exit));
        return;
      }
      if (Date.now() - lastSent >= 1_000) {
        this.send(reply, "heartbeat", "");
        lastSent = Date.now();
      }
      await journal.changed(250);
    }
  }
}
