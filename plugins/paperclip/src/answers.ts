// kubeclip's answers to lease requests, for every request one plugin process waits on: one
// ordered consumer per connection and subject prefix on every run's answer subjects
// (`<prefix>.run.*.*.created|released|resumed|failed`), its messages handed to the waiters of
// their run in this process. A consumer per waiting request would cost the run stream one
// server-side consumer per lease in flight, and nats-server refuses a stream's 1,001st consumer
// unless its config raises `default_max_consumers` (docs/architecture.md, Following thousands of leases).
//
// The consumer starts after the stream's last message at the time it is created, and a waiter
// registers (and waits for it to exist) before its request is published: every answer to that
// request comes after, through it. nats.js recreates an ordered consumer from the last stream
// sequence it delivered (a missed heartbeat, a restarted server): nothing is skipped. What the
// consumer cannot deliver is read from the run's history (`history`): an answer stored before
// the request (a repeat the stream took as a duplicate), or one that came while the consumer was
// gone (its iteration ended: each waiter is told, and a new one is created).
//
// Only kubeclip's account writes the run stream (deploy/kustomize/base/nats-auth.conf: the
// clients are in an account of their own). A run stream from before that may still hold what
// JetStream stored for a client that named a run subject as its reply, a direct get's answer
// among them: a genuine typed copy of another run's event, headers included. So an answer is
// offered only when its payload names the company and run of its subject and it is no stored
// direct-get answer (`ownAnswer`).

import { DeliverPolicy, jetstreamManager, type ConsumerMessages, type JetStreamManager, type StoredMsg } from "@nats-io/jetstream";
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";

/** The run events that answer lease requests (docs/contract.md). */
export const ANSWER_KINDS = ["created", "released", "resumed", "failed"] as const;
export type AnswerKind = (typeof ANSWER_KINDS)[number];

/** Messages the consumer holds at most before the waiters took them: answers are small. */
export const ANSWER_BATCH = 256;
/**
 * How long one pull of the consumer lasts. nats.js takes two missed heartbeats (half of this
 * each) as the consumer lost and recreates it: a consumer the server dropped (deleted, a
 * restarted server's memory) is back within about this, well inside a request's 25 s budget.
 */
export const ANSWER_PULL_EXPIRES_MS = 5_000;
/** Answers of one kind read from one run's history at most (a reusable lease's releases). */
export const HISTORY_LIMIT = 10_000;

/** One message of a run's answer subjects. */
export interface Answer {
  kind: string;
  seq: number;
  headers: MsgHdrs | undefined;
  data: Uint8Array;
}

/** A request waiting for its run's answers. */
export interface Waiter {
  /** Called for each answer of the run, in stream order; must not block. */
  offer(a: Answer): void;
  /** The consumer ended: answers may have been missed; read the history. */
  reset(): void;
}

export class RunAnswers {
  private readonly nc: NatsConnection;
  private readonly prefix: string;
  private readonly stream: string;
  /** Waiters by their run's subject base (`<prefix>.run.<company>.<run>`). */
  private readonly waiters = new Map<string, Set<Waiter>>();
  /** Resolves once the consumer exists; undefined while none is (first use, after it ended). */
  private live: Promise<void> | undefined;
  private jsm: Promise<JetStreamManager> | undefined;

  constructor(nc: NatsConnection, prefix: string) {
    this.nc = nc;
    this.prefix = prefix;
    this.stream = `${prefix.toUpperCase()}_RUNS`;
    // A closed connection ends the consumer's iteration only when nats.js next notices (a pull's
    // end, a missed heartbeat): the waiters are told at once, so a request fails when its
    // connection closes, not at its deadline (their reset's read fails on the closed connection).
    void nc.closed().then(() => {
      for (const set of this.waiters.values()) for (const w of set) w.reset();
    });
  }

  /** The subject base of a run's events. */
  base(companyId: string, runId: string): string {
    return `${this.prefix}.run.${companyId}.${runId}`;
  }

  /** Whether the connection closed: no answer can come any more. */
  get closed(): boolean {
    return this.nc.isClosed();
  }

  /** How many requests wait (tests, the load driver). */
  get waiting(): number {
    let n = 0;
    for (const s of this.waiters.values()) n += s.size;
    return n;
  }

  /**
   * Registers w for the run at base: once ready() resolves, every answer stored from then on
   * reaches it. Returns the call that unregisters it.
   */
  watch(base: string, w: Waiter): () => void {
    let set = this.waiters.get(base);
    if (!set) this.waiters.set(base, (set = new Set()));
    set.add(w);
    return () => {
      const s = this.waiters.get(base);
      s?.delete(w);
      if (s?.size === 0) this.waiters.delete(base);
    };
  }

  /** Resolves once the consumer exists, creating it when there is none. */
  ready(): Promise<void> {
    if (!this.live) {
      const p = this.start();
      this.live = p;
      p.catch(() => {
        // Not created: the next request tries again.
        if (this.live === p) this.live = undefined;
      });
    }
    return this.live;
  }

  /**
   * The run's stored answers of these kinds, in stream order, read one message at a time without
   * a consumer (direct gets, which the run stream allows). Stops at the deadline.
   */
  async history(base: string, kinds: readonly string[], deadline: number): Promise<Answer[]> {
    const jsm = await this.manager();
    const out: Answer[] = [];
    for (const kind of kinds) {
      let seq = 1;
      for (let i = 0; i < HISTORY_LIMIT && Date.now() < deadline; i++) {
        const m: StoredMsg | null = await jsm.direct.getMessage(this.stream, { seq, next_by_subj: `${base}.${kind}` });
        if (!m) break;
        const stored = storedSeq(m.header, m.seq);
        if (ownAnswer(base, m.header, m.data, 1)) out.push({ kind, seq: stored, headers: m.header, data: m.data });
        seq = stored + 1;
      }
    }
    return out.sort((a, b) => a.seq - b.seq);
  }

  private manager(): Promise<JetStreamManager> {
    this.jsm ??= jetstreamManager(this.nc, { checkAPI: false });
    return this.jsm;
  }

  private async start(): Promise<void> {
    const jsm = await this.manager();
    // After the stream's last message now: the answers to requests not yet published. (nats.js
    // recreates the consumer from its last delivered sequence, here this one before any.)
    const last = (await jsm.streams.info(this.stream)).state.last_seq;
    const consumer = await jetstream(this.nc).consumers.get(this.stream, {
      filter_subjects: ANSWER_KINDS.map((k) => `${this.prefix}.run.*.*.${k}`),
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: last + 1,
      // Only a crashed plugin leaves it behind; the server then drops it after a minute.
      inactive_threshold: 60_000,
    });
    const messages = await consumer.consume({ max_messages: ANSWER_BATCH, expires: ANSWER_PULL_EXPIRES_MS });
    void this.deliver(messages);
  }

  private async deliver(messages: ConsumerMessages): Promise<void> {
    try {
      for await (const m of messages) {
        const dot = m.subject.lastIndexOf(".");
        const set = this.waiters.get(m.subject.slice(0, dot));
        if (!set) continue;
        const a: Answer = { kind: m.subject.slice(dot + 1), seq: m.seq, headers: m.headers, data: m.data };
        if (!ownAnswer(m.subject.slice(0, dot), a.headers, a.data, 0)) continue;
        for (const w of set) w.offer(a);
      }
    } catch {
      // Ended: the waiters read what they missed, below.
    }
    this.live = undefined;
    for (const set of this.waiters.values()) for (const w of set) w.reset();
  }
}

/**
 * A stored message's own stream sequence. A stored direct-get answer carries the copied
 * message's Nats-Sequence, and a direct get of it adds the server's after it: nats.js reads the
 * first, the copy's. The last is the message's own.
 */
export function storedSeq(h: MsgHdrs | undefined, seq: number): number {
  const v = h?.values("Nats-Sequence") ?? [];
  const last = Number(v[v.length - 1]);
  return v.length > 1 && Number.isSafeInteger(last) ? last : seq;
}

/**
 * Whether a message on the run subject base `<prefix>.run.<company>.<run>` may be kubeclip's
 * answer there: its payload names that company and run, and it is not a stored direct-get answer,
 * whose headers hold the server's Nats-Stream (kubeclip's events have none) beyond the `served`
 * the read that brought it adds (1 for a direct get, 0 for a consumer's delivery).
 */
export function ownAnswer(base: string, h: MsgHdrs | undefined, data: Uint8Array, served: number): boolean {
  if ((h?.values("Nats-Stream").length ?? 0) > served) return false;
  const tokens = base.split(".");
  const runId = tokens[tokens.length - 1];
  const companyId = tokens[tokens.length - 2];
  let ev: unknown;
  try {
    ev = JSON.parse(new TextDecoder().decode(data));
  } catch {
    return false;
  }
  if (typeof ev !== "object" || ev === null) return false;
  const o = ev as Record<string, unknown>;
  return o.companyId === companyId && o.runId === runId;
}
