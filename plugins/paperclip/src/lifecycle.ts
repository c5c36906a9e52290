// A lease's life through the hooks: acquire (JetStream lease request `acquire`, wait for
// `created`/`failed`), resume of a reusable lease, and release/destroy (wait for
// `released`/`failed`, the receipt). Each is a function over the worker's Provider.

import { randomUUID } from "node:crypto";
import type {
  PluginEnvironmentAcquireLeaseParams,
  PluginEnvironmentDestroyLeaseParams,
  PluginEnvironmentLease,
  PluginEnvironmentReleaseLeaseParams,
  PluginEnvironmentResumeLeaseParams,
  PluginEnvironmentTerminationReceipt,
} from "@paperclipai/plugin-sdk";
import { brokeredDefaults } from "./broker.js";
import { EXEC_BACKENDS, checkProviderConfig, splitConfig } from "./config.js";
import { KubeclipError, TimeoutError, errorMessage, scrub } from "./errors.js";
import { findCaseVariantKey, isObject } from "./json.js";
import { leaseKey, type AcquireRequest, type CreatedEvent } from "./leases.js";
import { DEFAULT_RPC_BUDGET_MS, REMOTE_CWD, leaseMetadata, type KubeclipLeaseMetadata, type Link, type Provider } from "./provider.js";

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

export async function acquireLease(p: Provider, params: PluginEnvironmentAcquireLeaseParams): Promise<PluginEnvironmentLease> {
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
  // A brokered key's real value would reach the run's Secret through defaultEnv: refused.
  const link = await p.link(params.companyId, params.config, (s) => {
    const unbrokered = brokeredDefaults(split.provider, s.brokeredKeys ?? []);
    if (unbrokered.length > 0) throw new Error(unbrokered.join("; "));
  });
  // Reusable only when declared and the host can find the lease again (docs/reuse.md, the host's rules §1).
  const reuse = p.reusableLeases && params.config.reuseLease === true && !!params.executionWorkspaceId && !!params.agentId;
  const created = await requestAcquire(p, link, params, { agentId, provider: split.provider, reuse });
  p.stats.of(leaseKey(params.companyId, created.providerLeaseId)).hook("acquireLease");
  p.remember(created.providerLeaseId, { runId: params.runId, companyId: params.companyId, backend: created.backend, config: params.config });
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
  const syncable = (EXEC_BACKENDS as readonly string[]).includes(created.backend) && link.settings.nativeSync !== false;
  return {
    providerLeaseId: created.providerLeaseId,
    expiresAt: created.expiresAt,
    metadata: { remoteCwd: REMOTE_CWD, kubeclip, ...(syncable ? {} : { nativeFileSyncUnsupported: true }) },
  };
}

/** The acquire's lease request to kubeclip, logged with its outcome and latency. */
async function requestAcquire(
  p: Provider,
  link: Link,
  params: PluginEnvironmentAcquireLeaseParams,
  req: { agentId: string; provider: AcquireRequest["config"]; reuse: boolean },
): Promise<CreatedEvent> {
  const { conn } = link;
  const leases = p.leasesOn(link.nc, conn.prefix);
  const log = p.context().logger;
  log.info("lease acquire requested", { runId: params.runId, reuseLease: req.reuse });
  const t0 = Date.now();
  const created = await leases
    .acquire(
      {
        runId: params.runId,
        companyId: params.companyId,
        environmentId: params.environmentId,
        agentId: req.agentId,
        issueId: params.issueId ?? undefined,
        adapterType: params.adapterType,
        executionWorkspaceSettings: params.executionWorkspaceSettings ?? undefined,
        requestedExpiresAt: params.requestedExpiresAt ?? undefined,
        config: req.provider,
        reuseLease: req.reuse,
      },
      { timeoutMs: conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS, display: conn.display },
    )
    .catch((err: unknown) => {
      log.warn("lease acquire failed", { runId: params.runId, error: scrub(errorMessage(err), conn.secrets) });
      throw err;
    });
  log.info("lease acquired", { runId: params.runId, providerLeaseId: created.providerLeaseId, backend: created.backend, acquireMs: Date.now() - t0 });
  return created;
}

/**
 * Resumes a reusable lease for the agent's next run, answering the expiry the resume renewed.
 * A lease kubeclip no longer has (destroyed, collected, not reusable) is answered with no
 * lease, so the host destroys it and acquires afresh (docs/reuse.md, the host's rules §3); anything
 * else that goes wrong is thrown, as an error the host retries when the lease is only busy.
 */
export async function resumeLease(p: Provider, params: PluginEnvironmentResumeLeaseParams): Promise<PluginEnvironmentLease> {
  const { meta, companyId } = p.lease(params.leaseMetadata, params.companyId, "leaseMetadata");
  const gone: PluginEnvironmentLease = { providerLeaseId: null, metadata: { expired: true } };
  if (!meta.reusable || params.providerLeaseId !== meta.workloadName) return gone;
  const { conn, nc } = await p.link(companyId, params.config);
  const leases = p.leasesOn(nc, conn.prefix);
  const log = p.context().logger;
  const ids = { runId: meta.runId, providerLeaseId: params.providerLeaseId };
  const t0 = Date.now();
  try {
    const r = await leases.resume(
      { runId: meta.runId, companyId, providerLeaseId: params.providerLeaseId, resumeId: randomUUID() },
      { timeoutMs: conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS, display: conn.display },
    );
    p.stats.of(leaseKey(companyId, params.providerLeaseId)).hook("resumeLease");
    p.remember(params.providerLeaseId, { runId: meta.runId, companyId, backend: meta.backend, config: params.config });
    log.info("lease resumed", { ...ids, from: r.from, generation: r.generation, resumeMs: Date.now() - t0 });
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
      log.info("lease gone; the host acquires afresh", ids);
      return gone;
    }
    if (err instanceof KubeclipError && err.code === "agent_busy") {
      // Another run of the agent holds it: the lease is kept, only not now. The host retries
      // a resume within its minute when the message reads as transient (docs/reuse.md, the host's rules §3);
      // answering "no lease" would make it destroy the agent's workspace and home instead.
      log.info("lease's agent busy; the host retries the resume", ids);
      throw new KubeclipError(err.code, `${err.message.replace(/^agent_busy: /, "")}: service unavailable until that run ends`, err.field);
    }
    // The host retries a resume within its minute only when the error reads as transient
    // (docs/reuse.md, the host's rules §3); a retry continues the same resume (a new pod is waited for, not made
    // twice).
    if (err instanceof TimeoutError) throw new TimeoutError(`resume of lease ${params.providerLeaseId} timed out: ${err.message}`);
    log.warn("lease resume failed", { ...ids, error: scrub(errorMessage(err), conn.secrets) });
    throw err;
  }
}

/**
 * A release or destroy: kubeclip's receipt for a lease of this company's runs; for a lease
 * nothing of this company's runs under, a receipt that nothing is there (unknownLeaseReceipt).
 */
export async function endLease(
  p: Provider,
  params: PluginEnvironmentReleaseLeaseParams | PluginEnvironmentDestroyLeaseParams,
  asked: "release" | "destroy",
): Promise<PluginEnvironmentTerminationReceipt | undefined> {
  const providerLeaseId = params.providerLeaseId;
  if (!providerLeaseId) return undefined; // nothing was acquired
  if (!params.companyId) throw new Error("companyId: Paperclip sent no company id; refused");
  // A lease the plugin cannot map to a run of this company is answered at once, and nothing of
  // anyone's is touched: no request to kubeclip, no command cancelled, nothing forgotten.
  const nothingHere = (why: string, runId?: string): PluginEnvironmentTerminationReceipt => {
    p.context().logger.warn(`lease ${asked}: nothing of this company's runs under this lease; answered with a receipt`, { providerLeaseId, ...(runId ? { runId } : {}), reason: why });
    return unknownLeaseReceipt(providerLeaseId);
  };
  let meta: KubeclipLeaseMetadata;
  try {
    meta = leaseMetadata(params.leaseMetadata, "leaseMetadata");
  } catch {
    return nothingHere("the lease metadata has no kubeclip.runId: kubeclip's plugin did not acquire it");
  }
  if (meta.companyId && meta.companyId !== params.companyId) return nothingHere("the lease metadata names another company", meta.runId);
  const { companyId } = p.lease(params.leaseMetadata, params.companyId, "leaseMetadata");
  // A reusable lease the host cannot resume (its lease has no reuse scope: a run without an
  // execution workspace, docs/reuse.md, the host's rules §1) is destroyed, not kept. Each of its
  // releases names itself by the resume it follows: a retried one is the same request. A
  // destroy names nothing: a lease is destroyed once, and its answer is the lease's one
  // `released {destroyed}`, whoever ended it (this destroy, an earlier one, kubeclip's
  // collection), which kubeclip publishes without a releaseId.
  const kind = meta.reusable && asked === "release" && !isObject(params.leaseMetadata?.reusableSandboxLease) ? "destroy" : asked;
  const releaseId = meta.reusable && kind === "release" ? String(meta.resumes ?? 0) : undefined;
  const cancel = params.cancelActiveWork === true;
  const { conn, nc } = await p.link(companyId, params.config);
  const leases = p.leasesOn(nc, conn.prefix);
  const log = p.context().logger;
  const ids = { runId: meta.runId, providerLeaseId };
  log.info(`lease ${kind} requested`, { ...ids, cancelActiveWork: cancel });
  const t0 = Date.now();
  try {
    const released = await leases.release({ runId: meta.runId, companyId, providerLeaseId, cancelActiveWork: cancel, releaseId }, kind, {
      timeoutMs: conn.timeoutMs ?? DEFAULT_RPC_BUDGET_MS,
      display: conn.display,
    });
    // kubeclip has no lease of this company for the run: the id may still be one of the
    // company's live leases, misnamed, whose commands and state must stay.
    if (released.unknown) return nothingHere("kubeclip has no lease of this company for the run", meta.runId);
    forgetLease(p, companyId, providerLeaseId, cancel);
    const s = p.stats.take(leaseKey(companyId, providerLeaseId));
    s?.hook(`${kind}Lease`);
    // One line per lease with what it cost: the hook calls and the execute latencies.
    log.info(kind === "destroy" ? "lease destroyed" : "lease released", { ...ids, state: released.state, [`${kind}Ms`]: Date.now() - t0, ...s?.summary() });
    return { providerLeaseId, state: released.state };
  } catch (err) {
    log.warn(`lease ${kind} failed`, { ...ids, error: scrub(errorMessage(err), conn.secrets) });
    throw err;
  }
}

/**
 * kubeclip answered for this company's lease: only now are its commands cancelled (when asked)
 * and its login lease and placeholders forgotten (a refused release ends nothing of the
 * plugin's either).
 */
function forgetLease(p: Provider, companyId: string, providerLeaseId: string, cancel: boolean): void {
  const key = leaseKey(companyId, providerLeaseId);
  if (cancel) {
    for (const c of p.inflight.get(key) ?? []) c.abort();
  }
  p.leaseBook.delete(key);
  p.placeholders.forget(companyId, providerLeaseId);
}
