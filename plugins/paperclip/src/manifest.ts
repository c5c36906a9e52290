// The plugin manifest: one sandbox-provider driver with driverKey "kubernetes", so Paperclip's
// `executionMode: kubernetes` policy and PAPERCLIP_K8S_* bootstrap use kubeclip. Install only one
// plugin that declares this driver.

import type { PaperclipPluginManifestV1 } from "@paperclipai/plugin-sdk";
import { providerConfigSchema, settingsSchema } from "./config.js";

export const PLUGIN_ID = "kubeclip.paperclip-sandbox-provider";
/** Kept equal to package.json's version (a test pins it). */
export const PLUGIN_VERSION = "0.1.0";
export const DRIVER_KEY = "kubernetes";
/**
 * Whether kubeclip declares reusable leases to the host: resume, a reusable release and destroy
 * (lifecycle.ts, leases.ts), run through the real host by tests/paperclip (reuse_test.go). The host
 * reuses a lease only for an environment with `reuseLease: true` and a run with an execution
 * workspace (docs/reuse.md, the host's rules §1); every other lease stays one run's pod.
 */
export const REUSABLE_LEASES = true;

const manifest: PaperclipPluginManifestV1 = {
  id: PLUGIN_ID,
  apiVersion: 1,
  version: PLUGIN_VERSION,
  displayName: "kubeclip Kubernetes sandbox",
  description:
    "Runs Paperclip agent runs in Kubernetes pods managed by kubeclip, over NATS JetStream. A drop-in replacement for Paperclip's Kubernetes sandbox provider.",
  author: "kubeclip",
  categories: ["automation"],
  // secrets.read-ref: NATS credentials in the plugin's settings are secret bindings.
  capabilities: ["environment.drivers.register", "secrets.read-ref"],
  entrypoints: { worker: "./dist/worker.js" },
  instanceConfigSchema: settingsSchema,
  environmentDrivers: [
    {
      driverKey: DRIVER_KEY,
      kind: "sandbox_provider",
      displayName: "Kubernetes (kubeclip)",
      description:
        "One pod per run, created by kubeclip (with reuseLease, one per agent and execution workspace, kept between its runs on a volume); commands run through kubeclip's exec service. Backends: pod (any cluster) or sandbox-cr (agent-sandbox).",
      configSchema: providerConfigSchema,
      // Only what the plugin implements: concurrent commands on a lease, no sessions, reusable
      // leases (an environment's reuseLease: the pod and a volume kept between the agent's runs);
      // native file sync both ways (sandboxd untar/tar over the exec service), any number of
      // transfers at once (each its own exec).
      sandboxCapabilities: {
        reusableLeases: REUSABLE_LEASES,
        persistentProcessSessions: false,
        independentControlCommands: true,
        nativeSyncIn: true,
        nativeSyncOut: true,
        concurrentSyncOperations: true,
      },
      // The in-product adapter logins (Claude setup-token, Codex and Grok device logins) on a
      // terminal in a lease's pod: the onLoginPty* hooks (loginpty.ts). The host offers a
      // kubeclip environment for them only with this flag (plugin-environment-driver.js,
      // routes/agents.js resolveProviderSupportsLoginPty).
      supportsLoginPty: true,
    },
  ],
};

export default manifest;
