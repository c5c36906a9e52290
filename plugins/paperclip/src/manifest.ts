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
 * Whether kubeclip declares reusable leases to the host. The hooks are there (resume, a reusable
 * release and destroy: plugin.ts, leases.ts) and kubeclip keeps such leases (docs/reuse/wire.md),
 * but the declaration waits until tests/paperclip has run them through the real host.
 */
export const REUSABLE_LEASES = false;

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
        "One pod per run, created by kubeclip; commands run through kubeclip's exec service. Backends: pod (any cluster) or sandbox-cr (agent-sandbox).",
      configSchema: providerConfigSchema,
      // Only what the plugin implements: concurrent commands on a lease, no sessions, no lease
      // reuse (a lease is one run's pod); native file sync both ways (sandboxd untar/tar over
      // the exec service), any number of transfers at once (each its own exec).
      sandboxCapabilities: {
        reusableLeases: REUSABLE_LEASES,
        persistentProcessSessions: false,
        independentControlCommands: true,
        nativeSyncIn: true,
        nativeSyncOut: true,
        concurrentSyncOperations: true,
      },
    },
  ],
};

export default manifest;
