// What of Paperclip's execute env may enter a tenant pod.
//
// Paperclip's host sends its own server's whole environment with some execute calls (the
// `command -v claude` probe carried 118 keys, PAPERCLIP_AGENT_JWT_SECRET and
// PAPERCLIP_TOOL_ACTION_SIGNING_SECRET among them: with the JWT secret a company's image could
// mint agent tokens for every company), and any key an operator gives the server (GITHUB_TOKEN,
// SLACK_*, HF_TOKEN) would ride along to every company's shell. The plugin drops keys before an
// exec request leaves:
//
//   - a built-in list, envpolicy.json, `{"deny": [GLOB…], "allow": [GLOB…]}`. "allow" is what an
//     agent needs: the shell basics (PATH, HOME, locale, TERM), the run variables Paperclip sets
//     (PAPERCLIP_API_URL/_KEY, _RUN_ID, _WAKE_*, the sandbox bridge's), the adapters' homes and the
//     model API keys a company configures. "deny" is the keys Paperclip's server reads for itself
//     (grepped from its dist's process.env reads) and their families; "allow" keys are exceptions
//     to it. pkg/execproto/envpolicy.json is the same file: the exec-worker enforces the same rules
//     again for every client (testdata/envpolicy/cases.json holds the cases both run);
//   - the operator's settings.executeEnv: mode "allowlist" (the default), in which only keys of
//     the built-in "allow" list and of the operator's `allow` globs pass; or mode "deny", in which
//     every key passes but the built-in deny list's; and more `deny` globs, which win over
//     everything. A key of the built-in deny list never passes, whatever the operator allows.
//
// A glob matches a whole key; `*` (any run of characters) is its only special character; case
// counts. Values are never logged; the names of dropped keys may be.

import { ConfigError } from "./errors.js";
import { isObject } from "./json.js";
import builtinJson from "./envpolicy.json" with { type: "json" };

export type EnvPolicyMode = "deny" | "allowlist";

/** settings.executeEnv. */
export interface EnvPolicySettings {
  mode: EnvPolicyMode;
  allow: string[];
  deny: string[];
}

const GLOB_RE = /^[A-Za-z0-9_*.-]{1,256}$/;

function checkList(v: unknown, where: string): { deny: string[]; allow: string[] } {
  if (!isObject(v)) throw new Error(`${where}: must be {"deny": [...], "allow": [...]}`);
  return { deny: globs(v.deny, `${where}.deny`), allow: globs(v.allow, `${where}.allow`) };
}

function globs(v: unknown, field: string): string[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw new ConfigError(field, "must be a list of globs");
  if (v.length > 1_000) throw new ConfigError(field, "must hold at most 1000 globs");
  return v.map((g: unknown, i) => {
    if (typeof g !== "string" || !GLOB_RE.test(g)) {
      throw new ConfigError(`${field}[${i}]`, "must be an env key glob: letters, digits, '_', '.', '-' and '*' (any run of characters), 1-256 characters");
    }
    return g;
  });
}

/** The built-in list, checked when the module loads. */
export const BUILTIN: { deny: readonly string[]; allow: readonly string[] } = checkList(builtinJson, "envpolicy.json");

/** The policy without settings.executeEnv: what an agent needs, nothing of the operator's. */
export const DEFAULT_ENV_POLICY: Readonly<EnvPolicySettings> = Object.freeze({ mode: "allowlist", allow: [], deny: [] });

/** settings.executeEnv, type-checked; errors name the field. */
export function readEnvPolicy(v: unknown, field: string): EnvPolicySettings {
  if (!isObject(v)) throw new ConfigError(field, "must be an object {mode, allow, deny}");
  for (const key of Object.keys(v)) {
    if (key !== "mode" && key !== "allow" && key !== "deny") throw new ConfigError(`${field}.${key}`, "unknown key (mode, allow, deny)");
  }
  const mode = v.mode ?? DEFAULT_ENV_POLICY.mode;
  if (mode !== "deny" && mode !== "allowlist") throw new ConfigError(`${field}.mode`, 'must be "allowlist" or "deny"');
  return { mode, allow: globs(v.allow, `${field}.allow`), deny: globs(v.deny, `${field}.deny`) };
}

/** Whether glob matches the whole of key (`*`: any run of characters). */
export function globMatch(glob: string, key: string): boolean {
  const parts = glob.split("*");
  const first = parts[0] ?? "";
  if (parts.length === 1) return key === glob;
  if (!key.startsWith(first)) return false;
  const last = parts[parts.length - 1] ?? "";
  if (key.length < first.length + last.length || !key.endsWith(last)) return false;
  let at = first.length;
  const end = key.length - last.length;
  for (const mid of parts.slice(1, -1)) {
    if (mid === "") continue;
    const i = key.indexOf(mid, at);
    if (i < 0 || i + mid.length > end) return false;
    at = i + mid.length;
  }
  return true;
}

const any = (list: readonly string[], key: string): boolean => list.some((g) => globMatch(g, key));

export interface Filtered {
  env: Record<string, string>;
  /** The names of the keys dropped, sorted (never their values). */
  dropped: string[];
}

/** The execute-env policy: the built-in list and the operator's settings. */
export class EnvPolicy {
  private readonly settings: EnvPolicySettings;

  constructor(settings: EnvPolicySettings = DEFAULT_ENV_POLICY) {
    this.settings = settings;
  }

  /** Whether key may enter a pod (the rules of pkg/execproto EnvPolicy.Drops, in the same order). */
  passes(key: string): boolean {
    if (any(this.settings.deny, key)) return false;
    if (any(BUILTIN.deny, key) && !any(BUILTIN.allow, key)) return false;
    if (this.settings.mode === "allowlist") return any(BUILTIN.allow, key) || any(this.settings.allow, key);
    return true;
  }

  /** env without the keys the policy drops. */
  filter(env: Record<string, string>): Filtered {
    const out: Record<string, string> = {};
    const dropped: string[] = [];
    for (const [k, v] of Object.entries(env)) {
      if (this.passes(k)) out[k] = v;
      else dropped.push(k);
    }
    dropped.sort();
    return { env: out, dropped };
  }
}
