// The environment config of a `kubernetes` sandbox environment, and the plugin's own settings.
//
// An environment config mixes three kinds of keys:
//   - the Kubernetes provider config (the TypeScript provider's zod schema plus kubeclip's
//     additions): sent to kubeclip, whose pkg/policy validates it and is the one source of truth;
//   - the plugin's key `timeoutMs` (the RPC budget); never sent to kubeclip. How to reach
//     kubeclip (NATS URL, credentials, subject and inbox prefixes: the connection keys) is the
//     operator's and comes only from the plugin's instance settings: a company controls its
//     environment config, so an environment that sets a connection key is refused, naming the
//     key (otherwise a company could make the plugin present kubeclip's NATS credentials to a
//     server of its choice);
//   - Paperclip's own keys (`provider`, `reuseLease`, `streamRunLogs`, …, and at run time what the
//     host merges in from lease metadata): never sent to kubeclip, kept as they are.
// `inCluster` and `kubeconfig` are accepted for compatibility with the bootstrap config
// (PAPERCLIP_EXECUTION_MODE=kubernetes) and dropped with a warning: kubeclip's workers hold the
// cluster credentials.

import { ConfigError, redactUrl } from "./errors.js";
import { readEnvPolicy, type EnvPolicySettings } from "./envpolicy.js";
import { findCaseVariantKey, isObject, type JsonObject } from "./json.js";

/** The backends that can serve Paperclip's execute calls (a pod that stays up for the lease). */
export const EXEC_BACKENDS = ["pod", "sandbox-cr"] as const;

/**
 * The connection keys: only in the plugin's instance settings (the operator's), never in an
 * environment config (the company's). Anything that pairs with the credentials is here: where
 * they go (URL, TLS through tls:// URLs), what they are, and the subjects they act on.
 */
export const CONNECTION_KEYS = [
  "natsUrl",
  "natsCredentials",
  "natsToken",
  "natsUser",
  "natsPassword",
  "subjectPrefix",
  "inboxPrefix",
] as const;

/**
 * The broker keys: which keys the credential broker holds (issue 27). Only in the plugin's
 * instance settings: a company could otherwise turn brokering off for itself and send its pods
 * the real values. The broker's subject follows subjectPrefix, a connection key.
 */
export const BROKER_KEYS = ["brokeredKeys"] as const;

/** Keys of the plugin in an environment config: the connection and broker keys (refused) and the RPC budget. */
export const PLUGIN_KEYS = [...CONNECTION_KEYS, ...BROKER_KEYS, "timeoutMs"] as const;

/** Plugin keys holding secrets (`format: "secret-ref"`). */
export const SECRET_KEYS = ["natsCredentials", "natsToken", "natsPassword"] as const;

/**
 * Keys Paperclip owns. The first group is stored in the environment config; the second appears at
 * run time because the host rebuilds `config` from lease metadata (see
 * paperclip-plugin-contract.md §3.2).
 */
export const HOST_KEYS = [
  "provider",
  "reuseLease",
  "streamRunLogs",
  "runnerLifecycleMode",
  "runnerIdleTimeoutMs",
  "bridgeRequestTimeoutMs",
  // run-time only:
  "agentId",
  "home",
  "workspaceRealization",
  "remoteCwd",
  "kubeclip",
] as const;

/** Upstream keys kubeclip does not take: the cluster credentials stay with kubeclip's workers. */
export const IGNORED_KEYS = ["inCluster", "kubeconfig"] as const;

const pluginKeys = new Set<string>(PLUGIN_KEYS);
const hostKeys = new Set<string>(HOST_KEYS);
const ignoredKeys = new Set<string>(IGNORED_KEYS);

export interface SplitConfig {
  /** What goes to kubeclip: everything that is neither the plugin's nor Paperclip's. */
  provider: JsonObject;
  /** The plugin's keys as given. */
  plugin: JsonObject;
  /** Paperclip's keys as given. */
  host: JsonObject;
  warnings: string[];
}

/** Splits an environment config by owner (see the file comment). */
export function splitConfig(config: JsonObject): SplitConfig {
  const out: SplitConfig = { provider: {}, plugin: {}, host: {}, warnings: [] };
  for (const [key, value] of Object.entries(config)) {
    if (pluginKeys.has(key)) out.plugin[key] = value;
    else if (hostKeys.has(key)) out.host[key] = value;
    else if (ignoredKeys.has(key)) {
      out.warnings.push(
        `config.${key} is ignored: kubeclip's workers hold the cluster credentials, so a Paperclip environment needs none`,
      );
    } else out.provider[key] = value;
  }
  return out;
}

/**
 * Checks what kubeclip cannot tell Paperclip itself: case-variant keys (kubeclip refuses the whole
 * payload) and a backend that cannot run commands. Returns the errors as `config.x: message`.
 */
export function checkProviderConfig(provider: JsonObject): string[] {
  const errors: string[] = [];
  const dup = findCaseVariantKey(provider, "config");
  if (dup) errors.push(`${dup}: keys differ only in case; kubeclip refuses such configs`);
  const backend = provider.backend;
  if (backend === "job") {
    errors.push(
      'config.backend: "job" runs the agent as a Job and cannot serve Paperclip\'s execute calls (a run is ~90 commands in a pod that stays up); use "pod" (any cluster) or "sandbox-cr" (clusters with agent-sandbox)',
    );
  }
  return errors;
}

/** How to reach kubeclip: the plugin's settings (the RPC budget: the environment's over the settings'). */
export interface Connection {
  /** NATS server URLs. */
  servers: string[];
  /** The URLs for messages, credentials removed. */
  display: string;
  auth: Auth;
  prefix: string;
  /** Where replies to the plugin go: nats-auth.conf lets the paperclip user subscribe only there. */
  inboxPrefix: string;
  /** The environment's RPC budget, when set (Paperclip adds 30 s to it for its own timeout). */
  timeoutMs: number | undefined;
  /** Identifies the connection config: one NATS connection per distinct key. */
  key: string;
  /** Secret values, to scrub from any error text. */
  secrets: string[];
}

export type Auth =
  | { kind: "none" }
  | { kind: "creds"; creds: string }
  | { kind: "token"; token: string }
  | { kind: "userpass"; user: string; pass: string };

export const DEFAULT_PREFIX = "paperclip";
/**
 * Per-execute hold: Paperclip's largest own output is a workspace download slice (3 MiB of tar as
 * base64, 4.2 MB per call), so 8 MiB holds every command whole except a runaway agent's.
 */
export const DEFAULT_EXECUTE_OUTPUT_BYTES = 8 << 20;
export const MIN_EXECUTE_OUTPUT_BYTES = 64 << 10;
/** Far below V8's string limit (2^29 characters) even when each byte becomes a 6-character JSON escape. */
export const MAX_EXECUTE_OUTPUT_BYTES = 32 << 20;
/** A run has ~6 executes in flight (agent, bridge poll, log tail, 4 parallel uploads). */
export const DEFAULT_CONCURRENT_EXECUTES = 32;
/**
 * Native sync out writes a tenant's archive onto Paperclip's host, so the operator bounds one
 * mapping: regular-file bytes (1 GiB, sandboxd untar's own default, a large workspace) and
 * entries (files, directories and links: 100,000, sandboxd untar's too).
 */
export const DEFAULT_SYNC_OUT_BYTES = 1 << 30;
export const MAX_SYNC_OUT_BYTES = 64 * 2 ** 30;
export const DEFAULT_SYNC_OUT_FILES = 100_000;
export const MAX_SYNC_OUT_FILES = 10_000_000;
/** The paperclip NATS user's inbox (pkg/inbox.PaperclipPrefix; deploy/kustomize/base/nats-auth.conf). */
export const DEFAULT_INBOX_PREFIX = "_INBOX_paperclip";
const PREFIX_RE = /^[A-Za-z0-9_-]{1,32}$/;
const INBOX_PREFIX_RE = /^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}$/;
const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
/** timeoutMs at most one day: it bounds waits the plugin makes, not the agent's runtime. */
const MAX_TIMEOUT_MS = 86_400_000;

/** A value that is a secret id Paperclip has not resolved (validation time, or a bare legacy id). */
export function isUnresolvedSecretRef(v: unknown): boolean {
  return typeof v === "string" && UUID_RE.test(v.trim());
}

/**
 * The plugin keys of an environment config: only `timeoutMs`. A connection key there is refused
 * (even one equal to the settings': the rule is who may set it, not what it says).
 */
export function readEnvironmentKeys(obj: JsonObject): EnvironmentKeys {
  for (const key of CONNECTION_KEYS) {
    const v = obj[key];
    if (v === undefined || v === null || v === "") continue;
    throw new ConfigError(
      `config.${key}`,
      "connection settings are the operator's: kubeclip's NATS URL, credentials, TLS and subject/inbox prefixes come only from the plugin's instance settings; remove this key from the environment",
    );
  }
  for (const key of BROKER_KEYS) {
    if (obj[key] === undefined) continue;
    // Refused whatever it says, null and [] included: the rule is who may set it.
    throw new ConfigError(
      `config.${key}`,
      "which keys the credential broker holds is the operator's, set only in the plugin's instance settings; remove this key from the environment",
    );
  }
  const out: EnvironmentKeys = {};
  const t = readTimeout(obj, "config");
  if (t !== undefined) out.timeoutMs = t;
  return out;
}

export interface EnvironmentKeys {
  timeoutMs?: number;
}

function readTimeout(obj: JsonObject, source: string): number | undefined {
  const t = obj.timeoutMs;
  if (t === undefined || t === null) return undefined;
  if (typeof t !== "number" || !Number.isSafeInteger(t) || t <= 0 || t > MAX_TIMEOUT_MS) {
    throw new ConfigError(`${source}.timeoutMs`, `must be a positive integer of milliseconds, at most ${MAX_TIMEOUT_MS}`);
  }
  return t;
}

/** The plugin's instance settings, type-checked; errors name `settings.<key>`. */
export function readSettings(obj: JsonObject): PluginKeys {
  const out: PluginKeys = {};
  const str = (key: string): string | undefined => {
    const v = obj[key];
    if (v === undefined || v === null || v === "") return undefined;
    if (typeof v !== "string") throw new ConfigError(`settings.${key}`, "must be a string");
    return v.trim() === "" ? undefined : v;
  };
  const url = str("natsUrl");
  if (url !== undefined) out.natsUrl = url;
  for (const key of ["natsCredentials", "natsToken", "natsUser", "natsPassword"] as const) {
    const v = str(key);
    if (v !== undefined) out[key] = v;
  }
  const prefix = str("subjectPrefix");
  if (prefix !== undefined) {
    if (!PREFIX_RE.test(prefix)) {
      throw new ConfigError("settings.subjectPrefix", "must be 1-32 letters, digits, '-' or '_'");
    }
    out.subjectPrefix = prefix;
  }
  const inbox = str("inboxPrefix");
  if (inbox !== undefined) {
    if (!INBOX_PREFIX_RE.test(inbox) || inbox.startsWith("$")) {
      throw new ConfigError("settings.inboxPrefix", "must be subject tokens of letters, digits, '-' or '_' separated by '.', no wildcard (e.g. _INBOX_paperclip)");
    }
    out.inboxPrefix = inbox;
  }
  const t = readTimeout(obj, "settings");
  if (t !== undefined) out.timeoutMs = t;
  const int = (key: string, min: number, max: number): number | undefined => {
    const v = obj[key];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
      throw new ConfigError(`settings.${key}`, `must be an integer from ${min} to ${max}`);
    }
    return v;
  };
  const hold = int("maxExecuteOutputBytes", MIN_EXECUTE_OUTPUT_BYTES, MAX_EXECUTE_OUTPUT_BYTES);
  if (hold !== undefined) out.maxExecuteOutputBytes = hold;
  const conc = int("maxConcurrentExecutesPerCompany", 1, 100_000);
  if (conc !== undefined) out.maxConcurrentExecutesPerCompany = conc;
  if (obj.nativeSync !== undefined && obj.nativeSync !== null) {
    if (typeof obj.nativeSync !== "boolean") throw new ConfigError("settings.nativeSync", "must be true or false");
    out.nativeSync = obj.nativeSync;
  }
  const syncBytes = int("maxSyncOutBytes", 1, MAX_SYNC_OUT_BYTES);
  if (syncBytes !== undefined) out.maxSyncOutBytes = syncBytes;
  const syncFiles = int("maxSyncOutFiles", 1, MAX_SYNC_OUT_FILES);
  if (syncFiles !== undefined) out.maxSyncOutFiles = syncFiles;
  if (obj.executeEnv !== undefined && obj.executeEnv !== null) out.executeEnv = readEnvPolicy(obj.executeEnv, "settings.executeEnv");
  const brokered = readBrokeredKeys(obj.brokeredKeys);
  if (brokered.length > 0) out.brokeredKeys = brokered;
  return out;
}

const ENV_KEY_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** The most brokered keys: the adapters' model keys are a handful. */
export const MAX_BROKERED_KEYS = 64;

/** settings.brokeredKeys: environment key names, none twice; absent or [] is off. */
function readBrokeredKeys(v: unknown): string[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw new ConfigError("settings.brokeredKeys", "must be a list of environment key names");
  if (v.length > MAX_BROKERED_KEYS) throw new ConfigError("settings.brokeredKeys", `must name at most ${MAX_BROKERED_KEYS} keys`);
  const out: string[] = [];
  for (const [i, k] of v.entries()) {
    if (typeof k !== "string" || !ENV_KEY_RE.test(k) || k.length > 128) {
      throw new ConfigError(`settings.brokeredKeys[${i}]`, "must be an environment key name (letters, digits and '_', not starting with a digit)");
    }
    if (out.includes(k)) throw new ConfigError(`settings.brokeredKeys[${i}]`, `${k} is named twice`);
    out.push(k);
  }
  return out;
}

export interface PluginKeys {
  natsUrl?: string;
  natsCredentials?: string;
  natsToken?: string;
  natsUser?: string;
  natsPassword?: string;
  subjectPrefix?: string;
  inboxPrefix?: string;
  timeoutMs?: number;
  executeEnv?: EnvPolicySettings;
  /** The keys the credential broker holds (broker.ts); absent: off. */
  brokeredKeys?: string[];
  maxExecuteOutputBytes?: number;
  maxConcurrentExecutesPerCompany?: number;
  nativeSync?: boolean;
  maxSyncOutBytes?: number;
  maxSyncOutFiles?: number;
}

/**
 * Resolves the connection from the plugin's settings alone (secret values already resolved: the
 * plugin resolves its settings' refs); the environment contributes only its RPC budget.
 */
export function resolveConnection(settings: PluginKeys, env: EnvironmentKeys = {}): Connection {
  const pick = <K extends keyof PluginKeys>(k: K): PluginKeys[K] => settings[k];
  const field = (k: keyof PluginKeys): string => `settings.${k}`;
  const url = pick("natsUrl");
  if (url === undefined) {
    throw new ConfigError("settings.natsUrl", "not set: the operator gives kubeclip's NATS URL in the plugin's instance settings");
  }
  const servers = url.split(",").map((s) => s.trim()).filter((s) => s !== "");
  for (const s of servers) {
    if (!/^(nats|tls):\/\/[^\s/]+(:\d+)?\/?$/i.test(s)) {
      throw new ConfigError(field("natsUrl"), "must be nats://host:port or tls://host:port (comma-separated for a cluster)");
    }
  }
  if (servers.length === 0) throw new ConfigError(field("natsUrl"), "names no server");

  const secrets: string[] = [];
  let auth: Auth = { kind: "none" };
  const creds = pick("natsCredentials");
  const token = pick("natsToken");
  const user = pick("natsUser");
  const pass = pick("natsPassword");
  const set = [creds !== undefined, token !== undefined, user !== undefined || pass !== undefined].filter(Boolean).length;
  if (set > 1) {
    throw new ConfigError(field(creds !== undefined ? "natsCredentials" : "natsToken"), "give one of natsCredentials, natsToken or natsUser/natsPassword");
  }
  if (creds !== undefined) {
    if (!creds.includes("-----BEGIN NATS USER JWT-----") || !creds.includes("-----BEGIN USER NKEY SEED-----")) {
      throw new ConfigError(field("natsCredentials"), "must be the contents of a NATS .creds file (user JWT and nkey seed)");
    }
    auth = { kind: "creds", creds };
    secrets.push(...credsSecrets(creds));
  } else if (token !== undefined) {
    auth = { kind: "token", token };
    secrets.push(token);
  } else if (user !== undefined || pass !== undefined) {
    if (user === undefined || pass === undefined) {
      const [present, missing] = user === undefined ? (["natsPassword", "natsUser"] as const) : (["natsUser", "natsPassword"] as const);
      throw new ConfigError(field(present).replace(present, missing), "natsUser and natsPassword go together");
    }
    auth = { kind: "userpass", user, pass };
    secrets.push(pass);
  }
  const prefix = pick("subjectPrefix") ?? DEFAULT_PREFIX;
  const inboxPrefix = pick("inboxPrefix") ?? DEFAULT_INBOX_PREFIX;
  const display = servers.map(redactUrl).join(",");
  for (const s of servers) {
    const m = /^[a-z]+:\/\/([^@/]*)@/i.exec(s);
    if (m?.[1]) secrets.push(m[1]);
  }
  return {
    servers,
    display,
    auth,
    prefix,
    inboxPrefix,
    timeoutMs: env.timeoutMs ?? settings.timeoutMs,
    key: JSON.stringify([servers, auth, inboxPrefix]),
    secrets,
  };
}

function credsSecrets(creds: string): string[] {
  // The seed is the secret; the JWT is a bearer credential too.
  return creds
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l.length > 20 && !l.startsWith("-----") && !l.startsWith("*"));
}

/**
 * The normalized config Paperclip stores: kubeclip's normalized provider config, the plugin's keys
 * and Paperclip's keys as given (ignored keys dropped).
 */
export function normalizedConfig(kubeclipNormalized: JsonObject, split: SplitConfig): JsonObject {
  return { ...kubeclipNormalized, ...split.plugin, ...split.host };
}

/** A JSON object or a ConfigError naming `field`. */
export function requireObject(v: unknown, field: string): JsonObject {
  if (!isObject(v)) throw new ConfigError(field, "must be a JSON object");
  return v;
}

// ---- JSON Schemas (manifest) ----

const stringArray = { type: "array", items: { type: "string" } } as const;
const resources = {
  type: "object",
  properties: { cpu: { type: "string" }, memory: { type: "string" } },
  additionalProperties: false,
} as const;

const connectionProperties = {
  natsUrl: {
    type: "string",
    title: "kubeclip NATS URL",
    description: "nats://host:4222 or tls://host:4222 (comma-separated for a cluster).",
  },
  natsCredentials: {
    type: "string",
    format: "secret-ref",
    title: "NATS credentials (.creds)",
    description: "A secret holding a NATS .creds file (user JWT and nkey seed).",
  },
  natsToken: { type: "string", format: "secret-ref", title: "NATS token", description: "A secret holding a NATS token." },
  natsUser: { type: "string", title: "NATS user" },
  natsPassword: { type: "string", format: "secret-ref", title: "NATS password", description: "A secret holding the NATS password." },
  subjectPrefix: {
    type: "string",
    pattern: "^[A-Za-z0-9_-]{1,32}$",
    default: DEFAULT_PREFIX,
    title: "Subject prefix",
    description: "kubeclip's subject prefix; streams are <PREFIX>_LEASES and <PREFIX>_RUNS.",
  },
  inboxPrefix: {
    type: "string",
    default: DEFAULT_INBOX_PREFIX,
    title: "Inbox prefix",
    description: "Where kubeclip's answers to the plugin go: the paperclip NATS user's own inbox (nats-auth.conf lets it subscribe only there).",
  },
} as const;

/** The environment driver's configSchema: every key of the TypeScript provider, plus the plugin's. */
export const providerConfigSchema = {
  type: "object",
  properties: {
    backend: {
      type: "string",
      enum: ["pod", "sandbox-cr", "job"],
      description:
        'Workload per lease: "pod" (kubeclip-native, any cluster) or "sandbox-cr" (agent-sandbox). "job" cannot serve Paperclip and is refused. Default: kubeclip\'s.',
    },
    namespacePrefix: { type: "string", pattern: "^[a-z0-9-]{1,32}$", default: "paperclip-" },
    companySlug: { type: "string", pattern: "^[a-z0-9-]{1,32}$" },
    imageRegistry: { type: "string" },
    imageAllowList: stringArray,
    imagePullSecrets: stringArray,
    egressAllowFqdns: stringArray,
    egressAllowCidrs: stringArray,
    egressMode: { type: "string", enum: ["standard", "cilium"], default: "standard" },
    defaultResources: { type: "object", properties: { requests: resources, limits: resources } },
    runtimeClassName: { type: "string" },
    serviceAccountAnnotations: { type: "object", additionalProperties: { type: "string" } },
    jobTtlSecondsAfterFinished: { type: "integer", minimum: 0, default: 900 },
    podActivityDeadlineSec: { type: "integer", minimum: 1, default: 3600 },
    adapterType: { type: "string", default: "claude_local" },
    adapters: { type: "array", items: { type: "object" } },
    paperclipServerNamespace: { type: "string" },
    paperclipServerPodLabels: { type: "object", additionalProperties: { type: "string" } },
    inCluster: {
      type: "boolean",
      description: "Accepted for compatibility and ignored: kubeclip's workers hold the cluster credentials.",
    },
    kubeconfig: {
      type: "string",
      format: "secret-ref",
      description: "Accepted for compatibility and ignored (never stored): kubeclip's workers hold the cluster credentials.",
    },
    timeoutMs: {
      type: "integer",
      minimum: 1,
      description: "Budget for acquire/release (ms); Paperclip waits 30 s longer. Default 25000. (The connection is the plugin settings' alone.)",
    },
    reuseLease: {
      type: "boolean",
      description:
        "Paperclip's: true keeps an agent's lease between its runs in one execution workspace (its pod for an idle window, then a volume with /workspace and $HOME). Backends pod and sandbox-cr (agent-sandbox v0.5 or later); job refuses it.",
    },
    streamRunLogs: {
      type: "boolean",
      description: "Paperclip's: false streams live output through the provider instead of tail polling (recommended).",
    },
  },
} as const;

/** The plugin's settings (`instanceConfigSchema`): the operator's connection and bounds. */
export const settingsSchema = {
  type: "object",
  properties: {
    ...connectionProperties,
    timeoutMs: { type: "integer", minimum: 1, description: "Default budget for acquire/release (ms)." },
    executeEnv: {
      type: "object",
      title: "Execute environment policy",
      description:
        'What of Paperclip\'s execute env reaches a pod. mode "allowlist" (default): only what an agent needs (the built-in list: PATH, HOME, locale, TERM, Paperclip\'s run variables, the adapters\' homes and model API keys) and the keys matching "allow"; "deny": every key but the built-in deny list of Paperclip\'s own server keys. Keys matching "deny" never pass, nor do Paperclip\'s server secrets. Globs match a whole key, * is any run of characters.',
      properties: {
        mode: { type: "string", enum: ["allowlist", "deny"], default: "allowlist" },
        allow: stringArray,
        deny: stringArray,
      },
      additionalProperties: false,
    },
    brokeredKeys: {
      type: "array",
      items: { type: "string", pattern: "^[A-Za-z_][A-Za-z0-9_]*$" },
      maxItems: MAX_BROKERED_KEYS,
      uniqueItems: true,
      default: [],
      title: "Brokered keys",
      description:
        "Environment keys kubeclip's credential broker holds (e.g. ANTHROPIC_API_KEY, OPENAI_API_KEY). Their values never reach a pod: each execute carries a lease-scoped placeholder minted by the broker instead, and an execute fails (naming the key) when the broker cannot mint one. An environment config may name a brokered key in no adapter's defaultEnv. Empty (default): off. Set the exec-worker's --brokered-keys to the same list.",
    },
    maxExecuteOutputBytes: {
      type: "integer",
      minimum: MIN_EXECUTE_OUTPUT_BYTES,
      maximum: MAX_EXECUTE_OUTPUT_BYTES,
      default: DEFAULT_EXECUTE_OUTPUT_BYTES,
      description: "The most of each stream (stdout, stderr) the plugin holds per execute: its head and tail, the middle replaced by a truncation line.",
    },
    maxConcurrentExecutesPerCompany: {
      type: "integer",
      minimum: 1,
      default: DEFAULT_CONCURRENT_EXECUTES,
      description: "Executes one company may have in flight; more wait (up to 60 s, then are refused).",
    },
    nativeSync: {
      type: "boolean",
      default: true,
      description: "Native file sync (sandboxd untar/tar over kubeclip's exec service) for exec-capable leases; false keeps Paperclip's base64-over-execute route for every lease (e.g. while pods run a sandboxd without its sync subcommands).",
    },
    maxSyncOutBytes: {
      type: "integer",
      minimum: 1,
      maximum: MAX_SYNC_OUT_BYTES,
      default: DEFAULT_SYNC_OUT_BYTES,
      description: "Native sync out: the most bytes of regular files one mapping may write onto Paperclip's host; a larger archive from a pod is refused.",
    },
    maxSyncOutFiles: {
      type: "integer",
      minimum: 1,
      maximum: MAX_SYNC_OUT_FILES,
      default: DEFAULT_SYNC_OUT_FILES,
      description: "Native sync out: the most entries (files, directories, links) one mapping may write onto Paperclip's host.",
    },
  },
} as const;
