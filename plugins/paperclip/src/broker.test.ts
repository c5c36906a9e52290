import assert from "node:assert/strict";
import { createDecipheriv, createPrivateKey, createPublicKey, diffieHellman, generateKeyPairSync, hkdfSync, randomBytes, type KeyObject } from "node:crypto";
import { after, before, beforeEach, describe, it } from "node:test";
import type { PluginEnvironmentLease } from "@paperclipai/plugin-sdk";
import { connect, type Subscription } from "@nats-io/transport-node";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";
import { BROKERED_LEASES_PER_COMPANY, Placeholders, isPlaceholder, mintAAD, rawPublicKey, sealValue, x25519PublicKey } from "./broker.js";

// The plugin against a real nats-server (the fake kubeclip and exec replica of the other suites)
// and a tiny mint responder standing in for cmd/credential-broker: it answers
// paperclip.broker.key with its X25519 public key and paperclip.broker.<c>.<r>.mint as
// pkg/broker/mintproto says, opening the sealed value as the broker does (openValue), one
// placeholder per company, lease and key, as the real broker's idempotent Mint does. Every
// message on the server is tapped, so what crossed the wire is inspected, not assumed: the
// real value is on no subject at all, the mint's included.

/** Opens a value sealed by sealValue, as pkg/broker/mintproto.Opener does. */
function openValue(broker: KeyObject, aad: Buffer, s: { ephemeralKey: string; nonce: string; ciphertext: string }): string {
  const eph = Buffer.from(s.ephemeralKey, "base64");
  const shared = diffieHellman({ privateKey: broker, publicKey: x25519PublicKey(eph) });
  const key = Buffer.from(hkdfSync("sha256", shared, Buffer.concat([eph, rawPublicKey(createPublicKey(broker))]), "kubeclip credential broker mint v1", 32));
  const ct = Buffer.from(s.ciphertext, "base64");
  const d = createDecipheriv("aes-256-gcm", key, Buffer.from(s.nonce, "base64"));
  d.setAAD(aad);
  d.setAuthTag(ct.subarray(ct.length - 16));
  return Buffer.concat([d.update(ct.subarray(0, ct.length - 16)), d.final()]).toString("utf8");
}

/** An X25519 private key of a raw 32-byte scalar (PKCS #8 around it). */
const x25519Private = (raw: Buffer): KeyObject =>
  createPrivateKey({ key: Buffer.concat([Buffer.from("302e020100300506032b656e04220420", "hex"), raw]), format: "der", type: "pkcs8" });

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
  /** The value the responder opened, as the broker would. */
  value: string;
}

describe("brokered keys", () => {
  let env: Env;
  let h: Harnessed;
  let tap: { subject: string; data: string }[];
  let mints: Mint[];
  let mintSub: Subscription | undefined;
  let keySub: Subscription | undefined;
  const brokerKey = generateKeyPairSync("x25519");
  let tapSub: Subscription | undefined;
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
    keySub = env.nc.subscribe("paperclip.broker.key", {
      callback: (_err, m) => {
        assert.ok(m.reply?.startsWith("_INBOX_paperclip."), `the key's reply goes to the plugin's inbox, not ${m.reply}`);
        m.respond(JSON.stringify({ publicKey: rawPublicKey(brokerKey.publicKey).toString("base64") }));
      },
    });
    mintSub = env.nc.subscribe("paperclip.broker.*.*.mint", {
      callback: (_err, m) => {
        const req = JSON.parse(new TextDecoder().decode(m.data)) as { leaseId: string; key: string; ephemeralKey: string; nonce: string; ciphertext: string };
        assert.ok(m.reply?.startsWith("_INBOX_paperclip."), `the mint's reply goes to the plugin's inbox, not ${m.reply}`);
        assert.deepEqual(Object.keys(req).sort(), ["ciphertext", "ephemeralKey", "key", "leaseId", "nonce"], "a mint request carries the value sealed, never in clear");
        const [, , companyId, runId] = m.subject.split(".");
        const value = openValue(brokerKey.privateKey, mintAAD(companyId as string, runId as string, req.leaseId, req.key), req);
        const r: Mint = { subject: m.subject, leaseId: req.leaseId, key: req.key, value };
        mints.push(r);
        m.respond(JSON.stringify(answer(r)));
      },
    });
  };
  const stopMinter = (): void => {
    mintSub?.unsubscribe();
    keySub?.unsubscribe();
    mintSub = keySub = undefined;
  };

  before(async () => {
    env = await startEnv();
    h = await harnessed({ exec: { silenceMs: 500, graceMs: 2_000 }, mintTimeoutMs: 1_000 }, { natsUrl: env.server.url, brokeredKeys: ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"] });
    startTap();
    await env.nc.flush();
  });
  const startTap = (): void => {
    tapSub = env.nc.subscribe(">", {
      callback: (_err, m) => {
        tap.push({ subject: m.subject, data: new TextDecoder().decode(m.data) });
      },
    });
  };
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

  /** Messages holding the real value (or its base64) on any subject, the mint's included. */
  const leaked = (value: string): string[] => tap.filter((m) => m.data.includes(value) || m.data.includes(Buffer.from(value).toString("base64"))).map((m) => m.subject);

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
    assert.deepEqual(mints.map((m) => m.value).sort(), [ANTHROPIC, OPENAI].sort(), "the broker's key opens what was sealed");
    // A changed value (the operator rotated the key) is minted again; the broker keeps the grant.
    await execute(lease, { ...vars, ANTHROPIC_API_KEY: `${ANTHROPIC}-rotated` });
    assert.equal(mints.length, 3);
    const starts = tap.filter((m) => /^paperclip\.exec\./.test(m.subject) && m.data.includes('"env"'));
    assert.ok(starts.length >= 5, `exec starts with env tapped: ${starts.length}`);
    assert.ok(tap.some((m) => /^paperclip\.broker\.[^.]+\.[^.]+\.mint$/.test(m.subject)), "the tap sees the mint requests");
    assert.deepEqual(leaked(ANTHROPIC), [], "the real value crossed NATS on no subject, the broker's own included");
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
    stopMinter();
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

  it("bounds a company's cached leases, keeps a lease's latest run, forgets a lease, and says at once when nobody serves the mint subject", async () => {
    const nc = await connect({ servers: env.server.url, inboxPrefix: "_INBOX_paperclip" });
    try {
      const p = new Placeholders(2, 1_000);
      const runs = new Map<string, string>();
      const ref = (lease: string, companyId = C) => {
        let runId = runs.get(lease);
        if (!runId) runs.set(lease, (runId = newRun()));
        return { companyId, runId, providerLeaseId: lease };
      };
      const mint = (lease: string, value = ANTHROPIC, companyId = C) => p.replace(nc, "paperclip", ["ANTHROPIC_API_KEY"], ref(lease, companyId), { ANTHROPIC_API_KEY: value });
      const sent = (): number => p.mints;
      await mint("l1");
      await mint("l2");
      await mint("l1"); // l1 used last: l2 is now the least recently used
      assert.equal(sent(), 2, "a cached lease's key mints once");
      await mint("l3"); // a third lease: l2 is forgotten, l1 kept
      assert.equal(p.leases(C), 2, "at most 2 leases of one company");
      await mint("l1");
      assert.equal(sent(), 3, "the lease used most recently stayed cached");
      await mint("l2");
      assert.equal(sent(), 4, "the least recently used lease was forgotten");
      const other = "0b7e4f2a-1c3d-4e5f-8a9b-0c1d2e3f4a5b";
      await mint("l1", ANTHROPIC, other);
      assert.equal(sent(), 5, "the same lease id of another company is its own");
      assert.equal(p.leases(C), 2, "another company's leases take none of this one's places");
      assert.equal(p.leases(other), 1);
      // A reusable lease's next run mints again, and the earlier run's placeholder goes.
      runs.set("l1", newRun());
      await mint("l1");
      assert.equal(sent(), 6, "a lease's next run mints again");
      assert.equal(p.cached(C, "l1"), 1, "one placeholder per key, whatever runs the lease served");
      p.forget(C, "l1");
      assert.equal(p.leases(C), 1);
      assert.equal(p.cached(C, "l1"), 0, "a forgotten lease keeps nothing");
      await mint("l1");
      assert.equal(sent(), 7, "a forgotten lease mints afresh");
      // Two brokered keys holding one value each get their own placeholder; another key holding
      // that value (an alias) gets the first's, never the value.
      const two = await p.replace(nc, "paperclip", ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"], ref("l4"), { ANTHROPIC_API_KEY: OPENAI, OPENAI_API_KEY: OPENAI, MY_KEY: OPENAI, HOME: "/workspace" });
      assert.ok(isPlaceholder(two.ANTHROPIC_API_KEY ?? "") && isPlaceholder(two.OPENAI_API_KEY ?? "") && two.ANTHROPIC_API_KEY !== two.OPENAI_API_KEY);
      assert.equal(two.MY_KEY, two.ANTHROPIC_API_KEY, "the alias carries a placeholder");
      assert.equal(two.HOME, "/workspace");
      assert.ok(!JSON.stringify(two).includes(OPENAI));
      assert.equal(BROKERED_LEASES_PER_COMPANY, 1_000, "the bound the README states");
      // No subscriber at all (the tap and the responder gone): NATS says no responders at once.
      tapSub?.unsubscribe();
      stopMinter();
      await env.nc.flush();
      const t0 = Date.now();
      await assert.rejects(mint("l9"), (err: Error) => {
        assert.match(err.message, /^env\.ANTHROPIC_API_KEY: .*no broker answers \(it is down or not deployed\)/);
        assert.ok(!err.message.includes(ANTHROPIC));
        return true;
      });
      const ms = Date.now() - t0;
      assert.ok(ms < 1_000, `no responders answered in ${ms} ms, before the 1000 ms timeout`);
      assert.equal(p.cached(C, "l9"), 0, "a failed mint is not cached");
      console.log(`placeholders: mints=${sent()} leasesCached=${p.leases(C)} bound=2 noResponders=${ms}ms`);
    } finally {
      startTap();
      await env.nc.flush();
      await nc.close();
    }
  });

  it("seals as pkg/broker/mintproto opens: the vector Go's TestOpensThePluginsSeal opens", () => {
    // Fixed broker key, ephemeral key and nonce: the bytes are pinned here and opened in Go.
    const broker = x25519Private(Buffer.from("a0".repeat(16) + "5b".repeat(16), "hex"));
    const ephemeral = x25519Private(Buffer.from("11".repeat(8) + "c3".repeat(24), "hex"));
    const aad = mintAAD("company-a", "run-1", "lease-1", "ANTHROPIC_API_KEY");
    const value = "sk-ant-api03-SEALED-VALUE-0123456789";
    const s = sealValue(createPublicKey(broker), aad, value, { ephemeral, nonce: Buffer.from("000102030405060708090a0b", "hex") });
    assert.deepEqual(s, {
      ephemeralKey: "1CkY2ltKyzXbE+34W9WkckNz+92QT4wk6Tk96DKCrmE=",
      nonce: "AAECAwQFBgcICQoL",
      ciphertext: "vMaIK4DAjGQxGCiert0QZjFs3i6/TbKHi5VKFUdrbFScZ6iqR7mELIJEEniT4USuQ11qMQ==",
    });
    assert.equal(openValue(broker, aad, s), value);
    // Sealed for another lease, it does not open.
    assert.throws(() => openValue(broker, mintAAD("company-a", "run-1", "lease-2", "ANTHROPIC_API_KEY"), s));
    // A fresh seal of the same value shares nothing with it.
    const fresh = sealValue(createPublicKey(broker), aad, value);
    assert.notEqual(fresh.ciphertext, s.ciphertext);
    assert.notEqual(fresh.ephemeralKey, s.ephemeralKey);
    assert.ok(!JSON.stringify(fresh).includes(value) && !JSON.stringify(fresh).includes(Buffer.from(value).toString("base64")));
  });
});
