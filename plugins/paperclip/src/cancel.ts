// Exact cancellation of one execute: Paperclip's host→worker `environmentCancelExecution`.
//
// Paperclip's plugin SDK source (paperclipai/paperclip, packages/plugins/sdk/src/protocol.ts and
// environment-execution-control.ts) gives every environmentExecute an opaque `executionId` and
// lets the host stop exactly that command with environmentCancelExecution {companyId,
// environmentId, lease, executionId, reason}, answered {executionId, cancelled}. The SDK on npm
// this plugin is built against (2026.916.1) has neither: its worker never advertises the method
// and its types lack both. The types below are copied by hand from that source; the hook is
// registered only when the installed SDK lists the method (servesCancelExecution), so with
// 2026.916.1 nothing changes, and with an SDK that knows it the worker advertises and serves it
// (the SDK's worker advertises an optional method exactly when the definition has its hook).

import { HOST_TO_WORKER_OPTIONAL_METHODS, type PluginEnvironmentLease } from "@paperclipai/plugin-sdk";
import { isObject } from "./json.js";

/** The host→worker method; the SDK dispatches it to the definition's onEnvironmentCancelExecution. */
export const CANCEL_EXECUTION_METHOD = "environmentCancelExecution";

/** The longest executionId taken: the SDK source's own bound (environment-execution-control.ts). */
export const EXECUTION_ID_MAX_CHARS = 512;

/** PluginEnvironmentCancelExecutionParams of the SDK source, by hand. */
export interface CancelExecutionParams {
  driverKey: string;
  companyId: string;
  environmentId: string;
  issueId?: string | null;
  config: Record<string, unknown>;
  lease: PluginEnvironmentLease;
  /** The exact host-owned command identity the host passed to environmentExecute. */
  executionId: string;
  /** The operator's or control plane's reason: never sent to the command or kubeclip. */
  reason: string;
}

/**
 * PluginEnvironmentCancelExecutionResult of the SDK source, by hand. cancelled: true only when
 * this exact company/environment/lease/execution was running here and its stop went through;
 * false when that exact identity is absent or stale (a mismatch is never widened).
 */
export interface CancelExecutionResult {
  executionId: string;
  cancelled: boolean;
}

/**
 * Whether the installed SDK knows environmentCancelExecution: it lists the method among the
 * optional ones a worker may implement (protocol.ts HOST_TO_WORKER_OPTIONAL_METHODS), and
 * advertises it at initialize when the definition has the hook.
 */
export function servesCancelExecution(methods: readonly string[] = HOST_TO_WORKER_OPTIONAL_METHODS): boolean {
  return methods.includes(CANCEL_EXECUTION_METHOD);
}

function checkExecutionId(v: unknown, field: string): string {
  if (typeof v !== "string" || v === "") throw new Error(`${field}: must be a non-empty string (the host's id of the command)`);
  if (v.length > EXECUTION_ID_MAX_CHARS) throw new Error(`${field}: longer than ${EXECUTION_ID_MAX_CHARS} characters`);
  return v;
}

/** An execute's executionId: undefined when the host sent none (an SDK without it). */
export function executionIdOf(params: object): string | undefined {
  const v = (params as { executionId?: unknown }).executionId;
  return v === undefined ? undefined : checkExecutionId(v, "executionId");
}

/** A cancel request checked, or an error naming its first bad field. */
export function checkCancel(params: unknown): CancelExecutionParams {
  if (!isObject(params)) throw new Error("params: must be an object");
  for (const field of ["companyId", "environmentId"] as const) {
    if (typeof params[field] !== "string" || params[field] === "") throw new Error(`${field}: must be a non-empty string`);
  }
  const lease = params.lease;
  if (!isObject(lease)) throw new Error("lease: must be an object with providerLeaseId");
  if (lease.providerLeaseId !== null && typeof lease.providerLeaseId !== "string") throw new Error("lease.providerLeaseId: must be a string or null");
  checkExecutionId(params.executionId, "executionId");
  if (params.reason !== undefined && typeof params.reason !== "string") throw new Error("reason: must be a string");
  return params as unknown as CancelExecutionParams;
}

/** The exact identity of one command: the host's tuple, nothing wider. */
export interface ExecutionScope {
  companyId: string;
  environmentId: string;
  providerLeaseId: string;
  executionId: string;
}

const scopeKey = (s: ExecutionScope): string => JSON.stringify([s.companyId, s.environmentId, s.providerLeaseId, s.executionId]);

/**
 * The executes in flight by exact identity, each with its stop. An execute is tracked from the
 * start of its hook (before settings are read or anything is sent), so a cancel that arrives
 * while it still connects finds it; it is forgotten when the hook ends. Concurrent cancels of one
 * command share one stop.
 */
export class Executions {
  private readonly active = new Map<string, { stop: () => Promise<void>; stopping?: Promise<void> }>();

  /** Tracks scope until the returned function is called; a scope already in flight is refused. */
  track(scope: ExecutionScope, stop: () => Promise<void>): () => void {
    const key = scopeKey(scope);
    if (this.active.has(key)) throw new Error("executionId: a command with this id is already running on this lease; refused");
    const entry = { stop };
    this.active.set(key, entry);
    return () => {
      if (this.active.get(key) === entry) this.active.delete(key);
    };
  }

  /** Stops the command of exactly this scope; false, touching nothing, when none is in flight. */
  async cancel(scope: ExecutionScope): Promise<boolean> {
    const entry = this.active.get(scopeKey(scope));
    if (!entry) return false;
    entry.stopping ??= entry.stop();
    await entry.stopping;
    return true;
  }

  get size(): number {
    return this.active.size;
  }
}
