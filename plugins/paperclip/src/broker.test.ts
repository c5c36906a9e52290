import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, beforeEach, describe, it } from "node:test";
import type { PluginEnvironmentLease } from "@paperclipai/plugin-sdk";
import type { Subscription } from "@nats-io/transport-node";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";
import { isPlaceholder } from "./broker.js";

// The plugin against a real nats-server (the fake kubeclip and exec replica of the other suites)
// and a tiny mint responder standing in for cmd/credential-broker: it answers
// paperclip.broker.<c>.<r>.mint as pkg/broker/mintproto says, one placeholder per company,
// lease and key, as the real broker's idempotent Mint does. Every message on the server is
// tapped, so what crossed the wire is inspected, not assumed.

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
let n = 0;
const newRun = (): string => `${(0x2f9c7a00 + ++n).toString(16)}-6b8d-4d2f-8a1c-000000000000`;
const ANTHROPIC = `sk-ant-real-${randomBytes(12).toString("hex")}`;
const OPENAI = `sk-openai-real-${randomBytes(12).toString("hex")}`;
const b64 = (len: number): string => randomBytes(len).toString("base64url");

interface Mint {
  subject: string;
  leaseId: string;
  key: string;
}

describe("brokered keys", () => {
  let env: Env;
  let h: Harnessed;
  let tap: { subject: string; data: string }[];
  let mints: Mint[];
  let mintSub: Subscription | undefined;
  /** What the responder answers; default: a placeholder, the same for a lease's key. */
  let answer: (req: Mint) => Record<string, unknown>;
  const issued = new Map<string, string>();
  const cfg = { backend: "pod", streamRunLogs: false };

  const placeholderAnswer = (req: Mint): Record<string, unknown> => {
    const k = `${req.subject}\u0000${req.leaseId}\u0000${req.key}`;
    let p = issued.get(k);
    if (!p) issued.set(k, (p = `kcph_${b64(16)}_${b64(32)}`));
    return { placeholder: p, grantId: "00", hosts: ["api.anthropic.com"] };
  };

  const startMinter = (): void => {
    mintSub = env.nc.subscribe("paperclip.broker.*.*.mint", {
      callback: (_err, m) => {
        const req = JSON.parse(new TextDecoder().decode(m.data)) as { leaseId: string; key: string; value: string };
        assert.ok(m.reply?.startsWith("_INBOX_paperclip."), `the mint's reply goes to the plugin's inbox, not ${m.reply}`);
        const r: Mint = { subject: m.subject, leaseId: req.leaseId, key: req.key };
        mints.push(r);
        m.respond(JSON.stringify(answer(r)));
      },
    });
  };

  before(async () => {
    env = await startEnv();
    h = await harnessed({ exec: { silenceMs: 500, graceMs: 2_000 }, mintTimeoutMs: 1_000 }, { natsUrl: env.server.url, brokeredKeys: ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"] });
    env.nc.subscribe(">", {
      callback: (_err, m) => {
        tap.push({ subject: m.subject, data: new TextDecoder().decode(m.data) });
      },
    });
    await env.nc.flush();
  });
  after(async () => {
    await h.shutdown();
    await env.close();
  });
  beforeEach(async () => {
    tap = [];
    mints = [];
    answer = placeholderAnswer;
    if (!mintSub) startMinter();
    await env.nc.flush();
  });

  async function acquire(runId: string, harness = h, config: Record<string, unknown> = cfg): Promise<PluginEnvironmentLease> {
    env.sandbox.addLease(C, runId, `pc-${runId.slice(0, 8)}`);
    return harness.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config, runId, agentId: "agent-1", adapterType: "claude_local" });
  }

  function execute(lease: PluginEnvironmentLease, envVars: Record<string, string>, harness = h, config: Record<string, unknown> = { ...cfg, ...lease.metadata }) {
    return harness.harness.execute({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config, lease, command: "env", timeoutMs: 10_000, env: envVars });
  }

  /** Messages holding the real value on any subject but the broker's mint subject. */
  const leaked = (value: string): string[] => tap.filter((m) => m.data.includes(value) && !/^paperclip\.broker\.[^.]+\.[^.]+\.mint$/.test(m.subject)).map((m) => m.subject);

  it("replaces the values in every execute's env, minting once per lease and key", async () => {
    const lease = await acquire(newRun());
    const vars = { ANTHROPIC_API_KEY: ANTHROPIC, OPENAI_API_KEY: OPENAI, HOME: "/workspace" };
    const first = await execute(lease, vars);
    assert.equal(first.exitCode, 0, first.stderr);
    const line = (key: string, out: string): string => out.split("\n").find((l) => l.startsWith(`${key}=`))?.slice(key.length + 1) ?? "";
    const ph = line("ANTHROPIC_API_KEY", first.stdout);
    const ph2 = line("OPENAI_API_KEY", first.stdout);
    assert.ok(isPlaceholder(ph) && isPlaceholder(ph2) && ph !== ph2, "the pod gets placeholders");
    assert.ok(first.stdout.includes("HOME=/workspace\n"), "other keys pass as they are");
    for (let i = 0; i < 3; i++) {
      const again = await execute(lease, vars);
      assert.equal(line("ANTHROPIC_API_KEY", again.stdout), ph, "the same placeholder for the lease's key");
    }
    assert.deepEqual(mints.map((m) => m.key).sort(), ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"], "one mint per lease and key for 4 executes");
    assert.deepEqual(new Set(mints.map((m) => m.leaseId)), new Set([lease.providerLeaseId]));
    // A changed value (the operator rotated the key) is minted again; the broker keeps the grant.
    await execute(lease, { ...vars, ANTHROPIC_API_KEY: `${ANTHROPIC}-rotated` });
    assert.equal(mints.length, 3);
    const starts = tap.filter((m) => /^paperclip\.exec\./.test(m.subject) && m.data.includes('"env"'));
    assert.ok(starts.length >= 5, `exec starts with env tapped: ${starts.length}`);
    assert.deepEqual(leaked(ANTHROPIC), [], "the real value crossed NATS only to the broker");
    assert.deepEqual(leaked(OPENAI), []);
    assert.ok(!JSON.stringify(h.harness.logs).includes(ANTHROPIC), "never logged");
    console.log(`wire: messages=${tap.length} execStartsWithEnv=${starts.length} mints=${mints.length} leaks=${leaked(ANTHROPIC).length + leaked(OPENAI).length}`);
  });

  it("mints once for executes in flight together", async () => {
    const lease = await acquire(newRun());
    const rs = await Promise.all(Array.from({ length: 6 }, () => execute(lease, { ANTHROPIC_API_KEY: ANTHROPIC })));
    assert.ok(rs.every((r) => r.exitCode === 0));
    assert.equal(mints.length, 1);
  });

  it("fails an execute naming the key when no broker answers, and sends nothing", async () => {
    const lease = await acquire(newRun());
    mintSub?.unsubscribe();
    mintSub = undefined;
    await env.nc.flush();
    tap = [];
    await assert.rejects(execute(lease, { ANTHROPIC_API_KEY: ANTHROPIC, HOME: "/workspace" }), (err: Error) => {
      assert.match(err.message, /env\.ANTHROPIC_API_KEY: is brokered .*: (no broker answers|the broker did not answer)/);
      assert.ok(!err.message.includes(ANTHROPIC));
      return true;
    });
    const execs = tap.filter((m) => m.subject.startsWith("paperclip.exec."));
    assert.deepEqual(execs.map((m) => m.subject), [], "no exec request was published");
    assert.deepEqual(leaked(ANTHROPIC), []);
    assert.ok(!JSON.stringify(h.harness.logs).includes(ANTHROPIC), "never logged");
    console.log(`broker down: published=${tap.length} (${[...new Set(tap.map((m) => m.subject.split(".").slice(0, 3).join(".")))].join(",")}) execRequests=${execs.length}`);
  });

  it("fails an execute naming the key and the broker's reason when it refuses, and mints again next time", async () => {
    const lease = await acquire(newRun());
    answer = () => ({ error: { code: "quota_exceeded", message: "company holds 2000 grants, its quota (GrantsPerCompany) is 2000" } });
    await assert.rejects(execute(lease, { OPENAI_API_KEY: OPENAI }), /env\.OPENAI_API_KEY: .*the broker refused \(quota_exceeded: company holds 2000 grants/);
    answer = () => ({ placeholder: "not-a-placeholder" });
    await assert.rejects(execute(lease, { OPENAI_API_KEY: OPENAI }), /env\.OPENAI_API_KEY: .*no well-formed placeholder/);
    answer = placeholderAnswer;
    const r = await execute(lease, { OPENAI_API_KEY: OPENAI });
    assert.equal(r.exitCode, 0);
    assert.equal(mints.length, 3, "a failed mint is not cached");
    assert.deepEqual(leaked(OPENAI), []);
  });

  it("keeps empty values and placeholders as they are, minting nothing", async () => {
    const lease = await acquire(newRun());
    const ph = `kcph_${b64(16)}_${b64(32)}`;
    const r = await execute(lease, { ANTHROPIC_API_KEY: ph, OPENAI_API_KEY: "" });
    assert.ok(r.stdout.includes(`ANTHROPIC_API_KEY=${ph}\n`) && r.stdout.includes("OPENAI_API_KEY=\n"));
    assert.equal(mints.length, 0);
  });

  it("lets no environment config turn brokering off or set it", async () => {
    const lease = await acquire(newRun());
    for (const v of [[], null, ["OTHER"], false]) {
      await assert.rejects(execute(lease, { ANTHROPIC_API_KEY: ANTHROPIC }, h, { ...cfg, ...lease.metadata, brokeredKeys: v }), /config\.brokeredKeys: which keys the credential broker holds is the operator's/);
      await assert.rejects(acquire(newRun(), h, { ...cfg, brokeredKeys: v }), /config\.brokeredKeys: /);
    }
    const v = await h.harness.validateConfig({ driverKey: "kubernetes", config: { ...cfg, brokeredKeys: [] } });
    assert.equal(v.ok, false);
    assert.match(v.errors?.[0] ?? "", /^config\.brokeredKeys: /);
    // A brokered key in an adapter's defaultEnv would reach the run's Secret: refused, unsent.
    const adapters = [{ adapterType: "claude_local", defaultEnv: { ANTHROPIC_API_KEY: ANTHROPIC } }];
    await assert.rejects(acquire(newRun(), h, { ...cfg, adapters }), (err: Error) => {
      assert.match(err.message, /^config\.adapters\[0\]\.defaultEnv\.ANTHROPIC_API_KEY: is brokered/);
      assert.ok(!err.message.includes(ANTHROPIC));
      return true;
    });
    const vr = await h.harness.validateConfig({ driverKey: "kubernetes", config: { ...cfg, adapters } });
    assert.equal(vr.ok, false);
    assert.match(vr.errors?.join("\n") ?? "", /config\.adapters\[0\]\.defaultEnv\.ANTHROPIC_API_KEY: is brokered/);
    assert.equal(mints.length, 0);
    assert.deepEqual(leaked(ANTHROPIC), [], "no refused request carried the value anywhere");
  });

  it("changes nothing without brokered keys in the settings", async () => {
    const off = await harnessed(undefined, { natsUrl: env.server.url });
    try {
      const lease = await acquire(newRun(), off);
      const r = await execute(lease, { ANTHROPIC_API_KEY: ANTHROPIC }, off);
      assert.ok(r.stdout.includes(`ANTHROPIC_API_KEY=${ANTHROPIC}\n`));
      assert.equal(mints.length, 0);
    } finally {
      await off.shutdown();
    }
  });
});
