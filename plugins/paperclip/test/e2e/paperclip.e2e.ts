// End to end with the REAL Paperclip server from npm (hack/paperclip/paperclip.sh): install it
// (cached), start `paperclipai test-drive`, install this plugin from the worktree, and check
// through Paperclip's HTTP API that the `kubernetes` sandbox provider is the plugin's and that
// environment creation gets kubeclip's verdict (here a fake kubeclip on a real nats-server).
//
// Run: make plugin-e2e (needs root to create the server's user on a fresh machine, and ~2 min
// cold, ~30 s warm). The full run with real kubeclip workers belongs to tests/e2e.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { FakeKubeclip } from "../support/fake-kubeclip.js";
import { startNatsServer, type NatsServer } from "../support/nats-server.js";

const run = promisify(execFile);
// build/test/e2e → the package root, and the repository root above it.
const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const script = join(pkgDir, "..", "..", "hack", "paperclip", "paperclip.sh");

async function pc(...args: string[]): Promise<string> {
  const t0 = Date.now();
  const { stdout, stderr } = await run("bash", [script, ...args], { maxBuffer: 64 << 20 });
  console.log(`paperclip.sh ${args[0] ?? ""}: ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  if (stderr.trim()) console.log(stderr.trim().split("\n").slice(-5).join("\n"));
  return stdout;
}

function parseEnv(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split("\n")) {
    const m = /^([A-Z_]+)=(.*)$/.exec(line.trim());
    if (m?.[1]) out[m[1]] = m[2] ?? "";
  }
  return out;
}

interface Json {
  [key: string]: unknown;
}

async function api(url: string, init?: { method: string; body: unknown }): Promise<{ status: number; body: Json }> {
  const res = await fetch(url, {
    method: init?.method ?? "GET",
    headers: { "content-type": "application/json" },
    ...(init ? { body: JSON.stringify(init.body) } : {}),
  });
  return { status: res.status, body: (await res.json()) as Json };
}

describe("the real Paperclip server with the kubeclip plugin", { timeout: 600_000 }, () => {
  let nats: NatsServer;
  let nc: NatsConnection;
  let kubeclip: FakeKubeclip;
  let base: string;
  let company: string;
  let started = false;

  before(async () => {
    nats = await startNatsServer();
    nc = await connect({ servers: nats.url });
    kubeclip = await FakeKubeclip.start(nc);
    await pc("install");
    const state = parseEnv(await pc("start"));
    started = true;
    base = `${state.PAPERCLIP_URL ?? ""}/api`;
    company = state.PAPERCLIP_COMPANY_ID ?? "";
    assert.ok(base.startsWith("http://127.0.0.1:"), "start printed the URL");
    assert.match(company, /^[0-9a-f-]{36}$/, "start printed the company id");
    assert.match(state.PAPERCLIP_AGENT_ID ?? "", /^[0-9a-f-]{36}$/, "start printed the agent id");
    await pc("plugin-install", pkgDir);
  });

  after(async () => {
    if (started) await pc("stop");
    await kubeclip.close();
    await nc.close();
    await nats.stop();
  });

  it("lists the plugin's kubernetes provider as supported for claude_local", async () => {
    const { status, body } = await api(`${base}/companies/${company}/environments/capabilities`);
    assert.equal(status, 200);
    const providers = body.sandboxProviders as Record<string, Json>;
    const k = providers.kubernetes;
    assert.ok(k, JSON.stringify(Object.keys(providers)));
    assert.equal(k.status, "supported");
    assert.equal(k.source, "plugin");
    assert.equal(k.pluginKey, "kubeclip.paperclip-sandbox-provider");
    assert.equal(k.supportsRunExecution, true);
    const adapters = body.adapters as { adapterType: string; sandboxProviders: Record<string, string> }[];
    assert.equal(adapters.find((a) => a.adapterType === "claude_local")?.sandboxProviders.kubernetes, "supported");
  });

  it("creates an environment with kubeclip's verdict", async () => {
    const before = kubeclip.validateRequests.length;
    const { status, body } = await api(`${base}/companies/${company}/environments`, {
      method: "POST",
      body: { name: "kubeclip", driver: "sandbox", config: { provider: "kubernetes", natsUrl: nats.url, backend: "pod", streamRunLogs: false, inCluster: true } },
    });
    assert.equal(status, 201, JSON.stringify(body));
    assert.deepEqual(kubeclip.validateRequests.slice(before), [{ backend: "pod" }], "kubeclip saw only the provider config");
    const config = body.config as Json;
    assert.equal(config.provider, "kubernetes");
    assert.equal(config.natsUrl, nats.url);
    assert.equal(config.backend, "pod");
    assert.equal(config.streamRunLogs, false);
    assert.equal("inCluster" in config, false, "ignored keys are not stored");
  });

  it("refuses a config kubeclip refuses, with kubeclip's message (HTTP 422)", async () => {
    kubeclip.onValidate = () => ({ ok: false, errors: [{ field: "config.egressAllowCidrs[0]", message: '"10.0.0.0/33" is not an IPv4 CIDR' }], warnings: [] });
    try {
      const { status, body } = await api(`${base}/companies/${company}/environments`, {
        method: "POST",
        body: { name: "kubeclip-bad", driver: "sandbox", config: { provider: "kubernetes", natsUrl: nats.url, backend: "pod", egressAllowCidrs: ["10.0.0.0/33"] } },
      });
      assert.equal(status, 422, JSON.stringify(body));
      assert.equal(body.error, 'config.egressAllowCidrs[0]: "10.0.0.0/33" is not an IPv4 CIDR');
    } finally {
      kubeclip.onValidate = (config) => ({ ok: true, errors: [], warnings: [], normalizedConfig: config });
    }
  });

  it("refuses the job backend and an unreachable kubeclip (HTTP 422)", async () => {
    const job = await api(`${base}/companies/${company}/environments`, {
      method: "POST",
      body: { name: "kubeclip-job", driver: "sandbox", config: { provider: "kubernetes", natsUrl: nats.url, backend: "job" } },
    });
    assert.equal(job.status, 422);
    assert.match(String(job.body.error), /^config\.backend: "job"/);
    const dead = await api(`${base}/companies/${company}/environments`, {
      method: "POST",
      body: { name: "kubeclip-dead", driver: "sandbox", config: { provider: "kubernetes", natsUrl: "nats://127.0.0.1:1", backend: "pod" } },
    });
    assert.equal(dead.status, 422);
    assert.match(String(dead.body.error), /^kubeclip unreachable at nats:\/\/127\.0\.0\.1:1: /);
  });

  it("probes kubeclip through the plugin", async () => {
    const { status, body } = await api(`${base}/companies/${company}/environments/probe-config`, {
      method: "POST",
      body: { driver: "sandbox", config: { provider: "kubernetes", natsUrl: nats.url, backend: "pod" } },
    });
    assert.equal(status, 200, JSON.stringify(body));
    assert.equal(body.ok, true, JSON.stringify(body));
    assert.match(String(body.summary), /workers answering: .*exec-worker×1/);
  });
});
