// The hooks that run commands on a lease through kubeclip's exec service (exec.ts): execute
// (output streamed live), its cancel (environmentCancelExecution), the sync hooks (sandboxd
// untar/tar, sync.ts) and login terminals (loginpty.ts). Each is a function over the worker's
// Provider.

import { AsyncResource } from "node:async_hooks";
import type {
  PluginEnvironmentExecuteParams,
  PluginEnvironmentExecuteResult,
  PluginEnvironmentSyncInParams,
  PluginEnvironmentSyncOutParams,
  PluginEnvironmentSyncResult,
} from "@paperclipai/plugin-sdk";
import type { PluginLoginPtyOpenParams } from "@paperclipai/plugin-sdk/protocol";
import { isAgentCommand } from "./agent.js";
import { checkCancel, executionIdOf, type CancelExecutionResult } from "./cancel.js";
import { DEFAULT_EXECUTE_OUTPUT_BYTES, DEFAULT_SYNC_OUT_BYTES, DEFAULT_SYNC_OUT_FILES, EXEC_BACKENDS } from "./config.js";
import { EnvPolicy } from "./envpolicy.js";
import { errorMessage, scrub } from "./errors.js";
import type { ExecResult } from "./exec.js";
import { leaseKey } from "./leases.js";
import { LiveLog } from "./livelog.js";
import { LOGIN_OUTPUT_BYTES, LOGIN_TIMEOUT_MS, LOGIN_TTY, checkOpen, loginExec } from "./loginpty.js";
import { DEFAULT_RPC_BUDGET_MS, type LeaseRef, type Link, type Provider } from "./provider.js";
import { SYNC_STDERR_BYTES, syncIn, syncOut, type SyncExec } from "./sync.js";

/**
 * The execute hook: tracked for environmentCancelExecution before anything is awaited, so a
 * cancel that comes while the execute still reads its settings or connects finds it, and stops
 * it before anything is sent.
 */
export async function execute(p: Provider, params: PluginEnvironmentExecuteParams): Promise<PluginEnvironmentExecuteResult> {
  const providerLeaseId = params.lease.providerLeaseId;
  if (!providerLeaseId) {
    return { exitCode: 1, timedOut: false, stdout: "", stderr: "No provider lease ID available for execution." };
  }
  const t0 = Date.now();
  const controller = new AbortController();
  let ended!: () => void;
  const done = new Promise<void>((resolve) => {
    ended = resolve;
  });
  const executionId = p.cancels ? executionIdOf(params) : undefined;
  const untrack =
    executionId === undefined
      ? undefined
      : p.executions.track({ companyId: params.companyId, environmentId: params.environmentId, providerLeaseId, executionId }, async () => {
          // The same stop as a release's cancelActiveWork: the exec killed through kubeclip's
          // exec service (exec.ts giveUp); acknowledged once the execute has ended.
          controller.abort();
          await done;
        });
  try {
    return await executeOnLease(p, params, providerLeaseId, controller.signal);
  } finally {
    untrack?.();
    ended();
    p.stats.of(leaseKey(params.companyId, providerLeaseId)).execute(Date.now() - t0);
  }
}

/** One execute call: the command through kubeclip's exec service, output forwarded live. */
async function executeOnLease(
  p: Provider,
  params: PluginEnvironmentExecuteParams,
  providerLeaseId: string,
  signal: AbortSignal,
): Promise<PluginEnvironmentExecuteResult> {
  const lease = await p.onLease(params.lease.metadata, params.companyId, "lease.metadata", params.config);
  const { meta, companyId, settings: s } = lease;
  const log = p.context().logger;
  const sent = await executeEnv(p, lease, providerLeaseId, params.env ?? {});
  let command = params.command;
  let args = params.args ?? [];
  if (args.length === 0 && /\s/.test(command)) {
    args = ["-c", command];
    command = "/bin/sh";
  }
  const timeoutMs = params.timeoutMs && params.timeoutMs > 0 ? params.timeoutMs : (lease.conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS);
  const record = isAgentCommand(command, args, meta.adapterType);
  const live = liveLog(p);
  // Cancelled (environmentCancelExecution) before anything was sent: nothing to stop.
  if (signal.aborted) return { exitCode: null, signal: null, timedOut: false, stdout: "", stderr: "", metadata: { cancelled: true } };
  // The spec names its fields: the host's executionId never reaches kubeclip or the command.
  const r = await p.runOnLease(
    lease,
    { companyId, runId: meta.runId, providerLeaseId, command, args, cwd: params.cwd, env: sent, stdin: params.stdin, timeoutMs, record },
    {
      onOutput: (stream, chunk) => {
        live.write(stream, chunk);
      },
      holdBytes: s.maxExecuteOutputBytes ?? DEFAULT_EXECUTE_OUTPUT_BYTES,
      signal,
    },
  );
  live.finish();
  if (record || r.exitCode !== 0 || r.metadata.truncated) {
    log.debug("exec finished", { runId: meta.runId, execId: r.metadata.execId, exitCode: r.exitCode, timedOut: r.timedOut, record, truncated: r.metadata.truncated === true });
  }
  return { exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut, stdout: r.stdout, stderr: r.stderr, metadata: { ...r.metadata } };
}

/**
 * The env an execute sends: Paperclip's own server keys never leave (only their names are
 * logged), and what passed the policy has its brokered keys replaced by placeholders, or the
 * execute fails here, before anything is sent.
 */
async function executeEnv(p: Provider, lease: LeaseRef & Link, providerLeaseId: string, hostEnv: Record<string, string>): Promise<Record<string, string>> {
  const { meta, companyId, settings: s } = lease;
  const log = p.context().logger;
  const { env, dropped } = new EnvPolicy(s.executeEnv).filter(hostEnv);
  if (dropped.length > 0) log.info("execute env keys dropped", { runId: meta.runId, count: dropped.length, keys: dropped });
  const brokered = s.brokeredKeys ?? [];
  if (brokered.length === 0) return env;
  return p.placeholders.replace(lease.nc, lease.conn.prefix, brokered, { companyId, runId: meta.runId, providerLeaseId }, env).catch((err: unknown) => {
    log.warn("execute refused: a brokered key has no placeholder", { runId: meta.runId, providerLeaseId, error: errorMessage(err) });
    throw err;
  });
}

/**
 * The execute's live log, bound to this hook's async context: the SDK routes execute.log by the
 * active invocation. Left out while the host is not reading the worker's stdout (livelog.ts).
 */
function liveLog(p: Provider): LiveLog {
  const c = p.context();
  return new LiveLog(
    AsyncResource.bind((stream: "stdout" | "stderr", chunk: string) => {
      c.execution.log(stream, chunk);
    }),
    () => process.stdout.writableLength,
  );
}

/**
 * A sync hook: the lease's sync execs (sandboxd untar/tar, post-upload commands) with no env
 * from the host, nothing recorded, and the hook's budget (the environment's timeoutMs, which
 * Paperclip waits 30 s beyond).
 */
export async function sync(
  p: Provider,
  params: PluginEnvironmentSyncInParams | PluginEnvironmentSyncOutParams,
  direction: "in" | "out",
): Promise<PluginEnvironmentSyncResult> {
  const providerLeaseId = params.lease.providerLeaseId;
  if (!providerLeaseId) throw new Error("lease.providerLeaseId: missing; nothing to sync with");
  const { meta, companyId } = p.lease(params.lease.metadata, params.companyId, "lease.metadata");
  if (meta.backend !== "" && !(EXEC_BACKENDS as readonly string[]).includes(meta.backend)) {
    throw new Error(`lease.metadata.kubeclip.backend: ${meta.backend} runs no commands, so no native sync (the lease says nativeFileSyncUnsupported)`);
  }
  const link = await p.link(companyId, params.config);
  const budgetMs = link.conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS;
  let execs = 0;
  const run = (e: SyncExec): Promise<ExecResult> => {
    execs++;
    return p.runOnLease(
      link,
      { companyId, runId: meta.runId, providerLeaseId, command: e.command, args: e.args, cwd: e.cwd, env: {}, stdinStream: e.stdinStream, timeoutMs: e.timeoutMs, record: false },
      { holdBytes: SYNC_STDERR_BYTES, stdoutSink: e.stdoutSink, ...(e.maxOutputBytes !== undefined ? { maxOutputBytes: e.maxOutputBytes } : {}) },
    );
  };
  const log = p.context().logger;
  const t0 = Date.now();
  const leaseStats = p.stats.of(leaseKey(companyId, providerLeaseId));
  leaseStats.hook(direction === "in" ? "syncIn" : "syncOut");
  let bytes = 0;
  try {
    const s = link.settings;
    const result =
      direction === "in"
        ? await syncIn(params.operations, run, budgetMs)
        : await syncOut(params.operations, run, { maxBytes: s.maxSyncOutBytes ?? DEFAULT_SYNC_OUT_BYTES, maxFiles: s.maxSyncOutFiles ?? DEFAULT_SYNC_OUT_FILES, inFlight: { bytes: p.syncOutBudget, company: companyId } }, budgetMs);
    const files = result.operations.reduce((n, o) => n + o.filesTransferred, 0);
    bytes = result.operations.reduce((n, o) => n + o.bytesTransferred, 0);
    log.info(`sync ${direction} done`, { runId: meta.runId, providerLeaseId, operations: result.operations.length, files, bytes, execs, syncMs: Date.now() - t0 });
    return result;
  } catch (err) {
    log.warn(`sync ${direction} failed`, { runId: meta.runId, providerLeaseId, execs, error: scrub(errorMessage(err), link.conn.secrets) });
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
export async function cancelExecution(p: Provider, params: unknown): Promise<CancelExecutionResult> {
  const c = checkCancel(params);
  const providerLeaseId = c.lease.providerLeaseId;
  const t0 = Date.now();
  const cancelled =
    providerLeaseId !== null &&
    (await p.executions.cancel({ companyId: c.companyId, environmentId: c.environmentId, providerLeaseId, executionId: c.executionId }));
  // Neither the executionId nor the reason is logged: both are the host's, opaque to kubeclip.
  p.context().logger.info(cancelled ? "execute cancelled" : "execute cancel: no such command in flight", { providerLeaseId, cancelled, cancelMs: Date.now() - t0 });
  return { executionId: c.executionId, cancelled };
}

/**
 * A login terminal on a lease this worker holds for the opening company: the fixed command of
 * the key on a LOGIN_TTY terminal, its output to ctx.loginPty. Never logs what is typed or shown.
 */
export async function openLogin(p: Provider, params: PluginLoginPtyOpenParams): Promise<string> {
  const o = checkOpen(params);
  return p.terminals.open(o.hostRouteId, o.companyId, async () => {
    const lease = p.leaseBook.get(leaseKey(o.companyId, o.providerLeaseId));
    // The same answer for a lease of another company as for none: nothing about it is told.
    if (!lease) {
      throw new Error(`providerLeaseId: no lease of company ${o.companyId} with this id is held by this plugin worker`);
    }
    if (lease.backend !== "" && !(EXEC_BACKENDS as readonly string[]).includes(lease.backend)) {
      throw new Error(`providerLeaseId: the lease's backend ${lease.backend} runs no commands, so no login terminal`);
    }
    const link = await p.link(o.companyId, lease.config);
    const log = p.context().logger;
    const launch = loginExec(o.key, o.sessionHome);
    const ids = { runId: lease.runId, providerLeaseId: o.providerLeaseId, loginCommandKey: o.key };
    log.info("login terminal opening", ids);
    return async (io) => {
      const t0 = Date.now();
      try {
        const r = await p.runOnLease(
          link,
          { companyId: o.companyId, runId: lease.runId, providerLeaseId: o.providerLeaseId, ...launch, stdinStream: io.input, tty: LOGIN_TTY, timeoutMs: LOGIN_TIMEOUT_MS, record: false },
          { signal: io.signal, maxOutputBytes: LOGIN_OUTPUT_BYTES, holdBytes: 4_096, onOutput: (_stream, text) => { io.output(text); } },
        );
        log.info("login terminal ended", { ...ids, exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut, cancelled: r.metadata.cancelled === true, loginMs: Date.now() - t0 });
        return r.exitCode;
      } catch (err) {
        log.warn("login terminal failed", { ...ids, error: scrub(errorMessage(err), link.conn.secrets) });
        throw err;
      }
    };
  });
}
