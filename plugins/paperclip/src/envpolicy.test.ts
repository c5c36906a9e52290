// The execute-env policy against the cases pkg/execproto runs too (testdata/envpolicy/cases.json):
// the plugin and the exec-worker enforce one policy, so they must agree on every key.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { DEFAULT_ENV_POLICY, EnvPolicy, readEnvPolicy, type EnvPolicyMode } from "./envpolicy.js";
import { isObject } from "./json.js";
import { repoRoot } from "../test/support/nats-server.js";

interface Case {
  name: string;
  mode: EnvPolicyMode;
  allow: string[];
  deny: string[];
  env: string[];
  kept: string[];
}

function readCases(): Case[] {
  const doc: unknown = JSON.parse(readFileSync(join(repoRoot(), "testdata", "envpolicy", "cases.json"), "utf8"));
  if (!isObject(doc) || !Array.isArray(doc.cases) || doc.cases.length === 0) throw new Error("cases.json: no cases");
  return doc.cases.map((c: unknown, i) => {
    if (!isObject(c) || typeof c.name !== "string" || !Array.isArray(c.env) || !Array.isArray(c.kept)) throw new Error(`cases.json: cases[${i}] malformed`);
    // The settings parser reads the policy, as it reads the operator's.
    const p = readEnvPolicy({ mode: c.mode, allow: c.allow, deny: c.deny }, `cases[${i}]`);
    return { name: c.name, mode: p.mode, allow: p.allow, deny: p.deny, env: c.env as string[], kept: c.kept as string[] };
  });
}

describe("the execute-env policy's shared cases", () => {
  const cases = readCases();
  it("cover both modes", () => {
    assert.deepEqual([...new Set(cases.map((c) => c.mode))].sort(), ["allowlist", "deny"]);
  });
  for (const c of cases) {
    it(c.name, () => {
      const env = Object.fromEntries(c.env.map((k) => [k, `value of ${k}`]));
      const { env: kept, dropped } = new EnvPolicy({ mode: c.mode, allow: c.allow, deny: c.deny }).filter(env);
      assert.deepEqual(Object.keys(kept).sort(), c.kept);
      for (const [k, v] of Object.entries(kept)) assert.equal(v, env[k]);
      assert.deepEqual(dropped, c.env.filter((k) => !c.kept.includes(k)).sort());
    });
  }
});

describe("the default policy", () => {
  it("is the allowlist: what an agent needs passes, an operator's server keys do not", () => {
    assert.equal(DEFAULT_ENV_POLICY.mode, "allowlist");
    assert.deepEqual(readEnvPolicy({}, "settings.executeEnv"), { mode: "allowlist", allow: [], deny: [] });
    const p = new EnvPolicy();
    for (const k of ["PATH", "HOME", "LANG", "PAPERCLIP_API_KEY", "PAPERCLIP_RUN_ID", "ANTHROPIC_API_KEY"]) assert.ok(p.passes(k), k);
    for (const k of ["DO_NOT_TRACK", "GITHUB_TOKEN", "SLACK_BOT_TOKEN", "HF_TOKEN", "PAPERCLIP_AGENT_JWT_SECRET"]) assert.ok(!p.passes(k), k);
  });
});
