// environmentCancelExecution against the fake kubeclip: the exact command is killed through the
// exec service and nothing else is. The protocol's types are copied by hand from Paperclip's SDK
// source (cancel.ts); the npm SDK 2026.916.1 this runs on does not know the method, so the hook is
// forced on (cancelExecution: true) and called as that source's worker RPC host calls it
// (plugin.definition.onEnvironmentCancelExecution(params)).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";
import { HOST_TO_WORKER_OPTIONAL_METHODS, type PluginEnvironmentExecuteParams, type PluginEnvironmentExecuteResult, type PluginEnvironmentLease } from "@paperclipai/plugin-sdk";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";
import { CANCEL_EXECUTION_METHOD, servesCancelExecution, type CancelExecutionParams, type CancelExecutionResult } from "./cancel.js";
import { createPlugin } from "./plugin.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
const OTHER_COMPANY = "0b6c2e4a-9d1f-4a7b-8c3e-5f2a1d9e6b70";
let n = 0;
// The fake kubeclip names a run's lease pc-<its first 8 characters>: each run its own lease.
const newRun = (): string => `${(0x3c9d7e00 + ++n).toString(16)}-6b8d-4d2f-8a1c-5e7a9b1c3d2f`;

type ExecuteWithId = PluginEnvironmentExecuteParams & { executionId?: unknown };
type Hooks = {
  onEnvironmentCancelExecution?: (p: unknown) => Promise<CancelExecutionResult>;
  onEnvironmentExecute?: (p: ExecuteWithId) => Promise<PluginEnvironmentExecuteResult>;
};

describe("environmentCancelExecution", () => {
  let env: Env;
  let h: Harnessed;
  let hooks: Required<Hooks>;
  const cfg = { backend: "pod", streamRunLogs: false };
  before(async () => {
    env = await startEnv();
    h = await harnessed({ exec: { silenceMs: 500, graceMs: 2_000 }, cancelExecution: true }, { natsUrl: env.server.url });
    const d = h.plugin.definition as Hooks;
    assert.ok(d.onEnvironmentCancelExecution && d.onEnvironmentExecute);
    hooks = { onEnvironmentCancelExecution: d.onEnvironmentCancelExecution, onEnvironmentExecute: d.onEnvironmentExecute };
  });
  after(async () => {
    await h.shutdown();
    await env.close();
  });

  async function acquire(): Promise<PluginEnvironmentLease> {
    const runId = newRun();
    env.sandbox.addLease(C, runId, `pc-${runId.slice(0, 8)}`);
    return h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, runId, agentId: "agent-1", adapterType: "claude_local" });
  }
  const executeParams = (lease: PluginEnvironmentLease, executionId: unknown, command: string, args: string[]): ExecuteWithId => ({
    driverKey: "kubernetes",
    companyId: C,
    environmentId: "env-1",
    config: { ...cfg, ...lease.metadata },
    lease,
    executionId,
    command,
    args,
    timeoutMs: 60_000,
  });
  const cancelParams = (lease: PluginEnvironmentLease, executionId: string, over: Partial<CancelExecutionParams> = {}): CancelExecutionParams => ({
    driverKey: "kubernetes",
    companyId: C,
    environmentId: "env-1",
    config: { ...cfg, ...lease.metadata },
    lease,
    executionId,
    reason: "operator cancelled",
    ...over,
  });
  /** The exec kubeclip started for the command whose args include marker. */
  async function startedExec(marker: string): Promise<string> {
    for (let i = 0; i < 200; i++) {
      const start = env.sandbox.startRequests.find((q) => JSON.stringify(q.args).includes(marker));
      if (typeof start?.execId === "string") return start.execId;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`no exec started for ${marker}`);
  }

  it("is served only when the installed SDK lists the method", () => {
    // The SDK this suite runs on (2026.916.1) does not: by default the plugin defines no hook.
    assert.equal((HOST_TO_WORKER_OPTIONAL_METHODS as readonly string[]).includes(CANCEL_EXECUTION_METHOD), false);
    assert.equal(servesCancelExecution(), false);
    assert.equal((createPlugin().definition as Hooks).onEnvironmentCancelExecution, undefined);
    assert.equal(servesCancelExecution([...HOST_TO_WORKER_OPTIONAL_METHODS, CANCEL_EXECUTION_METHOD]), true);
  });

  it("kills the exact command through the exec service; the execute ends as a cancelled command", async () => {
    const lease = await acquire();
    const id = `execution-${randomUUID()}`;
    const marker = `sleep-${randomUUID().slice(0, 8)}`;
    const t0 = Date.now();
    const exec = h.harness.execute(executeParams(lease, id, "sh", ["-c", `sleep 30 # ${marker}`]));
    const execId = await startedExec(marker);
    const tc = Date.now();
    const r = await hooks.onEnvironmentCancelExecution(cancelParams(lease, id));
    const cancelMs = Date.now() - tc;
    assert.deepEqual(r, { executionId: id, cancelled: true });
    const result = await exec;
    assert.equal(result.exitCode, null, JSON.stringify(result));
    assert.equal(result.metadata?.cancelled, true);
    assert.deepEqual(env.sandbox.signals.filter((s) => s.execId === execId), [{ execId, signal: "SIGKILL", delivered: true }]);
    assert.ok(Date.now() - t0 < 10_000);
    // Ended: the same identity again is stale.
    assert.deepEqual(await hooks.onEnvironmentCancelExecution(cancelParams(lease, id)), { executionId: id, cancelled: false });
    // The id went nowhere near kubeclip: not in the exec's start request (env, stdin, anything).
    const starts = env.sandbox.startRequests.filter((q) => q.execId === execId);
    assert.equal(starts.length, 1);
    assert.ok(!JSON.stringify(starts).includes(id), JSON.stringify(starts));
    console.log(`cancel_ms\t${cancelMs}\texecute_ms\t${Date.now() - t0}`);
  });

  it("answers cancelled: false to any other company, environment, lease or id, and the command runs on", async () => {
    const lease = await acquire();
    const other = await acquire();
    const id = `execution-${randomUUID()}`;
    const marker = `finish-${randomUUID().slice(0, 8)}`;
    const exec = h.harness.execute(executeParams(lease, id, "sh", ["-c", `sleep 0.8; echo finished # ${marker}`]));
    const execId = await startedExec(marker);
    const misses: [string, CancelExecutionParams][] = [
      ["another company", cancelParams(lease, id, { companyId: OTHER_COMPANY })],
      ["another environment", cancelParams(lease, id, { environmentId: "env-2" })],
      ["another lease", cancelParams(other, id)],
      ["no lease", cancelParams({ providerLeaseId: null }, id)],
      ["an unknown id", cancelParams(lease, `execution-${randomUUID()}`)],
    ];
    for (const [what, p] of misses) {
      assert.deepEqual(await hooks.onEnvironmentCancelExecution(p), { executionId: p.executionId, cancelled: false }, what);
    }
    const result = await exec;
    assert.equal(result.exitCode, 0, JSON.stringify(result));
    assert.equal(result.stdout, "finished\n");
    assert.equal(result.metadata?.cancelled, undefined);
    assert.deepEqual(env.sandbox.signals.filter((s) => s.execId === execId), []);
  });

  it("stops an execute cancelled before it sent anything: no exec is started", async () => {
    const lease = await acquire();
    const id = `execution-${randomUUID()}`;
    const marker = `never-${randomUUID().slice(0, 8)}`;
    const starts = env.sandbox.startRequests.length;
    // Called as the SDK's host calls it: the hook tracks the id before its first await.
    const exec = hooks.onEnvironmentExecute(executeParams(lease, id, "sh", ["-c", `echo ran # ${marker}`]));
    const r = await hooks.onEnvironmentCancelExecution(cancelParams(lease, id));
    assert.deepEqual(r, { executionId: id, cancelled: true });
    const result = await exec;
    assert.deepEqual(result, { exitCode: null, signal: null, timedOut: false, stdout: "", stderr: "", metadata: { cancelled: true } });
    assert.equal(env.sandbox.startRequests.slice(starts).some((q) => JSON.stringify(q.args).includes(marker)), false);
  });

  it("refuses a second command with an id already running on the lease", async () => {
    const lease = await acquire();
    const id = `execution-${randomUUID()}`;
    const marker = `first-${randomUUID().slice(0, 8)}`;
    const first = h.harness.execute(executeParams(lease, id, "sh", ["-c", `sleep 30 # ${marker}`]));
    await startedExec(marker);
    await assert.rejects(h.harness.execute(executeParams(lease, id, "true", [])), /^Error: executionId: a command with this id is already running on this lease; refused$/);
    assert.deepEqual(await hooks.onEnvironmentCancelExecution(cancelParams(lease, id)), { executionId: id, cancelled: true });
    assert.equal((await first).metadata?.cancelled, true);
  });

  it("refuses malformed input naming the field", async () => {
    const lease = await acquire();
    const base = cancelParams(lease, "x");
    const cases: [string, unknown, RegExp][] = [
      ["not an object", "cancel", /^Error: params: must be an object$/],
      ["no companyId", { ...base, companyId: undefined }, /^Error: companyId: must be a non-empty string$/],
      ["no environmentId", { ...base, environmentId: "" }, /^Error: environmentId: must be a non-empty string$/],
      ["no executionId", { ...base, executionId: undefined }, /^Error: executionId: must be a non-empty string/],
      ["an empty executionId", { ...base, executionId: "" }, /^Error: executionId: must be a non-empty string/],
      ["a too long executionId", { ...base, executionId: "x".repeat(513) }, /^Error: executionId: longer than 512 characters$/],
      ["a lease that is no object", { ...base, lease: "pc-1" }, /^Error: lease: must be an object/],
      ["a numeric providerLeaseId", { ...base, lease: { providerLeaseId: 5 } }, /^Error: lease\.providerLeaseId: must be a string or null$/],
      ["a numeric reason", { ...base, reason: 1 }, /^Error: reason: must be a string$/],
    ];
    for (const [what, p, want] of cases) await assert.rejects(hooks.onEnvironmentCancelExecution(p), want, what);
    const starts = env.sandbox.startRequests.length;
    await assert.rejects(h.harness.execute(executeParams(lease, 42, "true", [])), /^Error: executionId: must be a non-empty string/);
    assert.equal(env.sandbox.startRequests.length, starts, "a refused execute sends nothing");
  });
});
