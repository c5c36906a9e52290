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
// The worker's state and the setup every hook shares live in provider.ts; the lease hooks in
// lifecycle.ts, the command hooks in commands.ts; validateConfig and probe here.
//
// Logs carry run and lease ids only: never config values, env, stdin or credentials.

import { jetstreamManager } from "@nats-io/jetstream";
import {
  definePlugin,
  type PaperclipPlugin,
  type PluginEnvironmentProbeParams,
  type PluginEnvironmentProbeResult,
  type PluginEnvironmentValidateConfigParams,
  type PluginEnvironmentValidationResult,
} from "@paperclipai/plugin-sdk";
import type { NatsConnection } from "@nats-io/transport-node";
import type { PluginLoginPtyCloseResult, PluginLoginPtyOpenResult } from "@paperclipai/plugin-sdk/protocol";
import { WORKER_KINDS, ping, validateConfig as askValidate } from "./api.js";
import { brokeredDefaults } from "./broker.js";
import { cancelExecution, execute, openLogin, sync } from "./commands.js";
import { checkProviderConfig, normalizedConfig, splitConfig, type Connection } from "./config.js";
import { ConfigError, UnreachableError, errorMessage, scrub } from "./errors.js";
import type { JsonObject } from "./json.js";
import { leaseKey } from "./leases.js";
import { acquireLease, endLease, resumeLease } from "./lifecycle.js";
import { PING_WINDOW_MS, Provider, REMOTE_CWD, VALIDATE_BUDGET_MS, type PluginOptions } from "./provider.js";

export { unknownLeaseReceipt } from "./lifecycle.js";
export {
  DEFAULT_RPC_BUDGET_MS,
  LEASE_BOOK_SIZE,
  PING_WINDOW_MS,
  REMOTE_CWD,
  VALIDATE_BUDGET_MS,
  type KubeclipLeaseMetadata,
  type PluginOptions,
} from "./provider.js";

/** The plugin: each hook a call into its worker's Provider (provider.ts), which holds the state. */
export function createPlugin(options: PluginOptions = {}): PaperclipPlugin {
  const p = new Provider(options);
  return definePlugin({
    setup(c) {
      p.setup(c);
      c.logger.info("kubeclip sandbox provider ready");
      return Promise.resolve();
    },
    onHealth() {
      return Promise.resolve({ status: "ok" as const, message: "kubeclip sandbox provider running" });
    },
    // Settings are read per company (ctx.config.get) in every hook that has one.
    multiCompanyConfig: true,
    onConfigChanged(config, change) {
      p.deliveredByCompany.set(change?.companyId ?? null, config);
      return Promise.resolve();
    },
    async onShutdown() {
      p.terminals.closeAll();
      for (const set of p.inflight.values()) for (const c of set) c.abort();
      await p.pool.close(5_000);
    },
    onEnvironmentValidateConfig: (params) => validate(p, params),
    onEnvironmentProbe: (params) => probe(p, params),
    onEnvironmentAcquireLease: (params) => acquireLease(p, params),
    onEnvironmentRealizeWorkspace(params) {
      // Nothing to provision: the pod's /workspace (an emptyDir) is the workspace.
      if (params.lease.providerLeaseId) p.stats.of(leaseKey(params.companyId, params.lease.providerLeaseId)).hook("realizeWorkspace");
      const cwd = params.workspace.remotePath?.trim() || REMOTE_CWD;
      return Promise.resolve({ cwd, metadata: { remoteCwd: cwd } });
    },
    onEnvironmentExecute: (params) => execute(p, params),
    ...(p.cancels ? { onEnvironmentCancelExecution: (params: unknown) => cancelExecution(p, params) } : {}),
    onEnvironmentSyncIn: (params) => sync(p, params, "in"),
    onEnvironmentSyncOut: (params) => sync(p, params, "out"),
    onEnvironmentResumeLease: (params) => resumeLease(p, params),
    onEnvironmentReleaseLease: (params) => endLease(p, params, "release"),
    onEnvironmentDestroyLease: (params) => endLease(p, params, "destroy"),
    async onLoginPtyOpen(params): Promise<PluginLoginPtyOpenResult> {
      return { workerSessionId: await openLogin(p, params) };
    },
    // Each answers a refusal as a rejection (a throw in the executor), never a throw.
    onLoginPtyInput(params) {
      return new Promise<void>((resolve) => {
        p.terminals.input(params.workerSessionId, params.data);
        resolve();
      });
    },
    onLoginPtyStop(params) {
      return new Promise<void>((resolve) => {
        p.terminals.stop(params.workerSessionId);
        resolve();
      });
    },
    onLoginPtyClose(params): Promise<PluginLoginPtyCloseResult> {
      // Answered at once whatever the route: the host retires the worker when a close goes
      // unanswered for 10 s. The command's kill goes on behind the answer.
      return new Promise((resolve) => {
        if (typeof params.hostRouteId !== "string" || params.hostRouteId === "") throw new Error("hostRouteId: missing");
        p.terminals.close(params.hostRouteId);
        resolve({ hostRouteId: params.hostRouteId });
      });
    },
  });
}

/**
 * validateConfig: the config's own checks, then pkg/policy's verdict (<prefix>.api.validate).
 * It has no company: the settings are those every company was delivered (Provider.settings).
 */
async function validate(p: Provider, params: PluginEnvironmentValidateConfigParams): Promise<PluginEnvironmentValidationResult> {
  const split = splitConfig(params.config);
  const warnings = [...split.warnings];
  const errors = checkProviderConfig(split.provider);
  let conn: Connection;
  try {
    // A connection key in the environment is refused here, before anything connects.
    const c = await p.connection(undefined, params.config);
    conn = c.conn;
    // A brokered key's value in the config is refused here, and the config not sent on.
    const unbrokered = brokeredDefaults(split.provider, c.settings.brokeredKeys ?? []);
    if (unbrokered.length > 0) return { ok: false, errors: [...errors, ...unbrokered], warnings };
  } catch (err) {
    if (err instanceof ConfigError) return { ok: false, errors: [...errors, err.message], warnings };
    throw err;
  }
  // No advice on streamRunLogs here: Paperclip strips it (and `provider`) before this hook and
  // re-applies it afterwards (environment-config.js stripSandboxProviderEnvelope).
  let verdict;
  try {
    const nc = await p.pool.get(conn);
    verdict = await askValidate(nc, conn.prefix, split.provider, {
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
}

/** probe: NATS, the two JetStream streams, and which workers answer <prefix>.api.ping. */
async function probe(p: Provider, params: PluginEnvironmentProbeParams): Promise<PluginEnvironmentProbeResult> {
  let conn: Connection;
  try {
    conn = (await p.connection(params.companyId, params.config)).conn;
  } catch (err) {
    return { ok: false, summary: "Invalid kubeclip connection settings.", diagnostics: [{ severity: "error", message: errorMessage(err) }] };
  }
  const metadata: JsonObject = { provider: "kubernetes", natsUrl: conn.display, subjectPrefix: conn.prefix };
  let nc;
  try {
    nc = await p.pool.get(conn);
  } catch (err) {
    const message = scrub(errorMessage(err), conn.secrets);
    return { ok: false, summary: message, diagnostics: [{ severity: "error", message, code: "unreachable" }], metadata };
  }
  const diagnostics: NonNullable<PluginEnvironmentProbeResult["diagnostics"]> = [];
  const streams = await probeStreams(nc, conn.prefix, diagnostics);
  metadata.streams = streams.info;
  const { replies, invalid } = await ping(nc, conn.prefix, PING_WINDOW_MS);
  const workers: Record<string, number> = {};
  for (const r of replies) workers[r.worker] = (workers[r.worker] ?? 0) + 1;
  metadata.workers = workers;
  metadata.replicas = replies.map((r) => ({ worker: r.worker, replica: r.replica, version: r.version }));
  const missing = WORKER_KINDS.filter((k) => !workers[k]);
  for (const k of missing) diagnostics.push({ severity: "error", code: "worker_missing", message: `no ${k} answered ${conn.prefix}.api.ping` });
  if (invalid > 0) diagnostics.push({ severity: "warning", message: `${invalid} malformed ping replies` });
  const ok = streams.ok && missing.length === 0;
  const answered = Object.entries(workers).map(([k, n]) => `${k}×${n}`).join(", ") || "none";
  return {
    ok,
    summary: `kubeclip at ${conn.display}: streams ${streams.ok ? "present" : "missing"}; workers answering: ${answered}.`,
    diagnostics,
    metadata,
  };
}

/** The lease and run streams' message counts; what is missing is added to diagnostics. */
async function probeStreams(
  nc: NatsConnection,
  prefix: string,
  diagnostics: NonNullable<PluginEnvironmentProbeResult["diagnostics"]>,
): Promise<{ ok: boolean; info: JsonObject }> {
  let ok = true;
  const info: JsonObject = {};
  try {
    const jsm = await jetstreamManager(nc, { timeout: 5_000 });
    for (const name of [`${prefix.toUpperCase()}_LEASES`, `${prefix.toUpperCase()}_RUNS`]) {
      try {
        const s = await jsm.streams.info(name);
        info[name] = { messages: s.state.messages };
      } catch (err) {
        ok = false;
        info[name] = null;
        diagnostics.push({ severity: "error", code: "stream_missing", message: `stream ${name}: ${errorMessage(err)}` });
      }
    }
  } catch (err) {
    ok = false;
    diagnostics.push({ severity: "error", code: "jetstream", message: `JetStream: ${errorMessage(err)}` });
  }
  return { ok, info };
}

const plugin: PaperclipPlugin = createPlugin();
export default plugin;
