// The environment config of a `kubernetes` sandbox environment, and the plugin's own settings.
//
// An environment config mixes three kinds of keys:
//   - the Kubernetes provider config (the TypeScript provider's zod schema plus kubeclip's
//     additions): sent to kubeclip, whose pkg/policy validates it and is the one source of truth;
//   - the plugin's keys: how to reach kubeclip (NATS URL, credentials, subject prefix) and the
//     RPC budget `timeoutMs`; never sent to kubeclip;
//   - Paperclip's own keys (`provider`, `reuseLease`, `streamRunLogs`, …, and at run time what the
//     host merges in from lease metadata): never sent to kubeclip, kept as they are.
// `inCluster` and `kubeconfig` are accepted for compatibility with the bootstrap config
// (PAPERCLIP_EXECUTION_MODE=kubernetes) and dropped with a warning: kubeclip's workers hold the
// cluster credentials.

import { ConfigError, redactUrl } from "./errors.js";
import { findCaseVariantKey, isObject, type JsonObject } from "./json.js";

/** The backends that can serve Paperclip's execute calls (a pod that stays up for the lease). */
export const EXEC_BACKENDS = ["pod", "sandbox-cr"] as const;

/** Keys of the plugin: connection settings and the RPC budget. */
export const PLUGIN_KEYS = [
  "natsUrl",
  "natsCredentials",
  "natsToken",
  "natsUser",
  "natsPassword",
  "subjectPrefix",
  "timeoutMs",
] as const;

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

/** How to reach kubeclip, from the plugin's keys (environment config over plugin settings). */
export interface Connection {
  /** NATS server URLs. */
  servers: string[];
  /** The URLs for messages, credentials removed. */
  display: string;
  auth: Auth;
  prefix: string;
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
const PREFIX_RE = /^[A-Za-z0-9_-]{1,32}$/;
const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
/** timeoutMs at most one day: it bounds waits the plugin makes, not the agent's runtime. */
const MAX_TIMEOUT_MS = 86_400_000;

/** A value that is a secret id Paperclip has not resolved (validation time, or a bare legacy id). */
export function isUnresolvedSecretRef(v: unknown): boolean {
  return typeof v === "string" && UUID_RE.test(v.trim());
}

/**
 * The plugin keys of one source, type-checked. `source` is "config" (the environment) or
 * "settings" (the plugin's settings) and prefixes field names in errors.
 */
export function readPluginKeys(obj: JsonObject, source: string): PluginKeys {
  const out: PluginKeys = {};
  const str = (key: string): string | undefined => {
    const v = obj[key];
    if (v === undefined || v === null || v === "") return undefined;
    if (typeof v !== "string") throw new ConfigError(`${source}.${key}`, "must be a string");
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
      throw new ConfigError(`${source}.subjectPrefix`, "must be 1-32 letters, digits, '-' or '_'");
    }
    out.subjectPrefix = prefix;
  }
  const t = obj.timeoutMs;
  if (t !== undefined && t !== null) {
    if (typeof t !== "number" || !Number.isSafeInteger(t) || t <= 0 || t > MAX_TIMEOUT_MS) {
      throw new ConfigError(`${source}.timeoutMs`, `must be a positive integer of milliseconds, at most ${MAX_TIMEOUT_MS}`);
    }
    out.timeoutMs = t;
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
  timeoutMs?: number;
}

/**
 * Resolves the connection: each key from the environment config when set there, else from the
 * plugin settings. Secret values must already be resolved (Paperclip resolves an environment's
 * secret refs before every hook but validateConfig; the plugin resolves its settings' refs).
 */
export function resolveConnection(env: PluginKeys, settings: PluginKeys): Connection {
  const pick = <K extends keyof PluginKeys>(k: K): PluginKeys[K] => env[k] ?? settings[k];
  const field = (k: keyof PluginKeys): string => (env[k] !== undefined ? `config.${k}` : `settings.${k}`);
  const url = pick("natsUrl");
  if (url === undefined) {
    throw new ConfigError(
      "config.natsUrl",
      "not set: give kubeclip's NATS URL in the environment config or in the plugin's settings",
    );
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
    timeoutMs: pick("timeoutMs"),
    key: JSON.stringify([servers, auth]),
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
    description: "nats://host:4222 or tls://host:4222 (comma-separated for a cluster). Overrides the plugin settings.",
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
    ...connectionProperties,
    timeoutMs: {
      type: "integer",
      minimum: 1,
      description: "Budget for acquire/release (ms); Paperclip waits 30 s longer. Default 25000.",
    },
    reuseLease: { type: "boolean", description: "Paperclip's: not supported by this provider (leases are per run)." },
    streamRunLogs: {
      type: "boolean",
      description: "Paperclip's: false streams live output through the provider instead of tail polling (recommended).",
    },
  },
} as const;

/** The plugin's settings (`instanceConfigSchema`): a default connection for every environment. */
export const settingsSchema = {
  type: "object",
  properties: {
    ...connectionProperties,
    timeoutMs: { type: "integer", minimum: 1, description: "Default budget for acquire/release (ms)." },
  },
} as const;
