// The plugin under the SDK's environment test harness, with ctx.execution.log captured (the
// harness's own is a no-op) and a real NATS server plus fake kubeclip behind it.

import { connect, type NatsConnection } from "@nats-io/transport-node";
import { createEnvironmentTestHarness, type EnvironmentTestHarness } from "@paperclipai/plugin-sdk/testing";
import type { PaperclipPlugin } from "@paperclipai/plugin-sdk";
import manifest from "../../src/manifest.js";
import { createPlugin, type PluginOptions } from "../../src/plugin.js";
import { FakeKubeclip } from "./fake-kubeclip.js";
import { FakeExecReplica, FakeSandbox } from "./fake-exec.js";
import { startNatsServer, type NatsServer } from "./nats-server.js";

export interface LogChunk {
  stream: "stdout" | "stderr";
  chunk: string;
}

export interface Env {
  server: NatsServer;
  nc: NatsConnection;
  kubeclip: FakeKubeclip;
  sandbox: FakeSandbox;
  replicas: FakeExecReplica[];
  close(): Promise<void>;
}

/**
 * A NATS server with JetStream, the fake kubeclip and one exec replica. With config (a
 * nats-server config), the fakes connect as `admin` (password `admin`), which it must define.
 */
export async function startEnv(config?: string): Promise<Env> {
  const server = await startNatsServer(config);
  const nc = await connect({ servers: server.url, ...(config !== undefined ? { user: "admin", pass: "admin" } : {}) });
  const kubeclip = await FakeKubeclip.start(nc);
  const sandbox = new FakeSandbox();
  const replicas = [new FakeExecReplica(nc, sandbox, "ew-a")];
  await nc.flush();
  return {
    server,
    nc,
    kubeclip,
    sandbox,
    replicas,
    async close() {
      sandbox.killAll();
      for (const r of replicas) r.die();
      await kubeclip.close();
      await nc.close();
      await server.stop();
      // Every exec request and io message the suite sent kept to docs/exec.md and its schemas.
      if (sandbox.invalid.length > 0) throw new Error(`exec protocol broken: ${JSON.stringify(sandbox.invalid.slice(0, 5))}`);
    },
  };
}

export interface Harnessed {
  plugin: PaperclipPlugin;
  harness: EnvironmentTestHarness;
  logs: LogChunk[];
  shutdown(): Promise<void>;
}

/**
 * The plugin under the harness. keepLogs false: execute.log chunks are serialised as the SDK's
 * notification would be and dropped, not kept (a test that measures the process's memory).
 */
export async function harnessed(
  options: PluginOptions = { exec: { silenceMs: 500, graceMs: 2_000 } },
  settings?: Record<string, unknown>,
  keepLogs = true,
): Promise<Harnessed> {
  const plugin = createPlugin(options);
  const d = plugin.definition;
  const need = <T>(h: T | undefined): T => {
    if (!h) throw new Error("hook missing");
    return h;
  };
  const harness = createEnvironmentTestHarness({
    manifest,
    ...(settings ? { config: settings } : {}),
    environmentDriver: {
      driverKey: "kubernetes",
      onValidateConfig: (p) => need(d.onEnvironmentValidateConfig?.bind(d))(p),
      onProbe: (p) => need(d.onEnvironmentProbe?.bind(d))(p),
      onAcquireLease: (p) => need(d.onEnvironmentAcquireLease?.bind(d))(p),
      onResumeLease: (p) => need(d.onEnvironmentResumeLease?.bind(d))(p),
      onReleaseLease: (p) => need(d.onEnvironmentReleaseLease?.bind(d))(p),
      onDestroyLease: (p) => need(d.onEnvironmentDestroyLease?.bind(d))(p),
      onRealizeWorkspace: (p) => need(d.onEnvironmentRealizeWorkspace?.bind(d))(p),
      onExecute: (p) => need(d.onEnvironmentExecute?.bind(d))(p),
    },
  });
  const logs: LogChunk[] = [];
  Object.defineProperty(harness.ctx, "execution", {
    value: {
      log(stream: "stdout" | "stderr", chunk: string) {
        if (keepLogs) logs.push({ stream, chunk });
        else JSON.stringify({ jsonrpc: "2.0", method: "execute.log", params: { stream, chunk } });
      },
    },
  });
  await d.setup(harness.ctx);
  // As Paperclip does at start: the stored settings, instance-wide (validateConfig reads these).
  if (settings) await d.onConfigChanged?.(settings, { companyId: null });
  return {
    plugin,
    harness,
    logs,
    async shutdown() {
      await d.onShutdown?.();
    },
  };
}
