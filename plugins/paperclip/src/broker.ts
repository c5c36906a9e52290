// Brokered keys (issue 27): the operator names the keys kubeclip's credential broker holds
// (settings.brokeredKeys); before the plugin publishes an execute's environment it replaces each
// one's real value with the lease's placeholder, minted by the broker over core NATS
// (pkg/broker/mintproto: <prefix>.broker.<companyId>.<runId>.mint, {leaseId, key, value} →
// {placeholder, grantId, hosts, error}, answered into the plugin's inbox). The pod gets the
// placeholder; the broker swaps the real value in only on the way to the key's bound hosts.
//
// It fails closed: a broker that is down, slow or refuses fails the execute with an error naming
// the key and the reason, and the real value is never sent instead. The value is never logged,
// never put in an error, and not kept after its mint: the cache holds a keyed hash of it (to see
// a changed value, which the broker re-mints into the same grant) and the placeholder.

import { createHmac, randomBytes } from "node:crypto";
import type { NatsConnection } from "@nats-io/transport-node";
import { errorMessage } from "./errors.js";
import { isObject } from "./json.js";
import { leaseKey } from "./leases.js";

/** The placeholder's shape (pkg/broker/placeholder.go): kcph_ + 16 bytes + _ + 32 bytes, base64url. */
const PLACEHOLDER_RE = /^kcph_[A-Za-z0-9_-]{22}_[A-Za-z0-9_-]{43}$/;
/** A mint is a few KV writes on the broker (its own bound is 5 s): past this the execute fails. */
export const MINT_TIMEOUT_MS = 10_000;
/** The most leases whose placeholders one company keeps cached (oldest forgotten first). */
export const BROKERED_LEASES_PER_COMPANY = 1_000;

/** Whether v is a placeholder already (the broker refuses to mint one, and it is no secret). */
export function isPlaceholder(v: string): boolean {
  return PLACEHOLDER_RE.test(v);
}

/** A brokered key whose placeholder could not be had: the message names the key, never its value. */
export class BrokerError extends Error {
  override name = "BrokerError";
  readonly key: string;
  constructor(key: string, reason: string) {
    super(`env.${key}: is brokered (settings.brokeredKeys) but the credential broker gave no placeholder for it: ${reason}; nothing was sent (a brokered key never leaves the plugin as its real value)`);
    this.key = key;
  }
}

export interface LeaseRef {
  companyId: string;
  runId: string;
  providerLeaseId: string;
}

interface Minted {
  /** HMAC of the value under the process's key: the value itself is not kept. */
  hash: string;
  placeholder: Promise<string>;
}

/**
 * The placeholders of the leases this worker serves, by company, lease, run and key: one mint per
 * lease, run and key (a repeated execute reuses it; a changed value mints again into the same
 * grant), bounded per company like the plugin's other per-lease state.
 */
export class Placeholders {
  /** companyId → leaseKey → `${runId}\0${key}` → minted. Maps keep insertion order: oldest first. */
  private readonly byCompany = new Map<string, Map<string, Map<string, Minted>>>();
  private readonly hashKey = randomBytes(32);
  private readonly perCompany: number;
  private readonly timeoutMs: number;
  /** Mint requests sent (tests). */
  mints = 0;

  constructor(perCompany = BROKERED_LEASES_PER_COMPANY, timeoutMs = MINT_TIMEOUT_MS) {
    this.perCompany = perCompany;
    this.timeoutMs = timeoutMs;
  }

  /**
   * env with every brokered key's value replaced by its placeholder (env itself is not changed).
   * An empty value, or one that is a placeholder already, is kept. Throws a BrokerError naming the
   * first key the broker did not answer for.
   */
  async replace(nc: NatsConnection, prefix: string, keys: readonly string[], ref: LeaseRef, env: Record<string, string>): Promise<Record<string, string>> {
    const todo = keys.filter((k) => {
      const v = env[k];
      return typeof v === "string" && v !== "" && !isPlaceholder(v);
    });
    if (todo.length === 0) return env;
    const out = { ...env };
    const got = await Promise.allSettled(todo.map((k) => this.placeholder(nc, prefix, ref, k, env[k] as string)));
    for (const [i, g] of got.entries()) {
      const k = todo[i] as string;
      if (g.status === "rejected") throw g.reason instanceof BrokerError ? g.reason : new BrokerError(k, "the mint failed");
      out[k] = g.value;
    }
    return out;
  }

  /** Forgets a lease's placeholders (its release or destroy was answered: the broker ends its grants). */
  forget(companyId: string, providerLeaseId: string): void {
    const leases = this.byCompany.get(companyId);
    if (!leases) return;
    leases.delete(leaseKey(companyId, providerLeaseId));
    if (leases.size === 0) this.byCompany.delete(companyId);
  }

  /** Leases cached for a company (tests). */
  leases(companyId: string): number {
    return this.byCompany.get(companyId)?.size ?? 0;
  }

  private placeholder(nc: NatsConnection, prefix: string, ref: LeaseRef, key: string, value: string): Promise<string> {
    const hash = createHmac("sha256", this.hashKey).update(value).digest("hex");
    const lk = leaseKey(ref.companyId, ref.providerLeaseId);
    let leases = this.byCompany.get(ref.companyId);
    if (!leases) this.byCompany.set(ref.companyId, (leases = new Map<string, Map<string, Minted>>()));
    let lease = leases.get(lk);
    if (!lease) {
      leases.set(lk, (lease = new Map<string, Minted>()));
      for (const oldest of leases.keys()) {
        if (leases.size <= this.perCompany) break;
        leases.delete(oldest);
      }
    }
    const slot = `${ref.runId}\u0000${key}`;
    const cached = lease.get(slot);
    if (cached && cached.hash === hash) return cached.placeholder;
    const placeholder = this.mint(nc, prefix, ref, key, value);
    const entry: Minted = { hash, placeholder };
    lease.set(slot, entry);
    const l = lease;
    // A failed mint is not cached: the next execute asks again.
    placeholder.catch(() => {
      if (l.get(slot) === entry) l.delete(slot);
    });
    return placeholder;
  }

  private async mint(nc: NatsConnection, prefix: string, ref: LeaseRef, key: string, value: string): Promise<string> {
    const subject = `${prefix}.broker.${ref.companyId}.${ref.runId}.mint`;
    this.mints++;
    let data: Uint8Array;
    try {
      // Core NATS request/reply, never JetStream: a real value is never stored in a stream. The
      // reply comes to the connection's inbox prefix (_INBOX_paperclip).
      const m = await nc.request(subject, JSON.stringify({ leaseId: ref.providerLeaseId, key, value }), { timeout: this.timeoutMs });
      data = m.data;
    } catch (err) {
      // The client's message names the subject at most; it never quotes the payload.
      const msg = errorMessage(err);
      const reason = /no responders|503/i.test(msg)
        ? "no broker answers (it is down or not deployed)"
        : /timeout/i.test(msg)
          ? `the broker did not answer within ${this.timeoutMs} ms`
          : "the mint request failed";
      throw new BrokerError(key, reason);
    }
    let reply: unknown;
    try {
      reply = JSON.parse(new TextDecoder().decode(data));
    } catch {
      throw new BrokerError(key, "the broker's answer is not JSON");
    }
    if (!isObject(reply)) throw new BrokerError(key, "the broker's answer is not a JSON object");
    const e = reply.error;
    if (isObject(e)) {
      const code = typeof e.code === "string" ? e.code : "error";
      const field = typeof e.field === "string" && e.field !== "" ? `${e.field}: ` : "";
      // The broker's messages name fields and budgets, never values.
      throw new BrokerError(key, `the broker refused (${code}: ${field}${typeof e.message === "string" ? e.message : ""})`);
    }
    const p = reply.placeholder;
    if (typeof p !== "string" || !isPlaceholder(p)) throw new BrokerError(key, "the broker's answer holds no well-formed placeholder");
    return p;
  }
}

/**
 * The brokered keys an environment config sets in an adapter's defaultEnv, as `config.x: message`
 * errors. kubeclip writes defaultEnv into the run's Secret, and an acquire has no lease yet to
 * mint a placeholder for, so with brokering on such a value is refused, never sent.
 */
export function brokeredDefaults(provider: Record<string, unknown>, keys: readonly string[]): string[] {
  const adapters = provider.adapters;
  if (keys.length === 0 || !Array.isArray(adapters)) return [];
  const errors: string[] = [];
  for (const [i, a] of adapters.entries()) {
    const env = isObject(a) ? a.defaultEnv : undefined;
    if (!isObject(env)) continue;
    for (const k of keys) {
      const v = env[k];
      if (typeof v === "string" && (v === "" || isPlaceholder(v))) continue;
      if (v === undefined) continue;
      errors.push(
        `config.adapters[${i}].defaultEnv.${k}: is brokered (the plugin's settings.brokeredKeys): its value would go into the run's Secret, and an acquire has no lease yet to mint a placeholder for; remove it and give the key through Paperclip's secrets (each execute then carries its placeholder)`,
      );
    }
  }
  return errors;
}
