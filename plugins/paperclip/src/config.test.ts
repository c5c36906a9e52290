import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  checkProviderConfig,
  isUnresolvedSecretRef,
  normalizedConfig,
  providerConfigSchema,
  settingsSchema,
  readEnvironmentKeys,
  readSettings,
  resolveConnection,
  splitConfig,
} from "./config.js";
import { ConfigError } from "./errors.js";

const CREDS = `-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJzZWNyZXQiOiJqd3QifQ.c2lnbmF0dXJlc2lnbmF0dXJl
------END NATS USER JWT------

-----BEGIN USER NKEY SEED-----
SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4
------END USER NKEY SEED------
`;

describe("splitConfig", () => {
  it("sorts keys by owner and warns for the cluster credentials", () => {
    const s = splitConfig({
      backend: "pod",
      egressAllowFqdns: ["github.com"],
      natsUrl: "nats://k:4222",
      timeoutMs: 5000,
      provider: "kubernetes",
      reuseLease: false,
      streamRunLogs: false,
      inCluster: true,
      kubeconfig: "apiVersion: v1",
    });
    assert.deepEqual(s.provider, { backend: "pod", egressAllowFqdns: ["github.com"] });
    assert.deepEqual(s.plugin, { natsUrl: "nats://k:4222", timeoutMs: 5000 });
    assert.deepEqual(s.host, { provider: "kubernetes", reuseLease: false, streamRunLogs: false });
    assert.equal(s.warnings.length, 2);
    assert.match(s.warnings[0] ?? "", /^config\.inCluster is ignored/);
    assert.ok(!s.warnings.join("").includes("apiVersion"), "never echoes a kubeconfig");
  });

  it("drops run-time keys Paperclip merges in from lease metadata", () => {
    const s = splitConfig({ agentId: "a", home: "/h", workspaceRealization: {}, remoteCwd: "/workspace", kubeclip: {}, backend: "pod" });
    assert.deepEqual(s.provider, { backend: "pod" });
  });

  it("normalizedConfig keeps kubeclip's normalization plus the plugin's and Paperclip's keys", () => {
    const s = splitConfig({ backend: "pod", timeoutMs: 5000, streamRunLogs: false, inCluster: true });
    assert.deepEqual(normalizedConfig({ backend: "pod", egressMode: "standard" }, s), {
      backend: "pod",
      egressMode: "standard",
      timeoutMs: 5000,
      streamRunLogs: false,
    });
  });
});

describe("checkProviderConfig", () => {
  it("refuses the job backend and case-variant keys, naming the field", () => {
    assert.deepEqual(checkProviderConfig({ backend: "pod" }), []);
    assert.deepEqual(checkProviderConfig({ backend: "sandbox-cr" }), []);
    const [job] = checkProviderConfig({ backend: "job" });
    assert.match(job ?? "", /^config\.backend: "job" .* use "pod"/);
    const [dup] = checkProviderConfig({ backend: "pod", Backend: "pod" });
    assert.match(dup ?? "", /^config\.Backend \(and config\.backend\): keys differ only in case/);
    const [nested] = checkProviderConfig({ defaultResources: { limits: { cpu: "1", CPU: "2" } } });
    assert.match(nested ?? "", /^config\.defaultResources\.limits\.CPU/);
  });
});

describe("readEnvironmentKeys", () => {
  it("takes only timeoutMs and refuses every connection key, naming it", () => {
    assert.deepEqual(readEnvironmentKeys({ timeoutMs: 5000 }), { timeoutMs: 5000 });
    assert.deepEqual(readEnvironmentKeys({ natsUrl: "", natsToken: null }), {});
    assert.throws(() => readEnvironmentKeys({ natsUrl: "nats://evil:4222" }), /^ConfigError: config\.natsUrl: connection settings are the operator's/);
    assert.throws(() => readEnvironmentKeys({ inboxPrefix: "_INBOX" }), /^ConfigError: config\.inboxPrefix: /);
    assert.throws(() => readEnvironmentKeys({ timeoutMs: -1 }), /config\.timeoutMs: must be a positive integer/);
    assert.throws(() => readEnvironmentKeys({ timeoutMs: 1.5 }), ConfigError);
  });
});

describe("readSettings", () => {
  it("names the bad field", () => {
    assert.throws(() => readSettings({ natsUrl: 4222 }), { message: "settings.natsUrl: must be a string" });
    assert.throws(() => readSettings({ subjectPrefix: "a.b" }), /^ConfigError: settings\.subjectPrefix: must be/);
    assert.throws(() => readSettings({ inboxPrefix: "_INBOX.>" }), /^ConfigError: settings\.inboxPrefix: must be/);
    assert.throws(() => readSettings({ inboxPrefix: "$JS.API" }), /^ConfigError: settings\.inboxPrefix/);
    assert.throws(() => readSettings({ maxExecuteOutputBytes: 1 << 30 }), /^ConfigError: settings\.maxExecuteOutputBytes: must be an integer from 65536 to 33554432/);
    assert.throws(() => readSettings({ maxConcurrentExecutesPerCompany: 0 }), /settings\.maxConcurrentExecutesPerCompany/);
    assert.throws(() => readSettings({ maxSyncOutBytes: 0 }), /^ConfigError: settings\.maxSyncOutBytes: must be an integer from 1 to 68719476736/);
    assert.throws(() => readSettings({ maxSyncOutFiles: "many" }), /^ConfigError: settings\.maxSyncOutFiles: must be an integer/);
    assert.deepEqual(readSettings({ maxSyncOutBytes: 1 << 20, maxSyncOutFiles: 10, nativeSync: false }), { maxSyncOutBytes: 1 << 20, maxSyncOutFiles: 10, nativeSync: false });
    assert.throws(() => readSettings({ nativeSync: "no" }), /^ConfigError: settings\.nativeSync: must be true or false/);
    assert.throws(() => readSettings({ executeEnv: { mode: "open" } }), /settings\.executeEnv\.mode: must be "allowlist" or "deny"/);
    // Allowlist mode needs no glob of the operator's: the built-in list is what an agent needs.
    assert.deepEqual(readSettings({ executeEnv: { mode: "allowlist" } }), { executeEnv: { mode: "allowlist", allow: [], deny: [] } });
    assert.deepEqual(readSettings({ executeEnv: { allow: ["GH_TOKEN"] } }), { executeEnv: { mode: "allowlist", allow: ["GH_TOKEN"], deny: [] } });
    assert.throws(() => readSettings({ executeEnv: { deny: ["A B"] } }), /settings\.executeEnv\.deny\[0\]/);
    assert.deepEqual(readSettings({ brokeredKeys: ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"] }), { brokeredKeys: ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"] });
    assert.deepEqual(readSettings({ brokeredKeys: [] }), {});
    assert.throws(() => readSettings({ brokeredKeys: "ANTHROPIC_API_KEY" }), /^ConfigError: settings\.brokeredKeys: must be a list/);
    assert.throws(() => readSettings({ brokeredKeys: ["OK", "A=B"] }), /^ConfigError: settings\.brokeredKeys\[1\]: must be an environment key name/);
    assert.throws(() => readSettings({ brokeredKeys: ["K", "K"] }), /^ConfigError: settings\.brokeredKeys\[1\]: K is named twice/);
  });

  it("treats empty strings as unset", () => {
    assert.deepEqual(readSettings({ natsUrl: "", natsToken: "  " }), {});
  });
});

describe("resolveConnection", () => {
  it("takes the connection from the settings, the budget from the environment first", () => {
    const c = resolveConnection({ natsUrl: "nats://a:4222,nats://b:4222", natsToken: "tok-secret", subjectPrefix: "acme", timeoutMs: 7000 });
    assert.deepEqual(c.servers, ["nats://a:4222", "nats://b:4222"]);
    assert.equal(c.prefix, "acme");
    assert.equal(c.inboxPrefix, "_INBOX_paperclip");
    assert.equal(c.timeoutMs, 7000);
    assert.equal(resolveConnection({ natsUrl: "nats://a:4222", timeoutMs: 7000 }, { timeoutMs: 900 }).timeoutMs, 900);
    assert.deepEqual(c.auth, { kind: "token", token: "tok-secret" });
    assert.deepEqual(c.secrets, ["tok-secret"]);
  });

  it("defaults the prefixes and needs a URL", () => {
    assert.equal(resolveConnection({ natsUrl: "nats://a:4222" }).prefix, "paperclip");
    assert.equal(resolveConnection({ natsUrl: "nats://a:4222", inboxPrefix: "_INBOX_x" }).inboxPrefix, "_INBOX_x");
    assert.throws(() => resolveConnection({}), /^ConfigError: settings\.natsUrl: not set/);
    assert.throws(() => resolveConnection({ natsUrl: "http://a" }), /settings\.natsUrl: must be nats:\/\//);
  });

  it("reads .creds, user/password and URL credentials, and never displays them", () => {
    const creds = resolveConnection({ natsUrl: "tls://k:4222", natsCredentials: CREDS });
    assert.equal(creds.auth.kind, "creds");
    assert.ok(creds.secrets.some((s) => s.startsWith("SUAIB")), "the seed is a secret to scrub");
    assert.throws(() => resolveConnection({ natsUrl: "nats://k:4222", natsCredentials: "not creds" }), /settings\.natsCredentials: must be the contents/);
    const up = resolveConnection({ natsUrl: "nats://k:4222", natsUser: "u", natsPassword: "pw-123456" });
    assert.deepEqual(up.auth, { kind: "userpass", user: "u", pass: "pw-123456" });
    assert.throws(() => resolveConnection({ natsUrl: "nats://k:4222", natsUser: "u" }), /settings\.natsPassword: natsUser and natsPassword go together/);
    assert.throws(() => resolveConnection({ natsUrl: "nats://k:4222", natsToken: "t", natsUser: "u", natsPassword: "p" }), /give one of/);
    const inUrl = resolveConnection({ natsUrl: "nats://bob:hunter22@k:4222" });
    assert.equal(inUrl.display, "nats://k:4222");
    assert.ok(inUrl.secrets.includes("bob:hunter22"));
  });

  it("keys connections by servers, auth and inbox prefix", () => {
    const a = resolveConnection({ natsUrl: "nats://k:4222", natsToken: "x1234" });
    const b = resolveConnection({ natsUrl: "nats://k:4222", natsToken: "x1234", subjectPrefix: "other" });
    const c = resolveConnection({ natsUrl: "nats://k:4222", natsToken: "y1234" });
    const d = resolveConnection({ natsUrl: "nats://k:4222", natsToken: "x1234", inboxPrefix: "_INBOX_other" });
    assert.equal(a.key, b.key);
    assert.notEqual(a.key, c.key);
    assert.notEqual(a.key, d.key);
  });
});

describe("schema", () => {
  it("accepts every key of the TypeScript provider's zod schema", () => {
    const upstream = [
      "inCluster", "kubeconfig", "namespacePrefix", "companySlug", "imageRegistry", "imageAllowList",
      "imagePullSecrets", "egressAllowFqdns", "egressAllowCidrs", "egressMode", "defaultResources",
      "runtimeClassName", "serviceAccountAnnotations", "jobTtlSecondsAfterFinished",
      "podActivityDeadlineSec", "adapterType", "adapters", "backend", "reuseLease",
    ];
    for (const k of upstream) assert.ok(k in providerConfigSchema.properties, k);
    assert.ok(!("natsUrl" in providerConfigSchema.properties), "the connection is not an environment key");
    assert.equal(settingsSchema.properties.natsCredentials.format, "secret-ref");
    assert.ok(!("anyOf" in providerConfigSchema), "no inCluster/kubeconfig requirement");
  });

  it("recognizes unresolved secret ids", () => {
    assert.ok(isUnresolvedSecretRef("0e8b6f4a-5a7c-4c1e-9f0b-2a9d7c3e1b44"));
    assert.ok(!isUnresolvedSecretRef("s3cr3t"));
  });
});
