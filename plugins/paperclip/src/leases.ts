// Lease requests on JetStream (docs/events.md): publish acquire/release/destroy/resume to
// `<prefix>.lease.<companyId>.<kind>` and follow the run's events until kubeclip answers.
//
// The follower is created (and the server has acknowledged it) before the request is published,
// and it delivers the run's whole history: an answer that comes before the plugin is listening,
// or that a previous attempt already got, is never missed. A reusable lease is released and
// resumed once per run: those requests name themselves (releaseId, resumeId), and only the answer
// carrying the same id is theirs.

import { DeliverPolicy, jetstream, type ConsumerMessages, type JetStreamClient } from "@nats-io/jetstream";
import { headers, type NatsConnection } from "@nats-io/transport-node";
import { KubeclipError, ProtocolError, TimeoutError, UnreachableError, errorMessage } from "./errors.js";
import { Fields, encode, parseObject, type JsonObject } from "./json.js";

export type LeaseKind = "acquire" | "release" | "destroy" | "resume";

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
}

export interface WaitOptions {
  timeoutMs: number;
  signal?: AbortSignal | undefined;
  /** The connection's display URL, for errors. */
  display: string;
  /** Called for each run event received while waiting (logging). */
  onEvent?: ((kind: string) => void) | undefined;
}

export class Leases {
  private readonly js: JetStreamClient;
  private readonly prefix: string;
  private readonly now: () => Date;

  constructor(nc: NatsConnection, prefix: string, now: () => Date = () => new Date()) {
    this.js = jetstream(nc);
    this.prefix = prefix;
    this.now = now;
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
    return this.request(req.companyId, req.runId, "acquire", payload, [`${this.runSubjectBase(req)}.*`], opts, (kind, ev) => {
      if (kind === "created") return decodeCreated(ev);
      return undefined;
    });
  }

  /**
   * Publishes a release or destroy and waits for `released` (returned) or `failed` (thrown).
   * Only those two kinds are followed: a run's history can hold thousands of log and exec events.
   */
  async release(req: ReleaseRequest, kind: "release" | "destroy", opts: WaitOptions): Promise<ReleasedEvent> {
    const payload: JsonObject = {
      runId: req.runId,
      companyId: req.companyId,
      providerLeaseId: req.providerLeaseId,
    };
    if (req.cancelActiveWork) payload.cancelActiveWork = true;
    if (req.releaseId) payload.releaseId = req.releaseId;
    const base = this.runSubjectBase(req);
    return this.request(req.companyId, req.runId, kind, payload, [`${base}.released`, `${base}.failed`], opts, (k, ev) => {
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
    const base = this.runSubjectBase(req);
    return this.request(req.companyId, req.runId, "resume", payload, [`${base}.resumed`, `${base}.failed`], opts, (k, ev) => {
      if (k !== "resumed" || !answers(ev, "resumeId", req.resumeId)) return undefined;
      return decodeResumed(ev);
    }, req.resumeId);
  }

  private runSubjectBase(ids: { companyId: string; runId: string }): string {
    return `${this.prefix}.run.${ids.companyId}.${ids.runId}`;
  }

  private async request<T>(
    companyId: string,
    runId: string,
    kind: LeaseKind,
    payload: JsonObject,
    filter: string[],
    opts: WaitOptions,
    decide: (kind: string, ev: JsonObject) => T | undefined,
    requestId: string | undefined = typeof payload.releaseId === "string" ? payload.releaseId : undefined,
  ): Promise<T> {
    const deadline = Date.now() + opts.timeoutMs;
    const abort = new AbortController();
    const timer = setTimeout(() => {
      abort.abort(new TimeoutError(`no answer to ${kind} of run ${runId} within ${opts.timeoutMs} ms`));
    }, opts.timeoutMs);
    const onAbort = (): void => {
      abort.abort(opts.signal?.reason ?? new Error(`${kind} of run ${runId} cancelled`));
    };
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    let messages: ConsumerMessages | undefined;
    try {
      messages = await bounded(this.follow(filter), abort.signal);
      abort.signal.addEventListener("abort", () => messages?.stop(), { once: true });
      await bounded(this.publish(companyId, runId, kind, payload, deadline, requestId), abort.signal);
      for await (const m of messages) {
        const k = m.subject.slice(m.subject.lastIndexOf(".") + 1);
        // kubeclip's events carry their CloudEvents type. JetStream itself stores its answer to a
        // publish or an API request on whatever reply subject the sender named, a run subject
        // included, with no header: that is no event of this run (pkg/events readback.go).
        if (m.headers?.get("ce-type") !== runEventType(k)) continue;
        opts.onEvent?.(k);
        let ev: JsonObject;
        try {
          ev = parseObject(m.data, `${k} event of run ${runId}`);
        } catch {
          continue; // not ours to judge; the run stream is kubeclip's
        }
        // A failure answers the request that carries the same id (none: the run's own).
        if (k === "failed") {
          if (!answers(ev, "requestId", requestId)) continue;
          throw decodeFailed(ev);
        }
        const result = decide(k, ev);
        if (result !== undefined) return result;
      }
      throw abort.signal.aborted ? reason(abort.signal) : new UnreachableError(opts.display, `following run ${runId} stopped`);
    } catch (err) {
      if (abort.signal.aborted && !(err instanceof KubeclipError)) throw reason(abort.signal);
      throw mapJetStreamError(err, opts.display, this.leaseStream, this.runStream);
    } finally {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
      if (messages) {
        await messages.close().catch(() => undefined);
      }
    }
  }

  /** An ordered consumer on the run's subjects, history included; resolves once it exists. */
  private async follow(filter: string[]): Promise<ConsumerMessages> {
    const consumer = await this.js.consumers.get(this.runStream, {
      filter_subjects: filter,
      deliver_policy: DeliverPolicy.All,
      // Only a crashed plugin leaves it behind; the server then drops it after a minute.
      inactive_threshold: 60_000,
    });
    return consumer.consume({ max_messages: 64 });
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
        if (isPermanentPublishError(err) || Date.now() + 500 >= deadline) throw err;
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
  return { providerLeaseId: f.str("providerLeaseId"), state };
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
