import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import manifest, { PLUGIN_VERSION } from "./manifest.js";

describe("manifest", () => {
  it("declares exactly one kubernetes sandbox provider", () => {
    const drivers = manifest.environmentDrivers ?? [];
    assert.equal(drivers.length, 1);
    const d = drivers[0];
    assert.ok(d);
    assert.equal(d.driverKey, "kubernetes");
    assert.equal(d.kind, "sandbox_provider");
    assert.ok(manifest.capabilities.includes("environment.drivers.register"));
    assert.deepEqual(d.sandboxCapabilities, {
      reusableLeases: true,
      persistentProcessSessions: false,
      independentControlCommands: true,
      nativeSyncIn: true,
      nativeSyncOut: true,
      concurrentSyncOperations: true,
    });
    assert.equal(d.supportsLoginPty, true);
  });

  it("has package.json's version", () => {
    const pkg = JSON.parse(readFileSync("package.json", "utf8")) as { version: string; paperclipPlugin: unknown };
    assert.equal(PLUGIN_VERSION, pkg.version);
    assert.deepEqual(pkg.paperclipPlugin, { manifest: "./dist/manifest.js", worker: "./dist/worker.js" });
  });
});
