// The hooks of the `kubernetes` sandbox provider, mapped onto kubeclip:
//
//   validateConfig   → <prefix>.api.validate (pkg/policy's verdict), core NATS request
//   probe            → NATS + JetStream stream info + <prefix>.api.ping
//   acquireLease     → JetStream lease request `acquire`, wait for `created`/`failed`
//   realizeWorkspace → nothing to do: the pod's /workspace is the workspace
//   execute          → the exec protocol (exec.ts) on core NATS, output streamed live
//   cancelExecution  → that one execute's exec killed (SIGKILL through the exec service), when
//                      the installed SDK knows the method (cancel.ts)
//   syncIn/syncOut   → sandboxd untar/tar over the same exec protocol, tar streams (sync.ts)
//   release/destroy  → JetStream lease request, wait for `released`/`failed` (the receipt);
//                      a lease kubeclip or the plugin does not know: a receipt that nothing is
//                      there (unknownLeaseReceipt)
//   onLoginPty*      → a login command on a terminal exec in a lease's pod (loginpty.ts)
//
// Logs carry run and lease ids only: never config values, env, stdin or credentials.

import { AsyncResource } from "node:async_hooks";
import { randomUUID } from "node:crypto";
import { jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  definePlugin,
  type PaperclipPlugin,
  type PluginContext,
  type PluginEnvironmentDestroyLeaseParams,
  type PluginEnvironmentExecuteParams,
  type PluginEnvironmentExecuteResult,
  type PluginEnvironmentLease,
  type PluginEnvironmentProbeResult,
  type PluginEnvironmentReleaseLeaseParams,
  type PluginEnvironmentSyncInParams,
  type PluginEnvironmentSyncOutParams,
  type PluginEnvironmentSyncResult,
  type PluginEnvironmentResumeLeaseParams,
  type PluginEnvironmentTerminationReceipt,
  type PluginEnvironmentValidationResult,
} from "@paperclipai/plugin-sdk";
import type { PluginLoginPtyCloseResult, PluginLoginPtyOpenParams, PluginLoginPtyOpenResult } from "@paperclipai/plugin-sdk/protocol";
import { isAgentCommand } from "./agent.js";
import { WORKER_KINDS, ping, validateConfig } from "./api.js";
import { Placeholders, brokeredDefaults } from "./broker.js";
import {
  DEFAULT_CONCURRENT_EXECUTES,
  DEFAULT_EXECUTE_OUTPUT_BYTES,
  DEFAULT_SYNC_OUT_BYTES,
  DEFAULT_SYNC_OUT_FILES,
  EXEC_BACKENDS,
  SECRET_KEYS,
  checkProviderConfig,
  isUnresolvedSecretRef,
  normalizedConfig,
  readEnvironmentKeys,
  readSettings,
  resolveConnection,
  splitConfig,
  type Connection,
  type PluginKeys,
} from "./config.js";
import { Executions, checkCancel, executionIdOf, servesCancelExecution, type CancelExecutionResult } from "./cancel.js";
import { EnvPolicy } from "./envpolicy.js";
import { ConfigError, KubeclipError, TimeoutError, UnreachableError, errorMessage, scrub } from "./errors.js";
import { runExec, type ExecOptions, type ExecResult, type ExecSpec } from "./exec.js";
import { ByteBudget, CompanyLimiter, OUTPUT_BUDGET_BYTES, OUTPUT_BUDGET_COMPANY_BYTES, OUTPUT_TAIL_FLOOR_BYTES, SYNC_OUT_COMPANY_BYTES } from "./limiter.js";
import { findCaseVariantKey, isObject, type JsonObject } from "./json.js";
import { Leases, leaseKey } from "./leases.js";
import { REUSABLE_LEASES } from "./manifest.js";
import { LiveLog } from "./livelog.js";
import { LOGIN_OUTPUT_BYTES, LOGIN_TIMEOUT_MS, LOGIN_TTY, LoginTerminals, checkOpen, loginExec } from "./loginpty.js";
import { ConnectionPool } from "./nats.js";
import { StatsBook } from "./stats.js";
import { SYNC_STDERR_BYTES, syncIn, syncOut, type SyncExec } from "./sync.js";

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

/**
 * The receipt of a release or destroy of a lease nothing of this company's runs under: one whose
 * metadata kubeclip never wrote (no kubeclip.runId), one of another company, or one kubeclip has
 * no lease for (its `released` says unknown). Paperclip's host sweeps the leases its own restart
 * stranded and releases or destroys each; it keeps a lease it got no receipt for pending cleanup
 * and retries it, five times, then leaves it for an operator (environment-runtime.js
 * releasePluginBackedSandboxLease, heartbeat.js sweepPendingCleanupLeases), and takes a
 * receipt only when it names the lease's own id (remote-execution-termination.js). `destroyed`:
 * nothing under that id can be resumed for this company.
 */
export function unknownLeaseReceipt(providerLeaseId: string): PluginEnvironmentTerminationReceipt {
  return { providerLeaseId, state: "destroyed" };
}

export function createPlugin(options: PluginOptions = {}): PaperclipPlugin {
  const pool = new ConnectionPool();
  const reusableLeases = options.reusableLeases ?? REUSABLE_LEASES;
  const cancels = options.cancelExecution ?? servesCancelExecution();
  /** Executes in flight by the host's exact identity, for environmentCancelExecution. */
  const executions = new Executions();
  /**
   * In-flight executes per company and lease (leaseKey), aborted by that company's release with
   * cancelActiveWork once kubeclip answered it.
   */
  const inflight = new Map<string, Set<AbortController>>();
  /** Hook calls and execute durations per company and lease (leaseKey), logged when it ends. */
  const stats = new StatsBook();
  /** Executes in flight per company, bounded by settings.maxConcurrentExecutesPerCompany. */
  const limiter = new CompanyLimiter(options.executeSlotWaitMs);
  /** Execute output held at once, all companies together (limiter.ts). */
  const outputBudget = new ByteBudget(OUTPUT_BUDGET_BYTES, OUTPUT_BUDGET_COMPANY_BYTES, OUTPUT_TAIL_FLOOR_BYTES);
  /** Brokered keys' placeholders per company and lease (broker.ts), forgotten at the lease's end. */
  const placeholders = new Placeholders(undefined, options.mintTimeoutMs);
  /** Sync-out bytes being extracted at once, per company (limiter.ts). */
  const syncOutBudget = new ByteBudget(Number.MAX_SAFE_INTEGER, SYNC_OUT_COMPANY_BYTES);
  /**
   * Lease requests per connection and subject prefix, kept: each one's waits share one consumer
   * of the runs' answers (answers.ts), not one per lease in flight. A closed connection's go
   * with it.
   */
  const leasesByConn = new WeakMap<NatsConnection, Map<string, Leases>>();
  const leasesOn = (nc: NatsConnection, prefix: string): Leases => {
    let byPrefix = leasesByConn.get(nc);
    if (!byPrefix) leasesByConn.set(nc, (byPrefix = new Map<string, Leases>()));
    let l = byPrefix.get(prefix);
    if (!l) byPrefix.set(prefix, (l = new Leases(nc, prefix)));
    return l;
  };
  let ctx: PluginContext | undefined;
  /**
   * The leases this worker acquired or resumed and has not ended, by company and lease
   * (leaseKey): a login terminal's open names the lease (the host acquired it through this
   * worker just before), and finds only a lease of the opening company. Another company's
   * acquire answered with the same id neither replaces nor ends it.
   */
  const leaseBook = new Map<string, { runId: string; companyId: string; backend: string; config: JsonObject }>();
  const remember = (providerLeaseId: string, lease: { runId: string; companyId: string; backend: string; config: JsonObject }): void => {
    const key = leaseKey(lease.companyId, providerLeaseId);
    leaseBook.delete(key);
    leaseBook.set(key, lease);
    for (const oldest of leaseBook.keys()) {
      if (leaseBook.size <= LEASE_BOOK_SIZE) break;
      leaseBook.delete(oldest);
    }
  };
  const terminals = new LoginTerminals(() => context().loginPty);
  /**
   * Plugin settings delivered by configChanged, per company (null: an instance-wide save).
   * validateConfig has no company: it uses them only when every company has the same.
   */
  const deliveredByCompany = new Map<string | null, JsonObject>();
  const delivered = (): { config: JsonObject; companyId: string | null } | undefined => {
    const entries = [...deliveredByCompany.entries()];
    const first = entries[0];
    if (!first) return undefined;
    const same = entries.every(([, c]) => JSON.stringify(c) === JSON.stringify(first[1]));
    return same ? { config: first[1], companyId: first[0] } : undefined;
  };

  const context = (): PluginContext => {
    if (!ctx) throw new Error("plugin used before setup");
    return ctx;
  };

  /** The plugin settings with secret bindings resolved; {} when there are none. */
  async function settings(companyId: string | undefined): Promise<PluginKeys> {
    let raw: JsonObject | undefined;
    let cid = companyId;
    if (companyId) {
      const got = await within(context().config.get(companyId), 5_000, "reading the plugin settings").catch(() => undefined);
      if (isObject(got) && Object.keys(got).length > 0) raw = got;
    } else {
      const d = delivered();
      raw = d?.config;
      cid = d?.companyId ?? undefined;
    }
    if (!raw) return {};
    const resolved: JsonObject = { ...raw };
    for (const key of SECRET_KEYS) {
      const v = raw[key];
      if (isObject(v) && v.type === "secret_ref" && typeof v.secretId === "string") {
        if (!cid) {
          resolved[key] = undefined;
          continue;
        }
        resolved[key] = await within(
          context().secrets.resolve({ type: "secret_ref", secretId: v.secretId }, { companyId: cid, configPath: key }),
          5_000,
          `resolving settings.${key}`,
        ).catch((err: unknown) => {
          throw new ConfigError(`settings.${key}`, `the secret could not be resolved (${errorMessage(err)})`);
        });
      } else if (isUnresolvedSecretRef(v)) {
        throw new ConfigError(`settings.${key}`, "is a bare secret id; bind it as a secret reference");
      }
    }
    return readSettings(resolved);
  }

  /**
   * The connection for a hook: the settings' alone. The environment config (the company's) may
   * set only the RPC budget; a connection key there is refused before anything connects.
   */
  async function connectionFor(config: JsonObject, companyId: string | undefined): Promise<Connection> {
    const env = readEnvironmentKeys(splitConfig(config).plugin);
    return resolveConnection(await settings(companyId), env);
  }

  /**
   * The company a lease hook acts for: Paperclip's (params.companyId, which the host sets from its
   * own lease record, `lease.companyId` in environment-runtime.js). The lease metadata's copy is
   * only checked: a lease of another company is refused, never acted on.
   */
  function companyOf(meta: KubeclipLeaseMetadata, hostCompanyId: string, where: string): string {
    if (!hostCompanyId) throw new Error("companyId: Paperclip sent no company id; refused");
    if (meta.companyId && meta.companyId !== hostCompanyId) {
      throw new Error(`${where}.kubeclip.companyId: the lease is company ${meta.companyId}'s, not this call's company ${hostCompanyId}; refused`);
    }
    return hostCompanyId;
  }

  function leaseMetadata(metadata: unknown, where: string): KubeclipLeaseMetadata {
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

  async function endLease(
    params: PluginEnvironmentReleaseLeaseParams | PluginEnvironmentDestroyLeaseParams,
    kind: "release" | "destroy",
  ): Promise<PluginEnvironmentTerminationReceipt | undefined> {
    const providerLeaseId = params.providerLeaseId;
    if (!providerLeaseId) return undefined; // nothing was acquired
    if (!params.companyId) throw new Error("companyId: Paperclip sent no company id; refused");
    const log = context().logger;
    // A lease the plugin cannot map to a run of this company is answered at once, and nothing of
    // anyone's is touched: no request to kubeclip, no command cancelled, nothing forgotten.
    const nothingHere = (why: string, runId?: string): PluginEnvironmentTerminationReceipt => {
      log.warn(`lease ${kind}: nothing of this company's runs under this lease; answered with a receipt`, { providerLeaseId, ...(runId ? { runId } : {}), reason: why });
      return unknownLeaseReceipt(providerLeaseId);
    };
    let meta: KubeclipLeaseMetadata;
    try {
      meta = leaseMetadata(params.leaseMetadata, "leaseMetadata");
    } catch {
      return nothingHere("the lease metadata has no kubeclip.runId: kubeclip's plugin did not acquire it");
    }
    if (meta.companyId && meta.companyId !== params.companyId) return nothingHere("the lease metadata names another company", meta.runId);
    const companyId = companyOf(meta, params.companyId, "leaseMetadata");
    const cancel = params.cancelActiveWork === true;
    // A reusable lease the host cannot resume (its lease has no reuse scope: a run without an
    // execution workspace, docs/reuse.md, the host's rules §1) is destroyed, not kept. Each of its
    // releases names itself by the resume it follows: a retried one is the same request. A
    // destroy names nothing: a lease is destroyed once, and its answer is the lease's one
    // `released {destroyed}`, whoever ended it (this destroy, an earlier one, kubeclip's
    // collection), which kubeclip publishes without a releaseId.
    if (meta.reusable && kind === "release" && !isObject(params.leaseMetadata?.reusableSandboxLease)) kind = "destroy";
    const releaseId = meta.reusable && kind === "release" ? String(meta.resumes ?? 0) : undefined;
    const key = leaseKey(companyId, providerLeaseId);
    const conn = await connectionFor(params.config, params.companyId);
    const leases = leasesOn(await pool.get(conn), conn.prefix);
    log.info(`lease ${kind} requested`, { runId: meta.runId, providerLeaseId, cancelActiveWork: cancel });
    const t0 = Date.now();
    try {
      const released = await leases.release(
        { runId: meta.runId, companyId, providerLeaseId, cancelActiveWork: cancel, releaseId },
        kind,
        { timeoutMs: conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS, display: conn.display },
      );
      // kubeclip has no lease of this company for the run: the id may still be one of the
      // company's live leases, misnamed, whose commands and state must stay.
      if (released.unknown) return nothingHere("kubeclip has no lease of this company for the run", meta.runId);
      // kubeclip answered for this company's lease: only now are its commands cancelled and
      // its login lease forgotten (a refused release ends nothing of the plugin's either).
      if (cancel) {
        for (const c of inflight.get(key) ?? []) c.abort();
      }
      leaseBook.delete(key);
      placeholders.forget(companyId, providerLeaseId);
      const s = stats.take(key);
      s?.hook(`${kind}Lease`);
      // One line per lease with what it cost: the hook calls and the execute latencies.
      log.info(kind === "destroy" ? "lease destroyed" : "lease released", { runId: meta.runId, providerLeaseId, state: released.state, [`${kind}Ms`]: Date.now() - t0, ...s?.summary() });
      return { providerLeaseId, state: released.state };
    } catch (err) {
      log.warn(`lease ${kind} failed`, { runId: meta.runId, providerLeaseId, error: scrub(errorMessage(err), conn.secrets) });
      throw err;
    }
  }

  /**
   * One command on a lease through kubeclip's exec service, within the company's slots and
   * cancelled with the lease's in-flight work (release with cancelActiveWork, shutdown).
   */
  async function runOnLease(
    nc: Awaited<ReturnType<typeof pool.get>>,
    conn: Connection,
    s: PluginKeys,
    spec: ExecSpec,
    opts: ExecOptions,
  ): Promise<ExecResult> {
    const controller = new AbortController();
    // The caller's own stop (a login terminal's) stops it too.
    const stop = (): void => {
      controller.abort();
    };
    if (opts.signal?.aborted) stop();
    else opts.signal?.addEventListener("abort", stop, { once: true });
    const key = leaseKey(spec.companyId, spec.providerLeaseId);
    let set = inflight.get(key);
    if (!set) inflight.set(key, (set = new Set()));
    set.add(controller);
    let release: (() => void) | undefined;
    try {
      release = await limiter.acquire(spec.companyId, s.maxConcurrentExecutesPerCompany ?? DEFAULT_CONCURRENT_EXECUTES, controller.signal);
      return await runExec(nc, conn.prefix, spec, { ...opts, signal: controller.signal, inboxPrefix: conn.inboxPrefix, outputBudget, ...options.exec });
    } finally {
      opts.signal?.removeEventListener("abort", stop);
      release?.();
      set.delete(controller);
      if (set.size === 0) inflight.delete(key);
    }
  }

  /**
   * Resumes a reusable lease for the agent's next run, answering the expiry the resume renewed.
   * A lease kubeclip no longer has (destroyed, collected, not reusable) is answered with no
   * lease, so the host destroys it and acquires afresh (docs/reuse.md, the host's rules §3); anything
   * else that goes wrong is thrown, as an error the host retries when the lease is only busy.
   */
  async function resumeLease(params: PluginEnvironmentResumeLeaseParams): Promise<PluginEnvironmentLease> {
    const meta = leaseMetadata(params.leaseMetadata, "leaseMetadata");
    const companyId = companyOf(meta, params.companyId, "leaseMetadata");
    const gone: PluginEnvironmentLease = { providerLeaseId: null, metadata: { expired: true } };
    if (!meta.reusable || params.providerLeaseId !== meta.workloadName) return gone;
    const conn = await connectionFor(params.config, params.companyId);
    const leases = leasesOn(await pool.get(conn), conn.prefix);
    const log = context().logger;
    const t0 = Date.now();
    try {
      const r = await leases.resume(
        { runId: meta.runId, companyId, providerLeaseId: params.providerLeaseId, resumeId: randomUUID() },
        { timeoutMs: conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS, display: conn.display },
      );
      stats.of(leaseKey(companyId, params.providerLeaseId)).hook("resumeLease");
      remember(params.providerLeaseId, { runId: meta.runId, companyId, backend: meta.backend, config: params.config });
      log.info("lease resumed", { runId: meta.runId, providerLeaseId: params.providerLeaseId, from: r.from, generation: r.generation, resumeMs: Date.now() - t0 });
      const remoteCwd = typeof params.leaseMetadata?.remoteCwd === "string" ? params.leaseMetadata.remoteCwd : REMOTE_CWD;
      // The answer's metadata replaces the lease's: everything later hooks read goes back. The
      // host stores the answer's expiresAt on the lease's new row: the expiry this resume
      // renewed, which kubeclip enforces.
      return {
        providerLeaseId: params.providerLeaseId,
        expiresAt: r.expiresAt,
        metadata: { remoteCwd, kubeclip: { ...meta, resumes: r.resumes } },
      };
    } catch (err) {
      if (err instanceof KubeclipError && err.code === "lease_not_found") {
        log.info("lease gone; the host acquires afresh", { runId: meta.runId, providerLeaseId: params.providerLeaseId });
        return gone;
      }
      if (err instanceof KubeclipError && err.code === "agent_busy") {
        // Another run of the agent holds it: the lease is kept, only not now. The host retries
        // a resume within its minute when the message reads as transient (docs/reuse.md, the host's rules §3);
        // answering "no lease" would make it destroy the agent's workspace and home instead.
        log.info("lease's agent busy; the host retries the resume", { runId: meta.runId, providerLeaseId: params.providerLeaseId });
        throw new KubeclipError(err.code, `${err.message.replace(/^agent_busy: /, "")}: service unavailable until that run ends`, err.field);
      }
      // The host retries a resume within its minute only when the error reads as transient
      // (docs/reuse.md, the host's rules §3); a retry continues the same resume (a new pod is waited for, not made
      // twice).
      if (err instanceof TimeoutError) throw new TimeoutError(`resume of lease ${params.providerLeaseId} timed out: ${err.message}`);
      log.warn("lease resume failed", { runId: meta.runId, providerLeaseId: params.providerLeaseId, error: scrub(errorMessage(err), conn.secrets) });
      throw err;
    }
  }

  /** One execute call: the command through kubeclip's exec service, output forwarded live. */
  async function execute(params: PluginEnvironmentExecuteParams, providerLeaseId: string, signal: AbortSignal): Promise<PluginEnvironmentExecuteResult> {
    const meta = leaseMetadata(params.lease.metadata, "lease.metadata");
    const companyId = companyOf(meta, params.companyId, "lease.metadata");
    const s = await settings(companyId);
    const conn = resolveConnection(s, readEnvironmentKeys(splitConfig(params.config).plugin));
    const c = context();
    // Paperclip's own server keys never leave: only their names are logged.
    const policy = new EnvPolicy(s.executeEnv);
    const { env, dropped } = policy.filter(params.env ?? {});
    if (dropped.length > 0) c.logger.info("execute env keys dropped", { runId: meta.runId, count: dropped.length, keys: dropped });
    const nc = await pool.get(conn);
    // What passed the policy is what would be published: its brokered keys become placeholders,
    // or the execute fails here, before anything is sent.
    const brokered = s.brokeredKeys ?? [];
    const sent = brokered.length === 0 ? env : await placeholders.replace(nc, conn.prefix, brokered, { companyId, runId: meta.runId, providerLeaseId }, env).catch((err: unknown) => {
      c.logger.warn("execute refused: a brokered key has no placeholder", { runId: meta.runId, providerLeaseId, error: errorMessage(err) });
      throw err;
    });
    let command = params.command;
    let args = params.args ?? [];
    if (args.length === 0 && /\s/.test(command)) {
      args = ["-c", command];
      command = "/bin/sh";
    }
    const timeoutMs = params.timeoutMs && params.timeoutMs > 0 ? params.timeoutMs : (conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS);
    const record = isAgentCommand(command, args, meta.adapterType);
    // Bound to this hook's async context: the SDK routes execute.log by the active invocation.
    // Left out while the host is not reading the worker's stdout (livelog.ts).
    const live = new LiveLog(
      AsyncResource.bind((stream: "stdout" | "stderr", chunk: string) => {
        c.execution.log(stream, chunk);
      }),
      () => process.stdout.writableLength,
    );
    const forward = (stream: "stdout" | "stderr", chunk: string): void => {
      live.write(stream, chunk);
    };
    // Cancelled (environmentCancelExecution) before anything was sent: nothing to stop.
    if (signal.aborted) return { exitCode: null, signal: null, timedOut: false, stdout: "", stderr: "", metadata: { cancelled: true } };
    // The spec names its fields: the host's executionId never reaches kubeclip or the command.
    const r = await runOnLease(
      nc,
      conn,
      s,
      { companyId, runId: meta.runId, providerLeaseId, command, args, cwd: params.cwd, env: sent, stdin: params.stdin, timeoutMs, record },
      { onOutput: forward, holdBytes: s.maxExecuteOutputBytes ?? DEFAULT_EXECUTE_OUTPUT_BYTES, signal },
    );
    live.finish();
    if (record || r.exitCode !== 0 || r.metadata.truncated) {
      c.logger.debug("exec finished", { runId: meta.runId, execId: r.metadata.execId, exitCode: r.exitCode, timedOut: r.timedOut, record, truncated: r.metadata.truncated === true });
    }
    return { exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut, stdout: r.stdout, stderr: r.stderr, metadata: { ...r.metadata } };
  }

  /**
   * A sync hook: the lease's sync execs (sandboxd untar/tar, post-upload commands) with no env
   * from the host, nothing recorded, and the hook's budget (the environment's timeoutMs, which
   * Paperclip waits 30 s beyond).
   */
  async function sync(
    params: PluginEnvironmentSyncInParams | PluginEnvironmentSyncOutParams,
    direction: "in" | "out",
  ): Promise<PluginEnvironmentSyncResult> {
    const providerLeaseId = params.lease.providerLeaseId;
    if (!providerLeaseId) throw new Error("lease.providerLeaseId: missing; nothing to sync with");
    const meta = leaseMetadata(params.lease.metadata, "lease.metadata");
    const companyId = companyOf(meta, params.companyId, "lease.metadata");
    if (meta.backend !== "" && !(EXEC_BACKENDS as readonly string[]).includes(meta.backend)) {
      throw new Error(`lease.metadata.kubeclip.backend: ${meta.backend} runs no commands, so no native sync (the lease says nativeFileSyncUnsupported)`);
    }
    const s = await settings(companyId);
    const conn = resolveConnection(s, readEnvironmentKeys(splitConfig(params.config).plugin));
    const nc = await pool.get(conn);
    const budgetMs = conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS;
    let execs = 0;
    const run = (e: SyncExec): Promise<ExecResult> => {
      execs++;
      return runOnLease(
        nc,
        conn,
        s,
        { companyId, runId: meta.runId, providerLeaseId, command: e.command, args: e.args, cwd: e.cwd, env: {}, stdinStream: e.stdinStream, timeoutMs: e.timeoutMs, record: false },
        { holdBytes: SYNC_STDERR_BYTES, stdoutSink: e.stdoutSink, ...(e.maxOutputBytes !== undefined ? { maxOutputBytes: e.maxOutputBytes } : {}) },
      );
    };
    const log = context().logger;
    const t0 = Date.now();
    const leaseStats = stats.of(leaseKey(companyId, providerLeaseId));
    leaseStats.hook(direction === "in" ? "syncIn" : "syncOut");
    let bytes = 0;
    try {
      const result =
        direction === "in"
          ? await syncIn(params.operations, run, budgetMs)
          : await syncOut(params.operations, run, { maxBytes: s.maxSyncOutBytes ?? DEFAULT_SYNC_OUT_BYTES, maxFiles: s.maxSyncOutFiles ?? DEFAULT_SYNC_OUT_FILES, inFlight: { bytes: syncOutBudget, company: companyId } }, budgetMs);
      const files = result.operations.reduce((n, o) => n + o.filesTransferred, 0);
      bytes = result.operations.reduce((n, o) => n + o.bytesTransferred, 0);
      log.info(`sync ${direction} done`, { runId: meta.runId, providerLeaseId, operations: result.operations.length, files, bytes, execs, syncMs: Date.now() - t0 });
      return result;
    } catch (err) {
      log.warn(`sync ${direction} failed`, { runId: meta.runId, providerLeaseId, execs, error: scrub(errorMessage(err), conn.secrets) });
      throw err;
    } finally {
      leaseStats.sync(execs, bytes);
    }
  }

  /**
   * environmentCancelExecution: stops the execute of exactly this company, environment, lease
   * and executionId, and answers once it has ended; anything else is answered cancelled: false
   * and nothing is touched.
   */
  async function cancelExecution(params: unknown): Promise<CancelExecutionResult> {
    const p = checkCancel(params);
    const providerLeaseId = p.lease.providerLeaseId;
    const t0 = Date.now();
    const cancelled =
      providerLeaseId !== null &&
      (await executions.cancel({ companyId: p.companyId, environmentId: p.environmentId, providerLeaseId, executionId: p.executionId }));
    // Neither the executionId nor the reason is logged: both are the host's, opaque to kubeclip.
    context().logger.info(cancelled ? "execute cancelled" : "execute cancel: no such command in flight", { providerLeaseId, cancelled, cancelMs: Date.now() - t0 });
    return { executionId: p.executionId, cancelled };
  }

  /**
   * A login terminal on a lease this worker holds for the opening company: the fixed command of
   * the key on a LOGIN_TTY terminal, its output to ctx.loginPty. Never logs what is typed or shown.
   */
  async function openLogin(params: PluginLoginPtyOpenParams): Promise<string> {
    const o = checkOpen(params);
    return terminals.open(o.hostRouteId, o.companyId, async () => {
      const lease = leaseBook.get(leaseKey(o.companyId, o.providerLeaseId));
      // The same answer for a lease of another company as for none: nothing about it is told.
      if (!lease) {
        throw new Error(`providerLeaseId: no lease of company ${o.companyId} with this id is held by this plugin worker`);
      }
      if (lease.backend !== "" && !(EXEC_BACKENDS as readonly string[]).includes(lease.backend)) {
        throw new Error(`providerLeaseId: the lease's backend ${lease.backend} runs no commands, so no login terminal`);
      }
      const s = await settings(o.companyId);
      const conn = resolveConnection(s, readEnvironmentKeys(splitConfig(lease.config).plugin));
      const nc = await pool.get(conn);
      const log = context().logger;
      const launch = loginExec(o.key, o.sessionHome);
      const ids = { runId: lease.runId, providerLeaseId: o.providerLeaseId, loginCommandKey: o.key };
      log.info("login terminal opening", ids);
      return async (io) => {
        const t0 = Date.now();
        try {
          const r = await runOnLease(
            nc,
            conn,
            s,
            { companyId: o.companyId, runId: lease.runId, providerLeaseId: o.providerLeaseId, ...launch, stdinStream: io.input, tty: LOGIN_TTY, timeoutMs: LOGIN_TIMEOUT_MS, record: false },
            { signal: io.signal, maxOutputBytes: LOGIN_OUTPUT_BYTES, holdBytes: 4_096, onOutput: (_stream, text) => { io.output(text); } },
          );
          log.info("login terminal ended", { ...ids, exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut, cancelled: r.metadata.cancelled === true, loginMs: Date.now() - t0 });
          return r.exitCode;
        } catch (err) {
          log.warn("login terminal failed", { ...ids, error: scrub(errorMessage(err), conn.secrets) });
          throw err;
        }
      };
    });
  }

  return definePlugin({
    setup(c) {
      ctx = c;
      c.logger.info("kubeclip sandbox provider ready");
      return Promise.resolve();
    },

    onHealth() {
      return Promise.resolve({ status: "ok" as const, message: "kubeclip sandbox provider running" });
    },

    // Settings are read per company (ctx.config.get) in every hook that has one.
    multiCompanyConfig: true,

    onConfigChanged(config, change) {
      deliveredByCompany.set(change?.companyId ?? null, config);
      return Promise.resolve();
    },

    async onShutdown() {
      terminals.closeAll();
      for (const set of inflight.values()) for (const c of set) c.abort();
      await pool.close(5_000);
    },

    async onEnvironmentValidateConfig(params): Promise<PluginEnvironmentValidationResult> {
      const split = splitConfig(params.config);
      const warnings = [...split.warnings];
      const errors = checkProviderConfig(split.provider);
      let conn: Connection;
      try {
        // A connection key in the environment is refused here, before anything connects.
        const env = readEnvironmentKeys(split.plugin);
        const s = await settings(undefined);
        conn = resolveConnection(s, env);
        // A brokered key's value in the config is refused here, and the config not sent on.
        const unbrokered = brokeredDefaults(split.provider, s.brokeredKeys ?? []);
        if (unbrokered.length > 0) return { ok: false, errors: [...errors, ...unbrokered], warnings };
      } catch (err) {
        if (err instanceof ConfigError) return { ok: false, errors: [...errors, err.message], warnings };
        throw err;
      }
      // No advice on streamRunLogs here: Paperclip strips it (and `provider`) before this hook and
      // re-applies it afterwards (environment-config.js stripSandboxProviderEnvelope).
      let verdict;
      try {
        const nc = await pool.get(conn);
        verdict = await validateConfig(nc, conn.prefix, split.provider, {
          timeoutMs: Math.min(conn.timeoutMs ?? VALIDATE_BUDGET_MS, VALIDATE_BUDGET_MS),
          display: conn.display,
        });
      } catch (err) {
        const message = scrub(errorMessage(err), conn.secrets);
        return { ok: false, errors: [...errors, err instanceof UnreachableError ? message : `kubeclip validation failed: ${message}`], warnings };
      }
      const ok = errors.length === 0 && verdict.ok;
      const result: PluginEnvironmentValidationResult = {
        ok,
        errors: [...errors, ...verdict.errors],
        warnings: [...warnings, ...verdict.warnings],
      };
      if (ok) result.normalizedConfig = normalizedConfig(verdict.normalizedConfig ?? split.provider, split);
      return result;
    },

    async onEnvironmentProbe(params): Promise<PluginEnvironmentProbeResult> {
      let conn: Connection;
      try {
        conn = await connectionFor(params.config, params.companyId);
      } catch (err) {
        return { ok: false, summary: "Invalid kubeclip connection settings.", diagnostics: [{ severity: "error", message: errorMessage(err) }] };
      }
      const diagnostics: PluginEnvironmentProbeResult["diagnostics"] = [];
      const metadata: JsonObject = { provider: "kubernetes", natsUrl: conn.display, subjectPrefix: conn.prefix };
      let nc;
      try {
        nc = await pool.get(conn);
      } catch (err) {
        const message = scrub(errorMessage(err), conn.secrets);
        return { ok: false, summary: message, diagnostics: [{ severity: "error", message, code: "unreachable" }], metadata };
      }
      let streamsOk = true;
      const streams: JsonObject = {};
      try {
        const jsm = await jetstreamManager(nc, { timeout: 5_000 });
        for (const name of [`${conn.prefix.toUpperCase()}_LEASES`, `${conn.prefix.toUpperCase()}_RUNS`]) {
          try {
            const info = await jsm.streams.info(name);
            streams[name] = { messages: info.state.messages };
          } catch (err) {
            streamsOk = false;
            streams[name] = null;
            diagnostics.push({ severity: "error", code: "stream_missing", message: `stream ${name}: ${errorMessage(err)}` });
          }
        }
      } catch (err) {
        streamsOk = false;
        diagnostics.push({ severity: "error", code: "jetstream", message: `JetStream: ${errorMessage(err)}` });
      }
      metadata.streams = streams;
      const { replies, invalid } = await ping(nc, conn.prefix, PING_WINDOW_MS);
      const workers: Record<string, number> = {};
      for (const r of replies) workers[r.worker] = (workers[r.worker] ?? 0) + 1;
      metadata.workers = workers;
      metadata.replicas = replies.map((r) => ({ worker: r.worker, replica: r.replica, version: r.version }));
      const missing = WORKER_KINDS.filter((k) => !workers[k]);
      for (const k of missing) diagnostics.push({ severity: "error", code: "worker_missing", message: `no ${k} answered ${conn.prefix}.api.ping` });
      if (invalid > 0) diagnostics.push({ severity: "warning", message: `${invalid} malformed ping replies` });
      const ok = streamsOk && missing.length === 0;
      const answered = Object.entries(workers).map(([k, n]) => `${k}×${n}`).join(", ") || "none";
      return {
        ok,
        summary: `kubeclip at ${conn.display}: streams ${streamsOk ? "present" : "missing"}; workers answering: ${answered}.`,
        diagnostics,
        metadata,
      };
    },

    async onEnvironmentAcquireLease(params): Promise<PluginEnvironmentLease> {
      const split = splitConfig(params.config);
      const problems = checkProviderConfig(split.provider);
      if (problems.length > 0) throw new Error(problems.join("; "));
      // A lease that binds no agent (Paperclip's adapter logins, adapter-login-lease.js, and its
      // ad-hoc environment test leases; environment-runtime.js sends agentId undefined) is an
      // agent of its own, named after its run: kubeclip holds one run per agent, and this agent
      // has only this run. It is never reusable (reuse is per agent).
      const agentId = params.agentId !== undefined && params.agentId !== "" ? params.agentId : `login-${params.runId}`;
      const dup = findCaseVariantKey(params.executionWorkspaceSettings, "executionWorkspaceSettings");
      if (dup) throw new Error(`${dup}: keys differ only in case; kubeclip refuses such payloads`);
      const s = await settings(params.companyId);
      const conn = resolveConnection(s, readEnvironmentKeys(split.plugin));
      // A brokered key's real value would reach the run's Secret through defaultEnv: refused.
      const unbrokered = brokeredDefaults(split.provider, s.brokeredKeys ?? []);
      if (unbrokered.length > 0) throw new Error(unbrokered.join("; "));
      // Reusable only when declared and the host can find the lease again (docs/reuse.md, the host's rules §1).
      const reuse = reusableLeases && params.config.reuseLease === true && !!params.executionWorkspaceId && !!params.agentId;
      const leases = leasesOn(await pool.get(conn), conn.prefix);
      const log = context().logger;
      log.info("lease acquire requested", { runId: params.runId, reuseLease: reuse });
      const t0 = Date.now();
      const created = await leases.acquire(
        {
          runId: params.runId,
          companyId: params.companyId,
          environmentId: params.environmentId,
          agentId,
          issueId: params.issueId ?? undefined,
          adapterType: params.adapterType,
          executionWorkspaceSettings: params.executionWorkspaceSettings ?? undefined,
          requestedExpiresAt: params.requestedExpiresAt ?? undefined,
          config: split.provider,
          reuseLease: reuse,
        },
        { timeoutMs: conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS, display: conn.display },
      ).catch((err: unknown) => {
        log.warn("lease acquire failed", { runId: params.runId, error: scrub(errorMessage(err), conn.secrets) });
        throw err;
      });
      log.info("lease acquired", { runId: params.runId, providerLeaseId: created.providerLeaseId, backend: created.backend, acquireMs: Date.now() - t0 });
      stats.of(leaseKey(params.companyId, created.providerLeaseId)).hook("acquireLease");
      remember(created.providerLeaseId, { runId: params.runId, companyId: params.companyId, backend: created.backend, config: params.config });
      const kubeclip: KubeclipLeaseMetadata = {
        runId: params.runId,
        companyId: params.companyId,
        namespace: created.namespace,
        workloadName: created.workloadName,
        backend: created.backend,
        ...(params.adapterType ? { adapterType: params.adapterType } : {}),
        ...(reuse ? { reusable: true, resumes: 0 } : {}),
      };
      // A backend that runs no commands (job) has no sandboxd to sync through, and an operator
      // may turn native sync off (settings.nativeSync: false, say while pods still run a sandboxd
      // without its sync subcommands): Paperclip's host then keeps its base64 route for the lease
      // (environment-runtime.js supportsSync).
      const syncable = (EXEC_BACKENDS as readonly string[]).includes(created.backend) && s.nativeSync !== false;
      return {
        providerLeaseId: created.providerLeaseId,
        expiresAt: created.expiresAt,
        metadata: { remoteCwd: REMOTE_CWD, kubeclip, ...(syncable ? {} : { nativeFileSyncUnsupported: true }) },
      };
    },

    onEnvironmentRealizeWorkspace(params) {
      // Nothing to provision: the pod's /workspace (an emptyDir) is the workspace.
      if (params.lease.providerLeaseId) stats.of(leaseKey(params.companyId, params.lease.providerLeaseId)).hook("realizeWorkspace");
      const cwd = params.workspace.remotePath?.trim() || REMOTE_CWD;
      return Promise.resolve({ cwd, metadata: { remoteCwd: cwd } });
    },

    async onEnvironmentExecute(params: PluginEnvironmentExecuteParams): Promise<PluginEnvironmentExecuteResult> {
      const providerLeaseId = params.lease.providerLeaseId;
      if (!providerLeaseId) {
        return { exitCode: 1, timedOut: false, stdout: "", stderr: "No provider lease ID available for execution." };
      }
      const t0 = Date.now();
      // Tracked before anything is awaited: a cancel that comes while the execute still reads
      // its settings or connects finds it, and stops it before anything is sent.
      const controller = new AbortController();
      let ended!: () => void;
      const done = new Promise<void>((resolve) => {
        ended = resolve;
      });
      const executionId = cancels ? executionIdOf(params) : undefined;
      const untrack =
        executionId === undefined
          ? undefined
          : executions.track({ companyId: params.companyId, environmentId: params.environmentId, providerLeaseId, executionId }, async () => {
              // The same stop as a release's cancelActiveWork: the exec killed through kubeclip's
              // exec service (exec.ts giveUp); acknowledged once the execute has ended.
              controller.abort();
              await done;
            });
      try {
        return await execute(params, providerLeaseId, controller.signal);
      } finally {
        untrack?.();
        ended();
        stats.of(leaseKey(params.companyId, providerLeaseId)).execute(Date.now() - t0);
      }
    },

    ...(cancels ? { onEnvironmentCancelExecution: cancelExecution } : {}),

    async onEnvironmentSyncIn(params): Promise<PluginEnvironmentSyncResult> {
      return sync(params, "in");
    },

    async onEnvironmentSyncOut(params): Promise<PluginEnvironmentSyncResult> {
      return sync(params, "out");
    },

    async onEnvironmentResumeLease(params) {
      return resumeLease(params);
    },

    async onEnvironmentReleaseLease(params) {
      return endLease(params, "release");
    },

    async onEnvironmentDestroyLease(params) {
      return endLease(params, "destroy");
    },

    async onLoginPtyOpen(params): Promise<PluginLoginPtyOpenResult> {
      return { workerSessionId: await openLogin(params) };
    },

    // Each answers a refusal as a rejection (a throw in the executor), never a throw.
    onLoginPtyInput(params) {
      return new Promise<void>((resolve) => {
        terminals.input(params.workerSessionId, params.data);
        resolve();
      });
    },

    onLoginPtyStop(params) {
      return new Promise<void>((resolve) => {
        terminals.stop(params.workerSessionId);
        resolve();
      });
    },

    onLoginPtyClose(params): Promise<PluginLoginPtyCloseResult> {
      // Answered at once whatever the route: the host retires the worker when a close goes
      // unanswered for 10 s. The command's kill goes on behind the answer.
      return new Promise((resolve) => {
        if (typeof params.hostRouteId !== "string" || params.hostRouteId === "") throw new Error("hostRouteId: missing");
        terminals.close(params.hostRouteId);
        resolve({ hostRouteId: params.hostRouteId });
      });
    },
  });
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

const plugin: PaperclipPlugin = createPlugin();
export default plugin;
