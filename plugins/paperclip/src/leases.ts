// Lease requests on JetStream (docs/contract.md): publish acquire/release/destroy/resume to
// `<prefix>.lease.<companyId>.<kind>` and wait for kubeclip's answer among the run's events.
//
// Every request of a Leases shares one consumer of the runs' answers (answers.ts): a request
// registers its wait, and the consumer exists, before the request is published, so no answer to
// it is missed; an answer stored before (a repeated request) or while the consumer was gone is
// read from the run's history, as is the run's history once more before a wait gives up. A
// reusable lease is released and resumed once per run: those requests name themselves
// (releaseId, resumeId), and only the answer carrying the same id is theirs.

import { jetstream, type JetStreamClient } from "@nats-io/jetstream";
import { headers, type NatsConnection } from "@nats-io/transport-node";
import { RunAnswers, type Answer, type AnswerKind, type Waiter } from "./answers.js";
import { KubeclipError, ProtocolError, TimeoutError, UnreachableError, errorMessage } from "./errors.js";
import { Fields, encode, parseObject, type JsonObject } from "./json.js";

export type LeaseKind = "acquire" | "release" | "destroy" | "resume";

/**
 * The key of a lease's state in the plugin (its executes in flight, its hook figures, the leases
 * a login may open on): the company and the lease id, never the id alone. A lease id is no
 * secret and not unique across companies (a copied `created` answer hands one company another's
 * id): keyed by the id alone, one company's release would abort another's commands.
 */
export function leaseKey(companyId: string, providerLeaseId: string): string {
  return `${companyId}\u0000${providerLeaseId}`;
}

/** The end of a wait kept for a last read of the run's history (at most a quarter of it). */
export const HISTORY_RESERVE_MS = 1_000;

export interface AcquireRequest {
  runId: string;
  companyId: string;
  environmentId: string;
  agentId: string;
  issueId?: string | undefined;
  adapterType?: string | undefined;
  executionWorkspaceSettings?: JsonObject | undefined;
  requestedExpiresAt?: string | undefined;
  config: JsonObject;
  /** A reusable lease: its workspace and the agent's home outlive the run (backends pod and sandbox-cr). */
  reuseLease?: boolean | undefined;
}

export interface ReleaseRequest {
  runId: string;
  companyId: string;
  providerLeaseId: string;
  cancelActiveWork: boolean;
  /** Names this release among a reusable lease's releases (one per run). */
  releaseId?: string | undefined;
}

export interface ResumeRequest {
  runId: string;
  companyId: string;
  providerLeaseId: string;
  /** Names this resume: the message id and the answer carry it. */
  resumeId: string;
}

export interface ResumedEvent {
  providerLeaseId: string;
  from: "retained" | "suspended";
  generation: number;
  resumes: number;
  /** The lease's expiry from this resume on (each resume renews it); null when kubeclip keeps none. */
  expiresAt: string | null;
}

export interface CreatedEvent {
  providerLeaseId: string;
  namespace: string;
  workloadName: string;
  backend: string;
  phase: string;
  expiresAt: string | null;
}

export interface ReleasedEvent {
  providerLeaseId: string;
  state: "stopped" | "destroyed";
  /** kubeclip had no lease of the company for the run: a receipt that nothing was there. */
  unknown?: true;
}

export interface WaitOptions {
  timeoutMs: number;
  signal?: AbortSignal | undefined;
  /** The connection's display URL, for errors. */
  display: string;
  /** Called for each run event received while waiting (logging). */
  onEvent?: ((kind: string) => void) | undefined;
}

/**
 * Lease requests on one connection and subject prefix. Make one per connection and keep it: its
 * requests share one consumer of the runs' answers.
 */
export class Leases {
  private readonly js: JetStreamClient;
  private readonly prefix: string;
  private readonly now: () => Date;
  /** The answers every request of this Leases waits on. */
  readonly answers: RunAnswers;

  constructor(nc: NatsConnection, prefix: string, now: () => Date = () => new Date()) {
    this.js = jetstream(nc);
    this.prefix = prefix;
    this.now = now;
    this.answers = new RunAnswers(nc, prefix);
  }

  get leaseStream(): string {
    return `${this.prefix.toUpperCase()}_LEASES`;
  }

  get runStream(): string {
    return `${this.prefix.toUpperCase()}_RUNS`;
  }

  /** Publishes an acquire and waits for `created` (returned) or `failed` (thrown). */
  async acquire(req: AcquireRequest, opts: WaitOptions): Promise<CreatedEvent> {
    const payload: JsonObject = {
      runId: req.runId,
      companyId: req.companyId,
      environmentId: req.environmentId,
      agentId: req.agentId,
    };
    if (req.issueId) payload.issueId = req.issueId;
    if (req.adapterType) payload.adapterType = req.adapterType;
    if (req.executionWorkspaceSettings) payload.executionWorkspaceSettings = req.executionWorkspaceSettings;
    if (req.requestedExpiresAt) payload.requestedExpiresAt = req.requestedExpiresAt;
    payload.config = req.config;
    if (req.reuseLease) payload.reuseLease = true;
    return this.request(req.companyId, req.runId, "acquire", payload, ["created", "failed"], opts, (kind, ev) => {
      if (kind === "created") return decodeCreated(ev);
      return undefined;
    });
  }

  /** Publishes a release or destroy and waits for `released` (returned) or `failed` (thrown). */
  async release(req: ReleaseRequest, kind: "release" | "destroy", opts: WaitOptions): Promise<ReleasedEvent> {
    const payload: JsonObject = {
      runId: req.runId,
      companyId: req.companyId,
      providerLeaseId: req.providerLeaseId,
    };
    if (req.cancelActiveWork) payload.cancelActiveWork = true;
    if (req.releaseId) payload.releaseId = req.releaseId;
    return this.request(req.companyId, req.runId, kind, payload, ["released", "failed"], opts, (k, ev) => {
      if (k !== "released" || !answers(ev, "releaseId", req.releaseId)) return undefined;
      const r = decodeReleased(ev);
      // A destroy needs the workload gone; an earlier release's `stopped` is not its answer.
      if (kind === "destroy" && r.state !== "destroyed") return undefined;
      return r;
    });
  }

  /**
   * Publishes a resume of a reusable lease and waits for its `resumed` (returned) or `failed`
   * (thrown; `lease_not_found` for a lease kubeclip no longer has).
   */
  async resume(req: ResumeRequest, opts: WaitOptions): Promise<ResumedEvent> {
    const payload: JsonObject = { runId: req.runId, companyId: req.companyId, providerLeaseId: req.providerLeaseId, resumeId: req.resumeId };
    return this.request(req.companyId, req.runId, "resume", payload, ["resumed", "failed"], opts, (k, ev) => {
      if (k !== "resumed" || !answers(ev, "resumeId", req.resumeId)) return undefined;
      return decodeResumed(ev);
    }, req.resumeId);
  }

  private async request<T>(
    companyId: string,
    runId: string,
    kind: LeaseKind,
    payload: JsonObject,
    kinds: readonly AnswerKind[],
    opts: WaitOptions,
    decide: (kind: string, ev: JsonObject) => T | undefined,
    requestId: string | undefined = typeof payload.releaseId === "string" ? payload.releaseId : undefined,
  ): Promise<T> {
    const deadline = Date.now() + opts.timeoutMs;
    const base = this.answers.base(companyId, runId);
    const gone = new AbortController();
    const timer = setTimeout(() => {
      gone.abort(new TimeoutError(`no answer to ${kind} of run ${runId} within ${opts.timeoutMs} ms`));
    }, opts.timeoutMs);
    const onAbort = (): void => {
      gone.abort(opts.signal?.reason ?? new Error(`${kind} of run ${runId} cancelled`));
    };
    opts.signal?.addEventListener("abort", onAbort, { once: true });

    let done = false as boolean; // set by take(), which the consumer calls
    let resolve!: (v: T) => void;
    let reject!: (err: unknown) => void;
    const answered = new Promise<T>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    answered.catch(() => undefined); // awaited below, unless the request failed before
    /** Takes one answer of the run: whether the request is answered. */
    const take = (a: Answer): boolean => {
      if (done || !(kinds as readonly string[]).includes(a.kind)) return done;
      // kubeclip's events carry their CloudEvents type. JetStream itself stores its answer to a
      // publish or an API request on whatever reply subject the sender named, a run subject
      // included, with no header: that is no event of this run (pkg/events readback.go).
      if (a.headers?.get("ce-type") !== runEventType(a.kind)) return false;
      opts.onEvent?.(a.kind);
      let ev: JsonObject;
      try {
        ev = parseObject(a.data, `${a.kind} event of run ${runId}`);
      } catch {
        return false; // not ours to judge; the run stream is kubeclip's
      }
      try {
        // A failure answers the request that carries the same id (none: the run's own).
        if (a.kind === "failed") {
          if (!answers(ev, "requestId", requestId)) return false;
          throw decodeFailed(ev);
        }
        const value = decide(a.kind, ev);
        if (value === undefined) return false;
        resolve(value);
      } catch (err) {
        reject(err);
      }
      done = true;
      return true;
    };
    let reading: Promise<void> | undefined;
    /** Reads the run's stored answers (one read at a time). */
    const readHistory = (): Promise<void> => {
      reading ??= (async () => {
        try {
          for (const a of await this.answers.history(base, kinds, deadline)) if (take(a)) return;
        } finally {
          reading = undefined;
        }
      })();
      return reading;
    };
    const waiter: Waiter = {
      offer: (a) => void take(a),
      // The consumer ended; its successor brings what comes next, the history what came between.
      // None to be had (nats.js ends one only for a closed connection or a stream it could not
      // find for long): the request fails now, not at its deadline. The history read may be one
      // already under way when the connection closed, which resolves without the answer: a
      // closed connection fails the request after it.
      reset: () => {
        const readOrFail = async (): Promise<void> => {
          await readHistory();
          if (!done && this.answers.closed) throw new Error("the NATS connection closed while the request waited");
        };
        void this.answers.ready().then(readOrFail).catch((err: unknown) => {
          if (done) return;
          done = true;
          reject(err);
        });
      },
    };

    const unwatch = this.answers.watch(base, waiter);
    try {
      await bounded(this.answers.ready(), gone.signal);
      await bounded(this.publish(companyId, runId, kind, payload, deadline, requestId), gone.signal);
      // An answer stored before the consumer existed: a repeated request's (a retry after a lost
      // ack, the host's after a plugin restart), which kubeclip does not handle twice.
      void readHistory().catch(() => undefined);
      // The end of the budget reads the history once more (an answer the consumer did not
      // bring) and listens on until the deadline.
      const reserve = Math.min(HISTORY_RESERVE_MS, Math.floor(opts.timeoutMs / 4));
      await bounded(within(answered, deadline - reserve - Date.now()), gone.signal);
      if (!done) await bounded(readHistory(), gone.signal);
      return await bounded(answered, gone.signal);
    } catch (err) {
      if (gone.signal.aborted && !(err instanceof KubeclipError)) throw reason(gone.signal);
      throw mapJetStreamError(err, opts.display, this.leaseStream, this.runStream);
    } finally {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
      unwatch();
    }
  }

  private async publish(companyId: string, runId: string, kind: LeaseKind, payload: JsonObject, deadline: number, requestId?: string): Promise<void> {
    const subject = `${this.prefix}.lease.${companyId}.${kind}`;
    const id = requestId ? `${companyId}.${runId}.${kind}.${requestId}` : `${companyId}.${runId}.${kind}`;
    const h = headers();
    h.set("ce-specversion", "1.0");
    h.set("ce-type", `io.paperclip.lease.${kind}.v1`);
    h.set("ce-source", `/companies/${encodeURIComponent(companyId)}/runs/${encodeURIComponent(runId)}`);
    h.set("ce-id", id);
    h.set("ce-time", rfc3339Nano(this.now()));
    h.set("ce-subject", subject);
    h.set("ce-datacontenttype", "application/json");
    const data = encode(payload);
    // Retry until the stream acknowledges: the message id makes a repeat harmless.
    for (let attempt = 1; ; attempt++) {
      try {
        await this.js.publish(subject, data, {
          msgID: id,
          headers: h,
          expect: { streamName: this.leaseStream },
          timeout: Math.max(1_000, Math.min(5_000, deadline - Date.now())),
        });
        return;
      } catch (err) {
        // A closed connection never acknowledges: fail now, not at the deadline.
        if (isPermanentPublishError(err) || this.answers.closed || Date.now() + 500 >= deadline) throw err;
        await new Promise((r) => setTimeout(r, Math.min(2_000, 100 * 2 ** attempt)));
      }
    }
  }
}

/** RFC 3339 with nanoseconds, UTC (JavaScript dates have milliseconds: padded). */
export function rfc3339Nano(d: Date): string {
  return d.toISOString().replace(/\.(\d{3})Z$/, ".$1000000Z");
}

function decodeCreated(ev: JsonObject): CreatedEvent {
  const f = new Fields(ev, "created event");
  return {
    providerLeaseId: f.str("providerLeaseId"),
    namespace: f.str("namespace"),
    workloadName: f.str("workloadName"),
    backend: f.str("backend"),
    phase: f.optStr("phase") ?? "",
    expiresAt: f.optStr("expiresAt") ?? null,
  };
}

/** The CloudEvents type of kubeclip's run events of kind k (pkg/events runType). */
export function runEventType(k: string): string {
  return `io.paperclip.run.${k}.v1`;
}

function decodeReleased(ev: JsonObject): ReleasedEvent {
  const f = new Fields(ev, "released event");
  const state = f.str("state");
  if (state !== "stopped" && state !== "destroyed") throw new ProtocolError(`released event: state ${state} is not stopped or destroyed`);
  return { providerLeaseId: f.str("providerLeaseId"), state, ...(ev.unknown === true ? { unknown: true as const } : {}) };
}

/** Whether ev answers the request named id (undefined: a request that named itself not). */
function answers(ev: JsonObject, key: string, id: string | undefined): boolean {
  const got = typeof ev[key] === "string" ? ev[key] : undefined;
  return got === id;
}

function decodeResumed(ev: JsonObject): ResumedEvent {
  const f = new Fields(ev, "resumed event");
  const from = f.str("from");
  if (from !== "retained" && from !== "suspended") throw new ProtocolError(`resumed event: from ${from} is not retained or suspended`);
  return {
    providerLeaseId: f.str("providerLeaseId"),
    from,
    generation: f.optInt("generation") ?? 0,
    resumes: f.optInt("resumes") ?? 0,
    expiresAt: f.optStr("expiresAt") ?? null,
  };
}

function decodeFailed(ev: JsonObject): KubeclipError {
  const f = new Fields(ev, "failed event");
  let code: string, message: string;
  try {
    code = f.str("code");
    message = f.str("message");
  } catch (err) {
    return new KubeclipError("internal", `kubeclip reported a failure that could not be read (${errorMessage(err)})`);
  }
  const field = f.optStr("field");
  // kubeclip's message names the field; add it when a message does not.
  const text = field && !message.includes(field) ? `${field}: ${message}` : message;
  return new KubeclipError(code, text, field);
}

async function bounded<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) throw reason(signal);
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => {
      reject(reason(signal));
    };
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(resolve, reject).finally(() => {
      signal.removeEventListener("abort", onAbort);
    });
  });
}

/** Settles when p does (its value or error not kept) or after ms, whichever is first. */
async function within(p: Promise<unknown>, ms: number): Promise<void> {
  let t: NodeJS.Timeout | undefined;
  try {
    await Promise.race([p.catch(() => undefined), new Promise<void>((resolve) => (t = setTimeout(resolve, Math.max(0, ms))))]);
  } finally {
    clearTimeout(t);
  }
}

function reason(signal: AbortSignal): Error {
  const r: unknown = signal.reason;
  return r instanceof Error ? r : new Error(errorMessage(r));
}

function isPermanentPublishError(err: unknown): boolean {
  const msg = errorMessage(err).toLowerCase();
  return msg.includes("expected stream") || msg.includes("stream not found") || msg.includes("maximum payload") || msg.includes("permission");
}

function mapJetStreamError(err: unknown, display: string, leaseStream: string, runStream: string): unknown {
  if (err instanceof KubeclipError || err instanceof TimeoutError || err instanceof ProtocolError || err instanceof UnreachableError) return err;
  const msg = errorMessage(err);
  if (/stream not found/i.test(msg) || /expected stream/i.test(msg)) {
    return new UnreachableError(display, `streams ${leaseStream}/${runStream} not found (is kubeclip running with this subject prefix?)`);
  }
  if (/no responders/i.test(msg)) return new UnreachableError(display, "JetStream is not enabled on this NATS server");
  return new UnreachableError(display, msg);
}
