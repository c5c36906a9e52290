// A fake kubeclip for the plugin's tests: the streams, a lease responder that answers acquire,
// release and destroy with run events, and the api.validate / api.ping services.

import { jetstream, jetstreamManager, type JetStreamClient } from "@nats-io/jetstream";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { headers, nanos } from "@nats-io/transport-node";
import { isObject, type JsonObject } from "../../src/json.js";

export interface LeaseRequest {
  subject: string;
  kind: string;
  headers: Record<string, string>;
  payload: JsonObject;
}

/** What the fake does with a lease request: publish these run events (kind → payload extras). */
export type Answer =
  | { kind: "created"; extra?: JsonObject }
  | { kind: "failed"; code: string; message: string; field?: string }
  | { kind: "released"; state?: "stopped" | "destroyed"; unknown?: boolean }
  | { kind: "resumed"; from?: "retained" | "suspended"; generation?: number; resumes?: number; expiresAt?: string }
  | { kind: "silent" }
  | { kind: "events"; events: { kind: string; payload: JsonObject }[] };

export class FakeKubeclip {
  readonly requests: LeaseRequest[] = [];
  readonly validateRequests: JsonObject[] = [];
  onAcquire: (req: LeaseRequest) => Answer | Promise<Answer> = () => ({ kind: "created" });
  onRelease: (req: LeaseRequest) => Answer | Promise<Answer> = (req) => ({
    kind: "released",
    state: req.kind === "destroy" ? "destroyed" : "stopped",
  });
  onResume: (req: LeaseRequest) => Answer | Promise<Answer> = () => ({ kind: "resumed" });
  /** The api.validate verdict; undefined = no responder. */
  onValidate: ((config: JsonObject) => JsonObject) | undefined = (config) => ({ ok: true, errors: [], warnings: [], normalizedConfig: { backend: "pod", ...config } });
  pingReplies: JsonObject[] = [
    { worker: "tenant-worker", replica: "tw-0", version: "test" },
    { worker: "dispatcher", replica: "d-0", version: "test" },
    { worker: "run-watcher", replica: "rw-0", version: "test" },
    { worker: "exec-worker", replica: "ew-0", version: "test" },
  ];
  private readonly subs: Subscription[] = [];
  private readonly js: JetStreamClient;
  private readonly nc: NatsConnection;
  private readonly prefix: string;
  private seq = 0;

  private constructor(nc: NatsConnection, prefix: string) {
    this.nc = nc;
    this.prefix = prefix;
    this.js = jetstream(nc);
  }

  static async start(nc: NatsConnection, prefix = "paperclip"): Promise<FakeKubeclip> {
    const f = new FakeKubeclip(nc, prefix);
    const jsm = await jetstreamManager(nc);
    const up = prefix.toUpperCase();
    for (const [name, subject] of [
      [`${up}_LEASES`, `${prefix}.lease.>`],
      [`${up}_RUNS`, `${prefix}.run.>`],
    ] as const) {
      // As kubeclip's (pkg/events streams.go): the plugin reads a run's answers by direct get.
      await jsm.streams.add({ name, subjects: [subject], duplicate_window: nanos(600_000), max_msg_size: 1 << 20, allow_direct: true });
    }
    f.subs.push(nc.subscribe(`${prefix}.lease.>`, { callback: (_e, m) => void f.onLease(m) }));
    f.subs.push(
      nc.subscribe(`${prefix}.api.validate`, {
        callback: (_e, m) => {
          const body: unknown = JSON.parse(new TextDecoder().decode(m.data));
          const config = isObject(body) && isObject(body.config) ? body.config : {};
          f.validateRequests.push(config);
          if (f.onValidate) m.respond(JSON.stringify(f.onValidate(config)));
        },
      }),
    );
    f.subs.push(
      nc.subscribe(`${prefix}.api.ping`, {
        callback: (_e, m) => {
          for (const r of f.pingReplies) m.respond(JSON.stringify(r));
        },
      }),
    );
    await nc.flush();
    return f;
  }

  stopValidate(): void {
    this.onValidate = undefined;
  }

  async close(): Promise<void> {
    for (const s of this.subs) s.unsubscribe();
    await this.nc.flush().catch(() => undefined);
  }

  /** Publishes a run event as kubeclip would. */
  async publishRun(companyId: string, runId: string, kind: string, payload: JsonObject): Promise<void> {
    const body = { runId, companyId, at: new Date().toISOString(), ...payload };
    const h = headers();
    h.set("ce-type", `io.paperclip.run.${kind}.v1`);
    await this.js.publish(`${this.prefix}.run.${companyId}.${runId}.${kind}`, JSON.stringify(body), {
      msgID: `${companyId}.${runId}.${kind}.${++this.seq}`,
      headers: h,
    });
  }

  private async onLease(m: Msg): Promise<void> {
    const kind = m.subject.slice(m.subject.lastIndexOf(".") + 1);
    const headers: Record<string, string> = {};
    for (const k of m.headers?.keys() ?? []) headers[k] = m.headers?.get(k) ?? "";
    const payload: unknown = JSON.parse(new TextDecoder().decode(m.data));
    if (!isObject(payload)) return;
    const req: LeaseRequest = { subject: m.subject, kind, headers, payload };
    this.requests.push(req);
    const companyId = String(payload.companyId);
    const runId = String(payload.runId);
    const answer =
      kind === "acquire" ? await this.onAcquire(req) : kind === "resume" ? await this.onResume(req) : await this.onRelease(req);
    // As kubeclip: an answer carries the id its request named itself with.
    const requestId = typeof payload.resumeId === "string" ? payload.resumeId : typeof payload.releaseId === "string" ? payload.releaseId : undefined;
    const workload = `pc-${runId.slice(0, 8)}`;
    switch (answer.kind) {
      case "created":
        await this.publishRun(companyId, runId, "created", {
          providerLeaseId: workload,
          namespace: `paperclip-${companyId}`,
          workloadName: workload,
          secretName: `${workload}-env`,
          backend: "pod",
          phase: "Pending",
          ...answer.extra,
        });
        break;
      case "failed":
        await this.publishRun(companyId, runId, "failed", {
          code: answer.code,
          message: answer.message,
          request: kind,
          ...(answer.field ? { field: answer.field } : {}),
          ...(requestId ? { requestId } : {}),
        });
        break;
      case "released":
        await this.publishRun(companyId, runId, "released", {
          providerLeaseId: String(payload.providerLeaseId),
          state: answer.state ?? "stopped",
          ...(answer.unknown ? { unknown: true } : {}),
          // As kubeclip (pkg/dispatch release.go): only a reusable lease's release names its
          // answer; a destroy's answer is the lease's one `released {destroyed}`.
          ...(typeof payload.releaseId === "string" && kind === "release" ? { releaseId: payload.releaseId } : {}),
        });
        break;
      case "resumed":
        await this.publishRun(companyId, runId, "resumed", {
          providerLeaseId: String(payload.providerLeaseId),
          from: answer.from ?? "retained",
          generation: answer.generation ?? 0,
          resumes: answer.resumes ?? 1,
          resumeId: String(payload.resumeId),
          ...(answer.expiresAt ? { expiresAt: answer.expiresAt } : {}),
        });
        break;
      case "events":
        for (const e of answer.events) await this.publishRun(companyId, runId, e.kind, e.payload);
        break;
      case "silent":
        break;
    }
  }
}
