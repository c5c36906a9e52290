// Brokered keys (issue 27): the operator names the keys kubeclip's credential broker holds
// (settings.brokeredKeys); before the plugin publishes an execute's environment it replaces each
// one's real value with the lease's placeholder, minted by the broker over core NATS
// (pkg/broker/mintproto): it asks the broker's X25519 public key (<prefix>.broker.key →
// {publicKey}), seals the value to it (sealValue), and sends
// <prefix>.broker.<companyId>.<runId>.mint {leaseId, key, ephemeralKey, nonce, ciphertext} →
// {placeholder, grantId, hosts, error}, answered into the plugin's inbox. The value never
// crosses NATS readable: only the broker's key opens it, and only for that company, run, lease
// and key. The pod gets the placeholder; the broker swaps the real value in only on the way to
// the key's bound hosts.
//
// It fails closed: a broker that is down, slow or refuses fails the execute with an error naming
// the key and the reason, and the real value is never sent instead. The value is never logged,
// never put in an error, and not kept after its mint: the cache holds a keyed hash of it (to see
// a changed value, which the broker re-mints into the same grant) and the placeholder.

import { createCipheriv, createHmac, createPublicKey, diffieHellman, generateKeyPairSync, hkdfSync, randomBytes, type KeyObject } from "node:crypto";
import { errors, type NatsConnection } from "@nats-io/transport-node";
import { isObject } from "./json.js";
import { leaseKey } from "./leases.js";

/** The placeholder's shape (pkg/broker/placeholder.go): kcph_ + 16 bytes + _ + 32 bytes, base64url. */
const PLACEHOLDER_RE = /^kcph_[A-Za-z0-9_-]{22}_[A-Za-z0-9_-]{43}$/;
/** A mint is a few KV writes on the broker (its own bound is 5 s): past this the execute fails. */
export const MINT_TIMEOUT_MS = 10_000;
/** The most leases whose placeholders one company keeps cached (oldest forgotten first). */
export const BROKERED_LEASES_PER_COMPANY = 1_000;
/** The most of a broker's refusal message an error carries. */
const MAX_REASON_CHARS = 300;

/** HKDF's info, as pkg/broker/mintproto.SealInfo. */
const SEAL_INFO = "kubeclip credential broker mint v1";
/** The additional data's label, as pkg/broker/mintproto's aadLabel. */
const AAD_LABEL = "kubeclip mint v1";
/** An X25519 public key's length, and the AES-GCM nonce's. */
const KEY_LEN = 32;
const NONCE_LEN = 12;

/**
 * The additional data of a value sealed for one grant (pkg/broker/mintproto.AAD): the label,
 * then company, run, lease and key, each as a 4-byte big-endian length and its UTF-8 bytes.
 */
export function mintAAD(companyId: string, runId: string, leaseId: string, key: string): Buffer {
  const parts: Buffer[] = [Buffer.from(AAD_LABEL)];
  for (const s of [companyId, runId, leaseId, key]) {
    const b = Buffer.from(s, "utf8");
    const n = Buffer.alloc(4);
    n.writeUInt32BE(b.length);
    parts.push(n, b);
  }
  return Buffer.concat(parts);
}

/** A value sealed to the broker: the mint request's three fields, base64. */
export interface SealedValue {
  ephemeralKey: string;
  nonce: string;
  ciphertext: string;
}

/** The raw 32 bytes of an X25519 public key. */
export function rawPublicKey(k: KeyObject): Buffer {
  const x = k.export({ format: "jwk" }).x;
  if (typeof x !== "string") throw new Error("not an X25519 public key");
  return Buffer.from(x, "base64url");
}

/** The X25519 public key of raw bytes (the broker's key answer). */
export function x25519PublicKey(raw: Buffer): KeyObject {
  if (raw.length !== KEY_LEN) throw new Error("not an X25519 public key");
  return createPublicKey({ key: { kty: "OKP", crv: "X25519", x: raw.toString("base64url") }, format: "jwk" });
}

/**
 * value sealed to the broker's public key for the grant aad names, as pkg/broker/mintproto.Seal:
 * a fresh ephemeral X25519 key pair, the shared secret through HKDF-SHA256 (salt: the ephemeral
 * public key then the broker's; info SEAL_INFO) to an AES-256-GCM key, a random nonce, aad as
 * additional data; the ciphertext carries the tag last, as Go's GCM does. `fixed` pins the
 * ephemeral key and nonce (tests: the vector Go's TestOpensThePluginsSeal opens).
 */
export function sealValue(broker: KeyObject, aad: Buffer, value: string, fixed?: { ephemeral: KeyObject; nonce: Buffer }): SealedValue {
  const ephemeral = fixed?.ephemeral ?? generateKeyPairSync("x25519").privateKey;
  const ephemeralPub = rawPublicKey(createPublicKey(ephemeral));
  const shared = diffieHellman({ privateKey: ephemeral, publicKey: broker });
  const key = Buffer.from(hkdfSync("sha256", shared, Buffer.concat([ephemeralPub, rawPublicKey(broker)]), SEAL_INFO, 32));
  shared.fill(0);
  const nonce = fixed?.nonce ?? randomBytes(NONCE_LEN);
  const cipher = createCipheriv("aes-256-gcm", key, nonce);
  key.fill(0);
  cipher.setAAD(aad);
  const ct = Buffer.concat([cipher.update(value, "utf8"), cipher.final(), cipher.getAuthTag()]);
  return { ephemeralKey: ephemeralPub.toString("base64"), nonce: nonce.toString("base64"), ciphertext: ct.toString("base64") };
}

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

/** The broker's public key could not be had; reason names no value. */
class KeyUnavailable extends Error {
  override name = "KeyUnavailable";
  readonly reason: string;
  constructor(reason: string) {
    super(reason);
    this.reason = reason;
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
 * One lease's placeholders: its latest run's, by key. A reusable lease's next run mints again
 * (the broker moves the lease's grant to that run), so an earlier run's are dropped: a lease
 * holds at most one placeholder per brokered key however many runs it serves.
 */
interface LeaseMints {
  runId: string;
  byKey: Map<string, Minted>;
}

/**
 * The placeholders of the leases this worker serves, by company, lease and key: one mint per
 * lease, run and key (a repeated execute reuses it; a changed value mints again into the same
 * grant), bounded per company like the plugin's other per-lease state.
 */
export class Placeholders {
  /** companyId → leaseKey → its mints. Maps keep insertion order: least recently used first. */
  private readonly byCompany = new Map<string, Map<string, LeaseMints>>();
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
   * An empty value, or one that is a placeholder already, is kept. Another key holding a
   * brokered key's value (an alias the company set up) gets the same placeholder: the value is
   * what must not leave, whatever its name. Throws a BrokerError naming the first key the broker
   * did not answer for.
   */
  async replace(nc: NatsConnection, prefix: string, keys: readonly string[], ref: LeaseRef, env: Record<string, string>): Promise<Record<string, string>> {
    const todo = keys.filter((k) => {
      const v = env[k];
      return typeof v === "string" && v !== "" && !isPlaceholder(v);
    });
    if (todo.length === 0) return env;
    const out = { ...env };
    // The broker's key is asked once per call, and only if a mint is needed (a cached
    // placeholder needs none); never kept past the call, so a rotated key is never stale.
    let brokerKey: Promise<KeyObject> | undefined;
    const keyOf = (): Promise<KeyObject> => (brokerKey ??= this.brokerKey(nc, prefix));
    const got = await Promise.allSettled(todo.map((k) => this.placeholder(nc, prefix, ref, k, env[k] as string, keyOf)));
    const byValue = new Map<string, string>();
    for (const [i, g] of got.entries()) {
      const k = todo[i] as string;
      if (g.status === "rejected") throw g.reason instanceof BrokerError ? g.reason : new BrokerError(k, "the mint failed");
      out[k] = g.value;
      if (!byValue.has(env[k] as string)) byValue.set(env[k] as string, g.value);
    }
    for (const [k, v] of Object.entries(env)) {
      const p = keys.includes(k) ? undefined : byValue.get(v);
      if (p !== undefined) out[k] = p;
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

  /** Placeholders cached for a company's lease (tests). */
  cached(companyId: string, providerLeaseId: string): number {
    return this.byCompany.get(companyId)?.get(leaseKey(companyId, providerLeaseId))?.byKey.size ?? 0;
  }

  private placeholder(nc: NatsConnection, prefix: string, ref: LeaseRef, key: string, value: string, brokerKey: () => Promise<KeyObject>): Promise<string> {
    const hash = createHmac("sha256", this.hashKey).update(value).digest("hex");
    const lk = leaseKey(ref.companyId, ref.providerLeaseId);
    let leases = this.byCompany.get(ref.companyId);
    if (!leases) this.byCompany.set(ref.companyId, (leases = new Map<string, LeaseMints>()));
    let lease = leases.get(lk);
    // Used now: the lease moves to the end, so the bound forgets the least recently used.
    leases.delete(lk);
    if (!lease || lease.runId !== ref.runId) lease = { runId: ref.runId, byKey: new Map<string, Minted>() };
    leases.set(lk, lease);
    for (const oldest of leases.keys()) {
      if (leases.size <= this.perCompany) break;
      leases.delete(oldest);
    }
    const byKey = lease.byKey;
    const cached = byKey.get(key);
    if (cached && cached.hash === hash) return cached.placeholder;
    const placeholder = this.mint(nc, prefix, ref, key, value, brokerKey);
    const entry: Minted = { hash, placeholder };
    byKey.set(key, entry);
    // A failed mint is not cached: the next execute asks again.
    placeholder.catch(() => {
      if (byKey.get(key) === entry) byKey.delete(key);
    });
    return placeholder;
  }

  /** The broker's public key (pkg/broker/mintproto: <prefix>.broker.key); rejects with a BrokerError-ready reason. */
  private async brokerKey(nc: NatsConnection, prefix: string): Promise<KeyObject> {
    let data: Uint8Array;
    try {
      data = (await nc.request(`${prefix}.broker.key`, "", { timeout: this.timeoutMs })).data;
    } catch (err) {
      throw new KeyUnavailable(this.requestFailure(err));
    }
    let reply: unknown;
    try {
      reply = JSON.parse(new TextDecoder().decode(data));
    } catch {
      throw new KeyUnavailable("the broker's key answer is not JSON");
    }
    if (!isObject(reply) || typeof reply.publicKey !== "string") throw new KeyUnavailable("the broker's key answer holds no public key");
    try {
      return x25519PublicKey(Buffer.from(reply.publicKey, "base64"));
    } catch {
      throw new KeyUnavailable("the broker's key answer holds no X25519 public key");
    }
  }

  private async mint(nc: NatsConnection, prefix: string, ref: LeaseRef, key: string, value: string, brokerKey: () => Promise<KeyObject>): Promise<string> {
    const subject = `${prefix}.broker.${ref.companyId}.${ref.runId}.mint`;
    let sealed: SealedValue;
    try {
      sealed = sealValue(await brokerKey(), mintAAD(ref.companyId, ref.runId, ref.providerLeaseId, key), value);
    } catch (err) {
      // The key's reasons name no value; a failed seal says only that it failed.
      throw new BrokerError(key, err instanceof KeyUnavailable ? err.reason : "sealing the value to the broker's key failed");
    }
    this.mints++;
    let data: Uint8Array;
    try {
      // Core NATS request/reply, never JetStream: a value is never stored in a stream, and it
      // goes sealed (only the broker's key opens it). The reply comes to the connection's inbox
      // prefix (_INBOX_paperclip).
      const m = await nc.request(subject, JSON.stringify({ leaseId: ref.providerLeaseId, key, ...sealed }), { timeout: this.timeoutMs });
      data = m.data;
    } catch (err) {
      // Classified by the client's error types; its message is not passed on (it could name the
      // subject's ids, never the payload, but the reason is all the caller needs).
      throw new BrokerError(key, this.requestFailure(err));
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
      // The broker's messages name fields and budgets, never values; cut to a line's length.
      const message = typeof e.message === "string" ? e.message.slice(0, MAX_REASON_CHARS) : "";
      throw new BrokerError(key, `the broker refused (${code}: ${field}${message})`);
    }
    const p = reply.placeholder;
    if (typeof p !== "string" || !isPlaceholder(p)) throw new BrokerError(key, "the broker's answer holds no well-formed placeholder");
    return p;
  }

  private requestFailure(err: unknown): string {
    if (err instanceof errors.NoRespondersError || (err instanceof errors.RequestError && err.isNoResponders())) {
      return "no broker answers (it is down or not deployed)";
    }
    if (err instanceof errors.TimeoutError) {
      return `the broker did not answer within ${this.timeoutMs} ms`;
    }
    return "the mint request failed";
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
  const refused: string[] = [];
  for (const [i, a] of adapters.entries()) {
    const env = isObject(a) ? a.defaultEnv : undefined;
    if (!isObject(env)) continue;
    for (const k of keys) {
      const v = env[k];
      if (typeof v === "string" && (v === "" || isPlaceholder(v))) continue;
      if (v === undefined) continue;
      refused.push(
        `config.adapters[${i}].defaultEnv.${k}: is brokered (the plugin's settings.brokeredKeys): its value would go into the run's Secret, and an acquire has no lease yet to mint a placeholder for; remove it and give the key through Paperclip's secrets (each execute then carries its placeholder)`,
      );
    }
  }
  return refused;
}
