// The plugin worker's state, held in one place (Provider), and the setup every hook shares,
// written once: a lease hook's lease (kubeclip's lease metadata and the company it acts for,
// Provider.lease) and what the hook acts with (the settings, the connection they name and the
// NATS connection, Provider.link). The hooks themselves are short functions over a Provider
// (plugin.ts, lifecycle.ts, commands.ts).

import type { NatsConnection } from "@nats-io/transport-node";
import type { PluginContext } from "@paperclipai/plugin-sdk";
import { Placeholders } from "./broker.js";
import { Executions, servesCancelExecution } from "./cancel.js";
import {
  DEFAULT_CONCURRENT_EXECUTES,
  SECRET_KEYS,
  isUnresolvedSecretRef,
  readEnvironmentKeys,
  readSettings,
  resolveConnection,
  splitConfig,
  type Connection,
  type PluginKeys,
} from "./config.js";
import { ConfigError, errorMessage } from "./errors.js";
import { runExec, type ExecOptions, type ExecResult, type ExecSpec } from "./exec.js";
import { isObject, type JsonObject } from "./json.js";
import { Leases, leaseKey } from "./leases.js";
import { ByteBudget, CompanyLimiter, OUTPUT_BUDGET_BYTES, OUTPUT_BUDGET_COMPANY_BYTES, OUTPUT_TAIL_FLOOR_BYTES, SYNC_OUT_COMPANY_BYTES } from "./limiter.js";
import { LoginTerminals } from "./loginpty.js";
import { REUSABLE_LEASES } from "./manifest.js";
import { ConnectionPool } from "./nats.js";
import { StatsBook } from "./stats.js";

/** Where the workspace lives in kubeclip's pods. */
export const REMOTE_CWD = "/workspace";
/** Budget of acquire/release without `timeoutMs`: under Paperclip's 30 s RPC default. */
export const DEFAULT_RPC_BUDGET_MS = 25_000;
/** Budget of api.validate: under Paperclip's 30 s RPC default. */
export const VALIDATE_BUDGET_MS = 10_000;
/** How long ping replies are collected. */
export const PING_WINDOW_MS = 500;
/** The most leases remembered for login terminals (oldest forgotten first). */
export const LEASE_BOOK_SIZE = 10_000;

export interface PluginOptions {
  /** Exec client tuning (tests shorten the resume silence). */
  exec?: { silenceMs?: number; graceMs?: number; maxOutputBytes?: number };
  /** How long an execute waits for a slot of its company (default 60 s; tests shorten it). */
  executeSlotWaitMs?: number;
  /** Whether an acquire may ask for a reusable lease (default: the manifest's REUSABLE_LEASES). */
  reusableLeases?: boolean;
  /** How long a brokered key's mint may take (default broker.MINT_TIMEOUT_MS; tests shorten it). */
  mintTimeoutMs?: number;
  /**
   * Whether the worker serves environmentCancelExecution (default: whether the installed SDK
   * knows the method, cancel.ts servesCancelExecution; tests force it on).
   */
  cancelExecution?: boolean;
}

/** kubeclip's state in lease metadata: one key, because metadata keys override config keys. */
export interface KubeclipLeaseMetadata {
  runId: string;
  companyId: string;
  namespace: string;
  workloadName: string;
  backend: string;
  adapterType?: string;
  /** A reusable lease (acquired with reuseLease): the host resumes it for the agent's next run. */
  reusable?: boolean;
  /** How often it was resumed; names each run's release (releaseId). */
  resumes?: number;
}

/** A lease hook's lease: kubeclip's metadata, and the company the hook acts for. */
export interface LeaseRef {
  meta: KubeclipLeaseMetadata;
  companyId: string;
}

/** What a hook acts with: the plugin settings, the connection they name, and NATS over it. */
export interface Link {
  settings: PluginKeys;
  conn: Connection;
  nc: NatsConnection;
}

/** A lease this worker acquired or resumed, as a login terminal's open finds it. */
export interface HeldLease {
  runId: string;
  companyId: string;
  backend: string;
  config: JsonObject;
}

/** The worker's state, and the setup every hook shares. */
export class Provider {
  readonly options: PluginOptions;
  readonly pool = new ConnectionPool();
  readonly reusableLeases: boolean;
  /** Whether environmentCancelExecution is served. */
  readonly cancels: boolean;
  /** Executes in flight by the host's exact identity, for environmentCancelExecution. */
  readonly executions = new Executions();
  /**
   * In-flight executes per company and lease (leaseKey), aborted by that company's release with
   * cancelActiveWork once kubeclip answered it.
   */
  readonly inflight = new Map<string, Set<AbortController>>();
  /** Hook calls and execute durations per company and lease (leaseKey), logged when it ends. */
  readonly stats = new StatsBook();
  /** Executes in flight per company, bounded by settings.maxConcurrentExecutesPerCompany. */
  readonly limiter: CompanyLimiter;
  /** Execute output held at once, all companies together (limiter.ts). */
  readonly outputBudget = new ByteBudget(OUTPUT_BUDGET_BYTES, OUTPUT_BUDGET_COMPANY_BYTES, OUTPUT_TAIL_FLOOR_BYTES);
  /** Brokered keys' placeholders per company and lease (broker.ts), forgotten at the lease's end. */
  readonly placeholders: Placeholders;
  /** Sync-out bytes being extracted at once, per company (limiter.ts). */
  readonly syncOutBudget = new ByteBudget(Number.MAX_SAFE_INTEGER, SYNC_OUT_COMPANY_BYTES);
  /**
   * The leases this worker acquired or resumed and has not ended, by company and lease
   * (leaseKey): a login terminal's open names the lease (the host acquired it through this
   * worker just before), and finds only a lease of the opening company. Another company's
   * acquire answered with the same id neither replaces nor ends it.
   */
  readonly leaseBook = new Map<string, HeldLease>();
  readonly terminals: LoginTerminals;
  /**
   * Plugin settings delivered by configChanged, per company (null: an instance-wide save).
   * validateConfig has no company: it uses them only when every company has the same.
   */
  readonly deliveredByCompany = new Map<string | null, JsonObject>();
  /**
   * Lease requests per connection and subject prefix, kept: each one's waits share one consumer
   * of the runs' answers (answers.ts), not one per lease in flight. A closed connection's go
   * with it.
   */
  private readonly leasesByConn = new WeakMap<NatsConnection, Map<string, Leases>>();
  private ctx: PluginContext | undefined;

  constructor(options: PluginOptions) {
    this.options = options;
    this.reusableLeases = options.reusableLeases ?? REUSABLE_LEASES;
    this.cancels = options.cancelExecution ?? servesCancelExecution();
    this.limiter = new CompanyLimiter(options.executeSlotWaitMs);
    this.placeholders = new Placeholders(undefined, options.mintTimeoutMs);
    this.terminals = new LoginTerminals(() => this.context().loginPty);
  }

  setup(c: PluginContext): void {
    this.ctx = c;
  }

  context(): PluginContext {
    if (!this.ctx) throw new Error("plugin used before setup");
    return this.ctx;
  }

  leasesOn(nc: NatsConnection, prefix: string): Leases {
    let byPrefix = this.leasesByConn.get(nc);
    if (!byPrefix) this.leasesByConn.set(nc, (byPrefix = new Map<string, Leases>()));
    let l = byPrefix.get(prefix);
    if (!l) byPrefix.set(prefix, (l = new Leases(nc, prefix)));
    return l;
  }

  remember(providerLeaseId: string, lease: HeldLease): void {
    const key = leaseKey(lease.companyId, providerLeaseId);
    this.leaseBook.delete(key);
    this.leaseBook.set(key, lease);
    for (const oldest of this.leaseBook.keys()) {
      if (this.leaseBook.size <= LEASE_BOOK_SIZE) break;
      this.leaseBook.delete(oldest);
    }
  }

  /** The settings every company was delivered, when they are the same for all. */
  private delivered(): { config: JsonObject; companyId: string | null } | undefined {
    const entries = [...this.deliveredByCompany.entries()];
    const first = entries[0];
    if (!first) return undefined;
    const same = entries.every(([, c]) => JSON.stringify(c) === JSON.stringify(first[1]));
    return same ? { config: first[1], companyId: first[0] } : undefined;
  }

  /** The plugin settings with secret bindings resolved; {} when there are none. */
  async settings(companyId: string | undefined): Promise<PluginKeys> {
    let raw: JsonObject | undefined;
    let cid = companyId;
    if (companyId) {
      const got = await within(this.context().config.get(companyId), 5_000, "reading the plugin settings").catch(() => undefined);
      if (isObject(got) && Object.keys(got).length > 0) raw = got;
    } else {
      const d = this.delivered();
      raw = d?.config;
      cid = d?.companyId ?? undefined;
    }
    if (!raw) return {};
    const resolved: JsonObject = { ...raw };
    for (const key of SECRET_KEYS) {
      const v = raw[key];
      if (v !== undefined) resolved[key] = await this.resolveSecret(v, key, cid);
    }
    return readSettings(resolved);
  }

  /** One secret-bearing setting: a secret reference resolved for the company, anything else as is. */
  private async resolveSecret(v: unknown, key: string, companyId: string | undefined): Promise<unknown> {
    if (isObject(v) && v.type === "secret_ref" && typeof v.secretId === "string") {
      if (!companyId) return undefined;
      return within(
        this.context().secrets.resolve({ type: "secret_ref", secretId: v.secretId }, { companyId, configPath: key }),
        5_000,
        `resolving settings.${key}`,
      ).catch((err: unknown) => {
        throw new ConfigError(`settings.${key}`, `the secret could not be resolved (${errorMessage(err)})`);
      });
    }
    if (isUnresolvedSecretRef(v)) throw new ConfigError(`settings.${key}`, "is a bare secret id; bind it as a secret reference");
    return v;
  }

  /**
   * A hook's settings and connection: the settings' alone. The environment config (the
   * company's) may set only the RPC budget; a connection key there is refused before anything
   * connects.
   */
  async connection(companyId: string | undefined, config: JsonObject): Promise<{ settings: PluginKeys; conn: Connection }> {
    const env = readEnvironmentKeys(splitConfig(config).plugin);
    const settings = await this.settings(companyId);
    return { settings, conn: resolveConnection(settings, env) };
  }

  /**
   * What a hook acts with: its settings, its connection, and NATS over it. check runs before
   * anything connects: what it refuses (a brokered key's value in the config) is refused
   * without a connection.
   */
  async link(companyId: string | undefined, config: JsonObject, check?: (settings: PluginKeys) => void): Promise<Link> {
    const { settings, conn } = await this.connection(companyId, config);
    check?.(settings);
    return { settings, conn, nc: await this.pool.get(conn) };
  }

  /**
   * A lease hook's lease: kubeclip's lease metadata (where names the field it came in), and the
   * company the hook acts for: Paperclip's (params.companyId, which the host sets from its own
   * lease record, `lease.companyId` in environment-runtime.js). The lease metadata's copy is
   * only checked: a lease of another company is refused, never acted on.
   */
  lease(metadata: unknown, hostCompanyId: string, where: string): LeaseRef {
    const meta = leaseMetadata(metadata, where);
    if (!hostCompanyId) throw new Error("companyId: Paperclip sent no company id; refused");
    if (meta.companyId && meta.companyId !== hostCompanyId) {
      throw new Error(`${where}.kubeclip.companyId: the lease is company ${meta.companyId}'s, not this call's company ${hostCompanyId}; refused`);
    }
    return { meta, companyId: hostCompanyId };
  }

  /** A lease hook's whole setup: its lease, then what it acts with (the host company's settings). */
  async onLease(metadata: unknown, hostCompanyId: string, where: string, config: JsonObject): Promise<LeaseRef & Link> {
    const ref = this.lease(metadata, hostCompanyId, where);
    return { ...ref, ...(await this.link(ref.companyId, config)) };
  }

  /**
   * One command on a lease through kubeclip's exec service, within the company's slots and
   * cancelled with the lease's in-flight work (release with cancelActiveWork, shutdown).
   */
  async runOnLease(link: Link, spec: ExecSpec, opts: ExecOptions): Promise<ExecResult> {
    const controller = new AbortController();
    // The caller's own stop (a login terminal's) stops it too.
    const stop = (): void => {
      controller.abort();
    };
    if (opts.signal?.aborted) stop();
    else opts.signal?.addEventListener("abort", stop, { once: true });
    const key = leaseKey(spec.companyId, spec.providerLeaseId);
    let set = this.inflight.get(key);
    if (!set) this.inflight.set(key, (set = new Set()));
    set.add(controller);
    let release: (() => void) | undefined;
    try {
      release = await this.limiter.acquire(spec.companyId, link.settings.maxConcurrentExecutesPerCompany ?? DEFAULT_CONCURRENT_EXECUTES, controller.signal);
      return await runExec(link.nc, link.conn.prefix, spec, {
        ...opts,
        signal: controller.signal,
        inboxPrefix: link.conn.inboxPrefix,
        outputBudget: this.outputBudget,
        ...this.options.exec,
      });
    } finally {
      opts.signal?.removeEventListener("abort", stop);
      release?.();
      set.delete(controller);
      if (set.size === 0) this.inflight.delete(key);
    }
  }
}

/** kubeclip's lease metadata; where names the field it came in. */
export function leaseMetadata(metadata: unknown, where: string): KubeclipLeaseMetadata {
  const k = isObject(metadata) ? metadata.kubeclip : undefined;
  if (!isObject(k) || typeof k.runId !== "string" || k.runId === "" || typeof k.companyId !== "string") {
    throw new Error(`${where}.kubeclip.runId: missing; this lease was not acquired by the kubeclip plugin`);
  }
  return {
    runId: k.runId,
    companyId: k.companyId,
    namespace: typeof k.namespace === "string" ? k.namespace : "",
    workloadName: typeof k.workloadName === "string" ? k.workloadName : "",
    backend: typeof k.backend === "string" ? k.backend : "",
    ...(typeof k.adapterType === "string" ? { adapterType: k.adapterType } : {}),
    ...(k.reusable === true ? { reusable: true } : {}),
    ...(typeof k.resumes === "number" && Number.isSafeInteger(k.resumes) && k.resumes >= 0 ? { resumes: k.resumes } : {}),
  };
}

/** p, or a rejection after ms naming what timed out. */
async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        t = setTimeout(() => {
          reject(new Error(`${what} took longer than ${ms} ms`));
        }, ms);
      }),
    ]);
  } finally {
    clearTimeout(t);
  }
}
