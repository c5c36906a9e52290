// The exec client of docs/exec.md "NATS protocol": runs one command in a lease's pod through
// kubeclip's exec-workers on core NATS (never JetStream: requests carry API keys and stdin).
//
//   start  → <prefix>.exec.<companyId>.<runId>.start, reply to the client's own inbox
//   inbox  ← started {ioSubject, stdinOffset, stdinClosed} | out (seq, stream, bytes) | heartbeat
//            (last seq sent) | exit | error | signaled (the answer to a signal, no part of the stream)
//   io     → on the latest started.ioSubject (this stream's own session): stdin chunks (≤ 512 KiB,
//            with offsets, answered {offset, closed}), acks, close
//
// A replica can die mid-stream: 3 s of silence, a gap in seq, or a heartbeat naming a seq the
// client lacks makes the client `attach` from the next seq it needs; any replica continues from
// sandboxd's journal, so no chunk is lost or repeated. `unavailable` is retried with the same
// execId after a pause (a repeated start is an attach, never a second run). Everything is bounded
// by the command's timeout plus a grace for the exit frame.

import { createInbox, headers, type Msg, type NatsConnection } from "@nats-io/transport-node";
import { randomBytes } from "node:crypto";
import { DEFAULT_INBOX_PREFIX } from "./config.js";
import { KubeclipError, ProtocolError, errorMessage } from "./errors.js";
import { Fields, encode, parseObject } from "./json.js";
import type { ByteBudget } from "./limiter.js";

export type Stream = "stdout" | "stderr";

export interface ExecSpec {
  companyId: string;
  runId: string;
  providerLeaseId: string;
  command: string;
  args: string[];
  cwd?: string | undefined;
  env: Record<string, string>;
  stdin?: string | undefined;
  /**
   * Stdin streamed from a source of unknown length (native sync's tar), instead of stdin: sent
   * as it is read, a chunk at a time; only the chunk sandboxd has not confirmed is held.
   */
  stdinStream?: AsyncIterable<Uint8Array> | undefined;
  /**
   * Run the command on a terminal of this size (sandboxd's pty, docs/exec.md "Terminals"). Needs
   * stdinStream (the protocol's stdinBytes -1); each piece of it is sent as soon as it is read,
   * not gathered into larger chunks (keystrokes). Output arrives as stdout only.
   */
  tty?: { rows: number; cols: number } | undefined;
  /** The command's budget; sandboxd kills it after this (> 0). */
  timeoutMs: number;
  /** Record the output in the run stream (the agent command only). */
  record: boolean;
}

export interface ExecOptions {
  /** Aborting kills the command (SIGKILL) and returns what arrived. */
  signal?: AbortSignal | undefined;
  /** Every output chunk, decoded, in order, as it arrives (≤ maxLogChars each). */
  onOutput?: ((stream: Stream, text: string) => void) | undefined;
  /**
   * Takes stdout's bytes instead of the result holding them (native sync's tar), each chunk
   * awaited in order before it is acknowledged, so a slow sink holds the stream back (the
   * protocol's window) rather than filling memory. A throw kills the command and is rethrown.
   */
  stdoutSink?: ((data: Uint8Array) => Promise<void>) | undefined;
  /** Cap on the output kubeclip sends, stdout and stderr together (default 64 MiB, the protocol's). */
  maxOutputBytes?: number;
  /** The most of each stream the client holds for the result: head and tail (default 8 MiB). */
  holdBytes?: number;
  /** The plugin's process-wide bound on held output (limiter.ts), charged per company as it grows. */
  outputBudget?: ByteBudget;
  /** Prefix of the reply inbox: the NATS user's own (default _INBOX_paperclip). */
  inboxPrefix?: string;
  /** Silence after which the client attaches again (default 3 s, the protocol's). */
  silenceMs?: number;
  /** Extra wait for the exit frame after timeoutMs (default 5 s). */
  graceMs?: number;
  /** How long one stdin chunk may wait for its answer before the client attaches again (default 10 s). */
  stdinTimeoutMs?: number;
  /** How long to retry a request nobody receives (no exec-worker) before failing (default 10 s). */
  noResponderMs?: number;
  /**
   * How long to keep retrying while every answer is `unavailable` (a replica at capacity or
   * stopping, NATS or the lease store unreachable) before failing (default 2 min).
   */
  unavailableMs?: number;
  /** Pause before a request is sent again after `unavailable` or no responders (default 1 s). */
  retryMs?: number;
  /** Largest live log chunk (Paperclip drops chunks over 1,000,000 characters). */
  maxLogChars?: number;
}

export interface ExecResult {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  stdout: string;
  stderr: string;
  metadata: {
    execId: string;
    replica?: string;
    truncated?: boolean;
    attaches?: number;
    cancelled?: boolean;
    clientTimeout?: boolean;
  };
}

export const DEFAULT_MAX_OUTPUT_BYTES = 64 << 20;
export const DEFAULT_HOLD_BYTES = 8 << 20;
export const STDIN_CHUNK_BYTES = 512 << 10;
/** Ack at least this often: below the protocol's 2 MiB, far below the 8 MiB a replica holds unacked. */
export const ACK_BYTES = 1 << 20;
export const MAX_LOG_CHARS = 1_000_000;
/** After giving up (abort, own timeout) and sending SIGKILL, how long the client still waits for the exit. */
export const KILL_WAIT_MS = 2_000;

export const H_KIND = "Kubeclip-Exec";
export const H_SEQ = "Kubeclip-Exec-Seq";
export const H_STREAM = "Kubeclip-Exec-Stream";
export const H_OFFSET = "Kubeclip-Exec-Offset";
export const H_EOF = "Kubeclip-Exec-Eof";

/** A ULID (Crockford base32, 26 characters): the client-chosen exec id. */
export function newExecId(now = Date.now()): string {
  const A = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  let t = now;
  let time = "";
  for (let i = 0; i < 10; i++) {
    time = (A[t % 32] ?? "0") + time;
    t = Math.floor(t / 32);
  }
  let rand = "";
  for (const b of randomBytes(16)) rand += A[b % 32] ?? "0";
  return time + rand;
}

/** Splits text into pieces of at most max characters, never inside a surrogate pair. */
export function splitText(text: string, max: number): string[] {
  if (text.length <= max) return [text];
  const out: string[] = [];
  let i = 0;
  while (i < text.length) {
    let end = Math.min(i + max, text.length);
    if (end < text.length) {
      const c = text.charCodeAt(end - 1);
      if (c >= 0xd800 && c <= 0xdbff) end--;
    }
    out.push(text.slice(i, end));
    i = end;
  }
  return out;
}

/** Marks an abort in the inbox so the loop wakes up. */
class AbortMarker {
  readonly aborted = true;
}

/** Asks the loop to attach again (stdin could not be delivered). */
class ResumeMarker {
  readonly resume = true;
}

/** The stdin source or the stdout sink failed: kill the command, then throw this. */
class FailMarker {
  readonly error: unknown;
  constructor(error: unknown) {
    this.error = error;
  }
}

type InboxItem = Msg | Error | AbortMarker | ResumeMarker | FailMarker;

/**
 * Stdin as chunks from an offset: a string's bytes, or a stream read on demand. A stream keeps
 * only what sandboxd has not confirmed (one chunk): a resumed stream asks again from an offset
 * inside it, never before.
 */
export class StdinFeed {
  /** The stdin length when known; -1 for a stream (the protocol's unknown length). */
  readonly length: number;
  private readonly whole: Buffer | undefined;
  private readonly it: AsyncIterator<Uint8Array> | undefined;
  private base = 0;
  private held: Buffer = Buffer.alloc(0);
  private done = false;
  private chain: Promise<unknown> = Promise.resolve();
  /** Send what has been read at once (a terminal's keystrokes) rather than fill a chunk first. */
  private readonly eager: boolean;

  constructor(src: string | AsyncIterable<Uint8Array> | undefined, eager = false) {
    this.eager = eager;
    if (typeof src === "string" || src === undefined) {
      this.whole = Buffer.from(src ?? "", "utf8");
      this.length = this.whole.byteLength;
    } else {
      this.it = src[Symbol.asyncIterator]();
      this.length = -1;
    }
  }

  /** Up to max bytes from offset, and whether they end stdin. Calls run one at a time. */
  read(offset: number, max: number): Promise<{ data: Uint8Array; eof: boolean }> {
    const next = this.chain.then(() => this.readNow(offset, max));
    this.chain = next.catch(() => undefined);
    return next;
  }

  private async readNow(offset: number, max: number): Promise<{ data: Uint8Array; eof: boolean }> {
    if (this.whole) {
      const end = Math.min(offset + max, this.whole.byteLength);
      return { data: this.whole.subarray(offset, end), eof: end === this.whole.byteLength };
    }
    if (offset < this.base) throw new Error(`stdin offset ${offset} is before the held ${this.base}: already confirmed`);
    const drop = Math.min(offset - this.base, this.held.byteLength);
    this.held = this.held.subarray(drop);
    this.base += drop;
    while (!this.done && this.held.byteLength < max && this.it && !(this.eager && this.held.byteLength > 0)) {
      const r = await this.it.next();
      if (r.done) this.done = true;
      else if (r.value.byteLength > 0) this.held = Buffer.concat([this.held, r.value]);
    }
    if (offset > this.base + this.held.byteLength) throw new Error(`stdin offset ${offset} is past the end of stdin`);
    const data = this.held.subarray(0, max);
    return { data, eof: this.done && data.byteLength === this.held.byteLength };
  }

  /**
   * Stops reading the stream (the exec ended first). An eager feed's source (a terminal's
   * input) may never yield again: it is told to end first, so a pending read settles.
   */
  async close(): Promise<void> {
    if (this.eager) await this.it?.return?.();
    await this.chain;
    await this.it?.return?.();
  }

  /** Whether every byte from offset on was sent with eof (answers for a known length only). */
  pastEnd(offset: number): boolean {
    return this.length >= 0 && offset > this.length;
  }
}

/** Messages of the inbox and timer ticks, awaited in the caller's async context. */
class Inbox {
  private readonly items: InboxItem[] = [];
  private wake: (() => void) | undefined;

  push(item: InboxItem): void {
    this.items.push(item);
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  /** The next message, or undefined after waitMs. */
  async next(waitMs: number): Promise<InboxItem | undefined> {
    const first = this.items.shift();
    if (first) return first;
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => {
        this.wake = undefined;
        resolve();
      }, Math.max(0, waitMs));
      this.wake = () => {
        clearTimeout(t);
        resolve();
      };
    });
    return this.items.shift();
  }
}

/**
 * One stream of an execute's output, held within a bound: up to `hold` bytes as they come; beyond
 * that the first quarter (the head: an agent's session line) and the latest three quarters (the
 * tail: its result line, which Paperclip's adapter parses from the returned stdout) are kept and
 * the middle is dropped, replaced in text() by one line saying how much. Cuts fall on line
 * breaks where there are any, so every line returned is whole.
 */
export class Output {
  private readonly head: Buffer[] = [];
  private headBytes = 0;
  /** The tail while it fits: chunks as they came. */
  private readonly tail: Buffer[] = [];
  private tailBytes = 0;
  /**
   * The tail once it overflowed: one buffer of the tail's size written round (no allocation per
   * chunk, so a long stream leaves no garbage behind); ringPos is where the oldest byte is.
   */
  private ring: Buffer | undefined;
  private ringPos = 0;
  /** Bytes dropped from the middle. */
  dropped = 0;
  private readonly decoder = new TextDecoder("utf-8");
  private headCap: number;
  private tailCap: number;
  private readonly budget: { bytes: ByteBudget; company: string } | undefined;
  /** Bytes taken from the budget (given back by release). */
  private charged = 0;
  /** The budget refused to let it grow: it holds less than its bound. */
  private starved = false;
  constructor(hold: number, budget?: { bytes: ByteBudget; company: string }) {
    this.headCap = Math.floor(hold / 4);
    this.tailCap = hold - this.headCap;
    this.budget = budget;
  }
  /** Takes n more bytes from the budget; false: the holding stops growing where it is. */
  private grow(n: number): boolean {
    if (!this.budget) return true;
    if (!this.budget.bytes.take(this.budget.company, n)) {
      this.starved = true;
      return false;
    }
    this.charged += n;
    return true;
  }
  /**
   * The budget refused the tail more room: it keeps what it holds, or the budget's floor past the
   * company's share while the total has room (never more than the incoming bytes can fill).
   */
  private clampTail(incoming: number): void {
    const b = this.budget;
    const floor = Math.min(this.tailCap, b?.bytes.floor ?? 0, this.tailBytes + incoming);
    if (b && this.tailBytes < floor && b.bytes.takeFloor(b.company, floor - this.tailBytes)) {
      this.charged += floor - this.tailBytes;
      this.tailCap = floor;
    } else this.tailCap = this.tailBytes;
  }
  /** Gives what it holds back to the budget (the execute ended). */
  release(): void {
    if (this.budget && this.charged > 0) this.budget.bytes.give(this.budget.company, this.charged);
    this.charged = 0;
  }
  /** Keeps data within the bound; returns it decoded for the live log. */
  add(data: Uint8Array): string {
    let rest = data;
    const room = this.headCap - this.headBytes;
    if (room > 0 && this.tailBytes === 0) {
      const keep = rest.byteLength > room ? rest.subarray(0, room) : rest;
      if (this.grow(keep.byteLength)) {
        this.head.push(Buffer.from(keep));
        this.headBytes += keep.byteLength;
        rest = rest.subarray(keep.byteLength);
      } else this.headCap = this.headBytes;
    }
    if (rest.byteLength > 0) this.addTail(rest);
    return this.decoder.decode(data, { stream: true });
  }
  private addTail(data: Uint8Array): void {
    if (!this.ring) {
      if (this.tailBytes + data.byteLength <= this.tailCap) {
        if (this.grow(data.byteLength)) {
          this.tail.push(Buffer.from(data));
          this.tailBytes += data.byteLength;
          return;
        }
        this.clampTail(data.byteLength); // the latest bytes go round in what it holds
      } else if (!this.grow(this.tailCap - this.tailBytes)) this.clampTail(data.byteLength);
      if (this.tailCap === 0) {
        this.dropped += data.byteLength;
        return;
      }
      const all = Buffer.concat([...this.tail, data]);
      this.ring = Buffer.allocUnsafe(this.tailCap);
      all.copy(this.ring, 0, all.byteLength - this.tailCap);
      this.dropped += all.byteLength - this.tailCap;
      this.ringPos = 0;
      this.tail.length = 0;
      this.tailBytes = this.tailCap;
      return;
    }
    let src = data;
    if (src.byteLength > this.tailCap) {
      this.dropped += src.byteLength - this.tailCap;
      src = src.subarray(src.byteLength - this.tailCap);
    }
    // Each byte written replaces the oldest one.
    this.dropped += src.byteLength;
    const first = Math.min(src.byteLength, this.tailCap - this.ringPos);
    this.ring.set(src.subarray(0, first), this.ringPos);
    this.ring.set(src.subarray(first), 0);
    this.ringPos = (this.ringPos + src.byteLength) % this.tailCap;
  }
  flush(): string {
    return this.decoder.decode();
  }
  /** Everything held, the dropped middle (if any) replaced by one line saying so. */
  text(): string {
    let head = Buffer.concat(this.head, this.headBytes);
    let tail = this.ring ? Buffer.concat([this.ring.subarray(this.ringPos), this.ring.subarray(0, this.ringPos)]) : Buffer.concat(this.tail, this.tailBytes);
    if (this.dropped === 0) return Buffer.concat([head, tail]).toString("utf8");
    // Whole lines only: the head up to its last line break, the tail from its first.
    let cut = 0;
    const lastNl = head.lastIndexOf(0x0a);
    if (lastNl >= 0) {
      cut += head.byteLength - lastNl - 1;
      head = head.subarray(0, lastNl + 1);
    }
    const firstNl = tail.indexOf(0x0a);
    if (firstNl >= 0 && firstNl < tail.byteLength - 1) {
      cut += firstNl + 1;
      tail = tail.subarray(firstNl + 1);
    }
    const sep = head.byteLength > 0 && head[head.byteLength - 1] !== 0x0a ? "\n" : "";
    const bound = this.starved
      ? `the plugin's output budget for all executes (limiter.ts OUTPUT_BUDGET_BYTES, ${this.budget?.bytes.limit ?? 0} bytes; ${this.budget?.bytes.keyLimit ?? 0} a company) was full, so it held ${this.headCap + this.tailCap} bytes of this stream`
      : `the plugin holds at most ${this.headCap + this.tailCap} bytes per stream (settings.maxExecuteOutputBytes)`;
    const marker = `${sep}[kubeclip: ${this.dropped + cut} bytes of output truncated here: ${bound}]\n`;
    return head.toString("utf8") + marker + tail.toString("utf8");
  }
}

interface ExitFrame {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  lastSeq: number;
  truncated: boolean;
}

/** The answer to a stdin message (docs/schemas/exec-stdin-reply.json). */
export interface StdinReply {
  offset: number;
  closed: boolean;
}

export function decodeStdinReply(data: Uint8Array): StdinReply {
  const f = new Fields(parseObject(data, "stdin reply"), "stdin reply");
  const offset = f.optInt("offset");
  if (offset === undefined || offset < 0) throw new ProtocolError("stdin reply: field offset must be an integer >= 0");
  return { offset, closed: f.bool("closed") };
}

/**
 * Runs spec through kubeclip and returns its result. Throws KubeclipError for an `error` frame
 * (`<code>: <message>`); a timeout or an abort is a result (timedOut / cancelled), not a throw.
 */
export async function runExec(nc: NatsConnection, prefix: string, spec: ExecSpec, opts: ExecOptions = {}): Promise<ExecResult> {
  return new ExecRun(nc, prefix, spec, opts).run();
}

/**
 * Where one exec stands; ExecRun moves between them only in its named transitions.
 *
 *   starting  → no `started` yet: a request is a start (a repeated start is an attach from seq 1,
 *               the same exec id, never a second run)
 *   streaming → a session started: a request is an attach from the next seq the client needs
 *   stopping  → the client gave up (cancelled, its own deadline, a failed stdin source or stdout
 *               sink) and sent SIGKILL: the exit is waited for KILL_WAIT_MS, and the stream
 *               ending without one (an error, no exec-worker) ends the exec
 *   ended     → the exit arrived (with every chunk before it), or the stream ended while stopping
 *
 * Giving up before any `started` stops with no session: a request then is still a start.
 */
type Phase = "starting" | "streaming" | "stopping" | "ended";

/**
 * One exec of runExec as an explicit state machine (the shape of nats.js's
 * OrderedPullConsumerImpl and nats.go's jetstream/ordered.go): a phase, the stream's position,
 * and one method per transition. run() waits for the next inbox item or timer tick and hands it
 * to the transition that owns it.
 */
class ExecRun {
  private phase: Phase = "starting";
  private readonly execId = newExecId();
  /** `<prefix>.exec.<companyId>.<runId>`: start, attach and signal subjects hang off it. */
  private readonly base: string;
  private readonly silenceMs: number;
  private readonly maxLog: number;
  private readonly noResponderMs: number;
  private readonly unavailableMs: number;
  private readonly retryMs: number;
  private readonly stdin: StdinFeed;
  private readonly out: Record<Stream, Output>;
  private readonly inbox = new Inbox();
  private readonly replyTo: string;
  private readonly startPayload: Uint8Array;
  /** The command's timeout plus the grace for its exit frame. */
  private readonly deadline: number;
  /** The latest `started`'s session: where stdin, acks and close go. */
  private session: { ioSubject: string; replica: string | undefined } | undefined;
  /** The next seq the client needs. */
  private next = 1;
  private acked = 0;
  private unackedBytes = 0;
  private attaches = 0;
  private lastHeard = Date.now();
  private lastResume = Date.now();
  /** An exit that came before chunks it names as sent: it ends the exec once they arrive. */
  private pendingExit: ExitFrame | undefined;
  private exit: ExitFrame | undefined;
  /** The generation of the stdin sender: the latest `started` owns stdin. */
  private stdinGen = 0;
  /** When SIGKILL was sent (0: never). */
  private killSentAt = 0;
  private cancelled = false;
  private clientTimeout = false;
  private failure: FailMarker | undefined;
  private noResponderSince = 0;
  private unavailableSince = 0;

  constructor(
    private readonly nc: NatsConnection,
    prefix: string,
    private readonly spec: ExecSpec,
    private readonly opts: ExecOptions,
  ) {
    this.base = `${prefix}.exec.${spec.companyId}.${spec.runId}`;
    this.silenceMs = opts.silenceMs ?? 3_000;
    this.maxLog = opts.maxLogChars ?? MAX_LOG_CHARS;
    this.noResponderMs = opts.noResponderMs ?? 10_000;
    this.unavailableMs = opts.unavailableMs ?? 120_000;
    this.retryMs = opts.retryMs ?? 1_000;
    const cap = opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    if (spec.tty && !spec.stdinStream) throw new Error("tty: a terminal needs stdinStream (stdinBytes -1)");
    this.stdin = new StdinFeed(spec.stdinStream ?? spec.stdin, spec.tty !== undefined);
    const hold = opts.holdBytes ?? DEFAULT_HOLD_BYTES;
    const budget = opts.outputBudget ? { bytes: opts.outputBudget, company: spec.companyId } : undefined;
    this.out = { stdout: new Output(hold, budget), stderr: new Output(hold, budget) };
    this.replyTo = createInbox(opts.inboxPrefix ?? DEFAULT_INBOX_PREFIX);
    this.deadline = Date.now() + spec.timeoutMs + (opts.graceMs ?? 5_000);
    this.startPayload = encode({
      execId: this.execId,
      providerLeaseId: spec.providerLeaseId,
      command: spec.command,
      args: spec.args,
      cwd: spec.cwd ?? "",
      env: spec.env,
      timeoutMs: spec.timeoutMs,
      // Paperclip's stdin is a string of known length; native sync streams a tar (-1: unknown).
      stdinBytes: this.stdin.length,
      record: spec.record,
      maxOutputBytes: cap,
      ...(spec.tty ? { tty: { rows: spec.tty.rows, cols: spec.tty.cols } } : {}),
    });
  }

  async run(): Promise<ExecResult> {
    const sub = this.nc.subscribe(this.replyTo, {
      callback: (err, msg) => {
        this.inbox.push(err ?? msg);
      },
    });
    const onAbort = (): void => {
      this.inbox.push(new AbortMarker());
    };
    this.opts.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      this.request();
      while (await this.step()) {
        // each step is one transition
      }
    } finally {
      this.stdinGen++;
      this.opts.signal?.removeEventListener("abort", onAbort);
      sub.unsubscribe();
      await this.stdin.close().catch(() => undefined);
      // Given back as the result is built: nothing awaits from here to the return.
      this.out.stdout.release();
      this.out.stderr.release();
    }
    return this.result();
  }

  /** Waits for one inbox item or timer tick and makes its transition; false once the exec is over. */
  private async step(): Promise<boolean> {
    if (this.opts.signal?.aborted && !this.cancelled) this.cancel();
    if (this.phase === "ended") return false;
    const now = Date.now();
    if (this.phase === "stopping" && now - this.killSentAt >= KILL_WAIT_MS) {
      this.phase = "ended"; // no exit came after the kill: the result says SIGKILL
      return false;
    }
    if (this.phase !== "stopping" && now >= this.deadline) {
      this.timeOut();
      return true;
    }
    const until = this.phase === "stopping" ? this.killSentAt + KILL_WAIT_MS : this.deadline;
    const item = await this.inbox.next(Math.min(500, until - now));
    if (item === undefined) this.onQuiet();
    else if (item instanceof AbortMarker) return true; // taken at the top of the next step
    else if (item instanceof FailMarker) this.onFail(item);
    else if (item instanceof ResumeMarker) this.resumeSoon();
    else if (item instanceof Error) throw new KubeclipError("unavailable", `exec ${this.execId}: ${errorMessage(item)}`);
    else await this.onMessage(item);
    return true;
  }

  // ---- transitions of the phase ----

  /** The caller aborted: the command is killed (once), and the result says cancelled. */
  private cancel(): void {
    this.cancelled = true;
    if (!this.killSentAt) this.giveUp();
  }

  /** The client's own deadline passed with no exit: the command is killed. */
  private timeOut(): void {
    this.clientTimeout = true;
    this.giveUp();
  }

  /** starting|streaming → stopping: SIGKILL sent. */
  private giveUp(): void {
    this.killSentAt = Date.now();
    if (this.phase !== "ended") this.phase = "stopping";
    // Answered by one `signaled` on the inbox, which is no part of the stream: the exit still
    // comes (signal SIGKILL) and the loop waits for it a little.
    this.nc.publish(`${this.base}.signal`, encode({ execId: this.execId, providerLeaseId: this.spec.providerLeaseId, signal: "SIGKILL" }), { reply: this.replyTo });
  }

  /** → ended, with the exit when one came. */
  private end(exit?: ExitFrame): void {
    this.exit = exit;
    this.phase = "ended";
  }

  /** The stdin source or the stdout sink failed: kill the command; run() rethrows the failure. */
  private onFail(item: FailMarker): void {
    this.failure ??= item;
    if (this.phase !== "stopping") this.giveUp();
    this.end();
  }

  /** Nothing arrived for a while: after silenceMs of it, attach again. */
  private onQuiet(): void {
    if (Date.now() - this.lastHeard >= this.silenceMs) this.resume();
  }

  // ---- requests ----

  /** A start before any `started`, an attach from the next needed seq after. */
  private request(): void {
    this.lastResume = Date.now();
    this.lastHeard = this.lastResume;
    // Before `started` nothing may be running yet: a repeated start is an attach from seq 1
    // (same exec id, never a second run).
    if (!this.session) {
      this.nc.publish(`${this.base}.start`, this.startPayload, { reply: this.replyTo });
      return;
    }
    this.nc.publish(`${this.base}.attach`, encode({ execId: this.execId, providerLeaseId: this.spec.providerLeaseId, fromSeq: this.next }), { reply: this.replyTo });
  }

  private resume(): void {
    this.attaches++;
    this.request();
  }

  /** Attach again soon: now if the last request is a second old, else once it is. */
  private resumeSoon(): void {
    const pause = Math.min(1_000, this.silenceMs);
    if (Date.now() - this.lastResume >= pause) this.resume();
    else this.lastHeard = Math.min(this.lastHeard, this.lastResume + pause - this.silenceMs);
  }

  /** Send the request again after retryMs (the silence check fires then). */
  private retryLater(): void {
    this.lastHeard = Date.now() - this.silenceMs + this.retryMs;
  }

  // ---- messages on the inbox ----

  private async onMessage(msg: Msg): Promise<void> {
    this.lastHeard = Date.now();
    const h = msg.headers;
    if (h && h.hasError && h.code === 503) {
      this.onNoResponders();
      return;
    }
    this.noResponderSince = 0;
    switch (h?.get(H_KIND) ?? "") {
      case "started":
        this.onStarted(msg);
        break;
      case "out":
        await this.onOut(msg);
        break;
      case "heartbeat":
        this.onHeartbeat(msg);
        break;
      case "exit":
        this.onExit(msg);
        break;
      case "signaled":
        // The answer to giveUp's SIGKILL (delivered, or `exited`): the exit, if any, follows.
        break;
      case "notice":
        this.onNotice(msg);
        break;
      case "error":
        this.onError(msg);
        break;
      default:
        break; // unknown kinds are for newer clients
    }
  }

  /** No exec-worker subscribed (yet): ask again in a moment, for at most noResponderMs. */
  private onNoResponders(): void {
    this.noResponderSince ||= Date.now();
    if (Date.now() - this.noResponderSince <= this.noResponderMs) {
      this.retryLater();
      return;
    }
    if (this.phase === "stopping") {
      this.end();
      return;
    }
    throw new KubeclipError("unavailable", `no kubeclip exec-worker answers ${this.base}.${this.session ? "attach" : "start"}`);
  }

  /** starting → streaming: a session; it owns stdin from the offset sandboxd holds. */
  private onStarted(msg: Msg): void {
    const f = new Fields(parseObject(msg.data, "started"), "started");
    if (f.str("execId") !== this.execId) return; // not this exec's (never sent by kubeclip)
    this.session = { ioSubject: f.str("ioSubject"), replica: f.optStr("replica") };
    if (this.phase === "starting") this.phase = "streaming";
    this.unavailableSince = 0;
    // The latest `started` owns stdin: an older sender stops at its next step.
    const gen = ++this.stdinGen;
    const offset = f.optInt("stdinOffset") ?? 0;
    if (this.stdin.length !== 0 && !f.bool("stdinClosed") && !this.stdin.pastEnd(offset)) {
      void this.sendStdin(this.session.ioSubject, offset, gen);
    }
  }

  /** One chunk of output: taken in seq order; a gap attaches again from the first missing one. */
  private async onOut(msg: Msg): Promise<void> {
    const seq = Number(msg.headers?.get(H_SEQ));
    const stream = msg.headers?.get(H_STREAM);
    if (!Number.isSafeInteger(seq) || seq < 1 || (stream !== "stdout" && stream !== "stderr")) {
      throw new ProtocolError(`exec ${this.execId}: out message without a valid seq or stream`);
    }
    if (seq < this.next) return; // a duplicate after a resume
    if (seq > this.next) {
      this.resumeSoon(); // a gap: attach from the first missing seq
      return;
    }
    this.next++;
    if (stream === "stdout" && this.opts.stdoutSink) {
      try {
        await this.opts.stdoutSink(msg.data);
      } catch (err) {
        this.inbox.push(new FailMarker(err));
      }
    } else this.emit(stream, this.out[stream].add(msg.data));
    this.unackedBytes += msg.data.byteLength;
    if (this.unackedBytes >= ACK_BYTES) this.ack();
    if (this.pendingExit && this.next > this.pendingExit.lastSeq) this.end(this.pendingExit);
  }

  /** A heartbeat names the last seq its session sent: one this client lacks was lost. */
  private onHeartbeat(msg: Msg): void {
    const last = msg.headers?.get(H_SEQ) ?? "";
    if (last !== "" && Number(last) >= this.next) this.resumeSoon();
    if (this.unackedBytes > 0) this.ack();
  }

  /** → ended, or, with chunks still missing, waits for them first. */
  private onExit(msg: Msg): void {
    const frame = decodeExit(msg.data);
    if (frame.lastSeq >= this.next) {
      this.pendingExit = frame;
      this.resumeSoon();
    } else this.end(frame);
  }

  /**
   * What kubeclip says about the exec beside its output (exec-notice.json: a budget stopped its
   * recording into the run's history): one line in the live log, so the run's log in Paperclip
   * says why; never in the result, whose stdout the agent's adapter parses.
   */
  private onNotice(msg: Msg): void {
    const f = new Fields(parseObject(msg.data, "notice"), "notice");
    const message = f.optStr("message");
    if (message) this.opts.onOutput?.("stderr", `\n[kubeclip: ${message}]\n`);
  }

  /** An `error` frame: thrown, retried while `unavailable`, or the end of a stopping exec. */
  private onError(msg: Msg): void {
    const f = new Fields(parseObject(msg.data, "exec error"), "exec error");
    const code = f.optStr("code") ?? "internal";
    if (this.phase === "stopping") {
      // Giving up already (cancelled, timed out; the lease may be ending under it): the
      // result says so, whatever ended the stream.
      this.end();
      return;
    }
    if (code === "unavailable") {
      // The replica could not serve it; the same request again is safe (same exec id).
      this.unavailableSince ||= Date.now();
      if (Date.now() - this.unavailableSince <= this.unavailableMs) {
        this.retryLater();
        return;
      }
    }
    const field = f.optStr("field");
    const message = f.optStr("message") ?? "exec failed";
    throw new KubeclipError(code, field && !message.includes(field) ? `${field}: ${message}` : message, field);
  }

  // ---- the session's io subject ----

  private io(kind: string, extra: Record<string, string> = {}, data?: Uint8Array): void {
    const ioSubject = this.session?.ioSubject;
    if (!ioSubject) return;
    const h = headers();
    h.set(H_KIND, kind);
    for (const [k, v] of Object.entries(extra)) h.set(k, v);
    this.nc.publish(ioSubject, data ?? new Uint8Array(0), { headers: h });
  }

  private ack(): void {
    if (this.next - 1 > this.acked && this.session?.ioSubject) {
      this.acked = this.next - 1;
      this.unackedBytes = 0;
      this.io("ack", { [H_SEQ]: String(this.acked) });
    }
  }

  /**
   * Sends stdin from offset to the session on subject, one chunk at a time, each answered with
   * how much stdin sandboxd holds; a newer generation (a later `started`) supersedes this one.
   */
  private async sendStdin(subject: string, from: number, gen: number): Promise<void> {
    let offset = from;
    while (gen === this.stdinGen) {
      let piece: { data: Uint8Array; eof: boolean };
      try {
        piece = await this.stdin.read(offset, STDIN_CHUNK_BYTES);
      } catch (err) {
        if (gen === this.stdinGen) this.inbox.push(new FailMarker(err));
        return;
      }
      if (gen !== this.stdinGen) return;
      const h = headers();
      h.set(H_KIND, "stdin");
      h.set(H_OFFSET, String(offset));
      if (piece.eof) h.set(H_EOF, "1");
      let reply: StdinReply;
      try {
        const m = await this.nc.request(subject, piece.data, { headers: h, timeout: this.opts.stdinTimeoutMs ?? 10_000 });
        reply = decodeStdinReply(m.data);
      } catch {
        // No answer (the replica died, or the write failed in transport), or a malformed one:
        // attach again; the new `started` says where sandboxd is.
        if (gen === this.stdinGen) this.inbox.push(new ResumeMarker());
        return;
      }
      // closed: sandboxd takes no more (eof went through, or the command stopped reading and
      // exited, say `head -c 10`): send nothing more.
      const end = offset + piece.data.byteLength;
      if (reply.closed || (piece.eof && reply.offset === end)) return;
      if (reply.offset > end || this.stdin.pastEnd(reply.offset)) {
        if (gen === this.stdinGen) this.inbox.push(new ResumeMarker());
        return;
      }
      offset = reply.offset;
    }
  }

  // ---- the result ----

  private emit(stream: Stream, text: string): void {
    if (!this.opts.onOutput || text === "") return;
    for (const piece of splitText(text, this.maxLog)) this.opts.onOutput(stream, piece);
  }

  /** The ended exec's result; a failed stdin source or stdout sink is thrown instead. */
  private result(): ExecResult {
    if (this.failure) throw this.failure.error;
    const { out, exit } = this;
    this.emit("stdout", out.stdout.flush());
    this.emit("stderr", out.stderr.flush());
    if (exit) {
      this.ack();
      // Only the exec's own client closes it: the stream ends and sandboxd drops the journal.
      this.io("close", { [H_SEQ]: String(this.next - 1) });
    }
    const truncated = out.stdout.dropped > 0 || out.stderr.dropped > 0 || exit?.truncated === true;
    const metadata: ExecResult["metadata"] = { execId: this.execId };
    if (this.session?.replica) metadata.replica = this.session.replica;
    if (truncated) metadata.truncated = true;
    if (this.attaches > 0) metadata.attaches = this.attaches;
    if (this.cancelled) metadata.cancelled = true;
    if (this.clientTimeout) metadata.clientTimeout = true;
    return {
      exitCode: exit ? exit.exitCode : null,
      signal: exit ? exit.signal : this.killSentAt ? "SIGKILL" : null,
      timedOut: (exit?.timedOut ?? false) || this.clientTimeout,
      stdout: out.stdout.text(),
      stderr: out.stderr.text(),
      metadata,
    };
  }
}

function decodeExit(data: Uint8Array): ExitFrame {
  const obj = parseObject(data, "exit");
  const f = new Fields(obj, "exit");
  const code = obj.exitCode;
  if (code !== null && code !== undefined && (typeof code !== "number" || !Number.isSafeInteger(code))) {
    throw new ProtocolError("exit: exitCode must be an integer or null");
  }
  return {
    exitCode: typeof code === "number" ? code : null,
    signal: f.optStr("signal") || null,
    timedOut: f.bool("timedOut"),
    lastSeq: f.optInt("lastSeq") ?? 0,
    truncated: f.bool("truncated"),
  };
}
