// The plugin behind the SDK's real JSON-RPC host (runWorker over in-memory streams), driven the
// way Paperclip's server drives a worker: newline-delimited JSON-RPC 2.0.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { after, before, describe, it } from "node:test";
import { runWorker } from "@paperclipai/plugin-sdk";
import manifest from "../src/manifest.js";
import { createPlugin, type PluginOptions } from "../src/plugin.js";
import { startEnv, type Env } from "./support/harness.js";

interface RpcMessage {
  id?: number;
  method?: string;
  result?: unknown;
  error?: { code: number; message: string };
  params?: Record<string, unknown>;
  paperclipInvocationId?: string;
}

class Host {
  private readonly toWorker = new PassThrough();
  private readonly fromWorker = new PassThrough();
  readonly notifications: RpcMessage[] = [];
  private readonly pending = new Map<number, (m: RpcMessage) => void>();
  private nextId = 1;
  private buf = "";

  constructor(options: PluginOptions = {}) {
    runWorker(createPlugin({ exec: { silenceMs: 500, graceMs: 2_000 }, ...options }), "file:///not-the-entrypoint.js", { stdin: this.toWorker, stdout: this.fromWorker });
    this.fromWorker.on("data", (b: Buffer) => {
      this.buf += b.toString("utf8");
      let i;
      while ((i = this.buf.indexOf("\n")) >= 0) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        if (line.trim() === "") continue;
        const m = JSON.parse(line) as RpcMessage;
        if (m.id !== undefined && m.method === undefined) this.pending.get(m.id)?.(m);
        else if (m.method !== undefined && m.id === undefined) this.notifications.push(m);
        else if (m.method !== undefined && m.id !== undefined) this.answer(m.id, m.method);
      }
    });
  }

  readonly hostCalls: string[] = [];
  /** The plugin's settings, as Paperclip's config.get answers them. */
  settings: Record<string, unknown> = {};

  /** Worker→host calls: the plugin reads its (empty) settings; nothing else is expected. */
  private answer(id: number, method: string): void {
    this.hostCalls.push(method);
    const reply = method === "config.get" ? { jsonrpc: "2.0", id, result: this.settings } : { jsonrpc: "2.0", id, error: { code: -32601, message: `unexpected ${method}` } };
    this.toWorker.write(JSON.stringify(reply) + "\n");
  }

  async call(method: string, params: unknown, invocationId?: string): Promise<RpcMessage> {
    const id = this.nextId++;
    const p = new Promise<RpcMessage>((resolve) => this.pending.set(id, resolve));
    const msg: Record<string, unknown> = { jsonrpc: "2.0", id, method, params };
    if (invocationId) msg.paperclipInvocation = { id: invocationId };
    this.toWorker.write(JSON.stringify(msg) + "\n");
    return p;
  }
}

describe("worker protocol", () => {
  let env: Env;
  let host: Host;
  const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
  const R = "2e8b6f4a-5a7c-4c1e-9f0b-2a9d7c3e1b44";
  before(async () => {
    env = await startEnv();
    env.sandbox.addLease(C, R, `pc-${R.slice(0, 8)}`);
    host = new Host();
    host.settings = { natsUrl: env.server.url };
  });
  after(async () => {
    await host.call("shutdown", {});
    await env.close();
  });

  it("initializes and advertises exactly the hooks it defines", async () => {
    const r = await host.call("initialize", { manifest, config: {}, instanceInfo: { instanceId: "test", hostVersion: "2026.916.1" }, apiVersion: 1 });
    assert.equal(r.error, undefined, JSON.stringify(r.error));
    assert.deepEqual(r.result, {
      ok: true,
      supportedMethods: [
        "configChanged",
        "health",
        "shutdown",
        "environmentValidateConfig",
        "environmentProbe",
        "environmentAcquireLease",
        "environmentResumeLease",
        "environmentReleaseLease",
        "environmentDestroyLease",
        "environmentRealizeWorkspace",
        "environmentExecute",
        "environmentSyncIn",
        "environmentSyncOut",
        "loginPtyOpen",
        "loginPtyInput",
        "loginPtyStop",
        "loginPtyClose",
      ],
    });
  });

  it("validates, acquires, executes with execute.log in the invocation, and releases", async () => {
    const config = { backend: "pod", streamRunLogs: false };
    // Paperclip delivers the stored settings (validateConfig, which has no company, reads these).
    const changed = await host.call("configChanged", { config: host.settings });
    assert.equal(changed.error, undefined, JSON.stringify(changed.error));
    const v = await host.call("environmentValidateConfig", { driverKey: "kubernetes", config });
    assert.equal((v.result as { ok: boolean }).ok, true, JSON.stringify(v));

    const bad = await host.call("environmentAcquireLease", { driverKey: "kubernetes", companyId: C, environmentId: "e", config: { ...config, backend: "job" }, runId: R, agentId: "a" });
    assert.match(bad.error?.message ?? "", /^config\.backend: "job"/);

    const a = await host.call("environmentAcquireLease", { driverKey: "kubernetes", companyId: C, environmentId: "e", config, runId: R, agentId: "a", adapterType: "claude_local" }, "inv-acquire");
    const lease = a.result as { providerLeaseId: string; metadata: Record<string, unknown> };
    assert.equal(lease.providerLeaseId, `pc-${R.slice(0, 8)}`);

    const e = await host.call(
      "environmentExecute",
      { driverKey: "kubernetes", companyId: C, environmentId: "e", config: { ...config, ...lease.metadata }, lease, command: "sh", args: ["-c", "echo out; echo err >&2"], timeoutMs: 10_000 },
      "inv-exec",
    );
    assert.deepEqual(e.result, {
      exitCode: 0,
      signal: null,
      timedOut: false,
      stdout: "out\n",
      stderr: "err\n",
      metadata: (e.result as { metadata: unknown }).metadata,
    });
    const logs = host.notifications.filter((n) => n.method === "execute.log");
    assert.deepEqual(
      logs.map((n) => [n.paperclipInvocationId, n.params]),
      [
        ["inv-exec", { stream: "stdout", chunk: "out\n" }],
        ["inv-exec", { stream: "stderr", chunk: "err\n" }],
      ],
    );

    assert.deepEqual([...new Set(host.hostCalls)], ["config.get"]);
    const rel = await host.call("environmentReleaseLease", { driverKey: "kubernetes", companyId: C, environmentId: "e", config, providerLeaseId: lease.providerLeaseId, leaseMetadata: lease.metadata });
    assert.deepEqual(rel.result, { providerLeaseId: lease.providerLeaseId, state: "stopped" });
  });

  it("runs a login terminal: loginPty.output and loginPty.exit notifications carry the route and session ids", async () => {
    // The pod's `claude setup-token`, as tests/images/claude-stub answers it.
    const bin = mkdtempSync(join(tmpdir(), "kubeclip-loginpty-rpc-"));
    writeFileSync(join(bin, "claude"), '#!/bin/sh\nprintf "code? "\nread -r code\necho "saved ${#code}"\n');
    chmodSync(join(bin, "claude"), 0o755);
    const savedPath = process.env.PATH;
    process.env.PATH = `${bin}:${savedPath ?? ""}`;
    const sessionHome = `/tmp/paperclip-adapter-login/${randomUUID()}`;
    try {
      const runId = "3e8b6f4a-5a7c-4c1e-9f0b-2a9d7c3e1b44";
      env.sandbox.addLease(C, runId, `pc-${runId.slice(0, 8)}`);
      const config = { backend: "pod", streamRunLogs: false };
      const a = await host.call("environmentAcquireLease", { driverKey: "kubernetes", companyId: C, environmentId: "e", config, runId, agentId: "a", adapterType: "claude_local" });
      const providerLeaseId = (a.result as { providerLeaseId: string }).providerLeaseId;
      const hostRouteId = randomUUID();
      const o = await host.call("loginPtyOpen", { hostRouteId, driverKey: "kubernetes", companyId: C, environmentId: "e", providerLeaseId, loginCommandKey: "claude", sessionHome });
      assert.equal(o.error, undefined, JSON.stringify(o.error));
      const { workerSessionId } = o.result as { workerSessionId: string };
      const sent = (method: string): RpcMessage[] => host.notifications.filter((n) => n.method === method && n.params?.hostRouteId === hostRouteId);
      const text = (): string => sent("loginPty.output").map((n) => String(n.params?.chunk)).join("");
      for (const end = Date.now() + 5_000; !text().includes("code? "); ) {
        assert.ok(Date.now() < end, "no prompt within 5 s");
        await new Promise((r) => setTimeout(r, 20));
      }
      const i = await host.call("loginPtyInput", { workerSessionId, data: "abc\r\n" });
      assert.equal(i.error, undefined, JSON.stringify(i.error));
      for (const end = Date.now() + 5_000; sent("loginPty.exit").length === 0; ) {
        assert.ok(Date.now() < end, "no exit within 5 s");
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.ok(text().includes("saved 4"), text());
      assert.deepEqual(sent("loginPty.exit").map((n) => n.params), [{ hostRouteId, workerSessionId, exitCode: 0 }]);
      assert.ok(sent("loginPty.output").every((n) => n.params?.workerSessionId === workerSessionId && n.paperclipInvocationId === undefined));
      const c = await host.call("loginPtyClose", { hostRouteId });
      assert.deepEqual(c.result, { hostRouteId });
    } finally {
      process.env.PATH = savedPath;
      rmSync(bin, { recursive: true, force: true });
      rmSync(sessionHome, { recursive: true, force: true });
    }
  });

  it("with an SDK that does not know environmentCancelExecution, neither advertises nor serves it, even with the hook defined", async () => {
    // The installed SDK (2026.916.1) advertises only the methods it knows; the host never calls
    // one a worker does not advertise. Its RPC host answers the method as unknown.
    const forced = new Host({ cancelExecution: true });
    forced.settings = { natsUrl: env.server.url };
    try {
      const init = await forced.call("initialize", { manifest, config: {}, instanceInfo: { instanceId: "test", hostVersion: "2026.916.1" }, apiVersion: 1 });
      assert.equal(init.error, undefined, JSON.stringify(init.error));
      const advertised = (init.result as { supportedMethods: string[] }).supportedMethods;
      assert.equal(advertised.includes("environmentCancelExecution"), false, JSON.stringify(advertised));
      assert.ok(advertised.includes("environmentExecute"));
      const r = await forced.call("environmentCancelExecution", { driverKey: "kubernetes", companyId: C, environmentId: "e", config: {}, lease: { providerLeaseId: "x" }, executionId: "e-1", reason: "test" });
      assert.equal(r.error?.code, -32601, JSON.stringify(r));
    } finally {
      await forced.call("shutdown", {});
    }
  });

  it("answers undefined hooks with METHOD_NOT_IMPLEMENTED", async () => {
    const r = await host.call("environmentRunnerIngressEndpoint", { driverKey: "kubernetes", companyId: C, environmentId: "e", config: {}, providerLeaseId: "x" });
    assert.equal(r.error?.code, -32004);
  });
});
