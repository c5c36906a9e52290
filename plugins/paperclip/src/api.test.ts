import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { ping, validateConfig } from "./api.js";
import { UnreachableError } from "./errors.js";
import { startEnv, type Env } from "../test/support/harness.js";

describe("api", () => {
  let env: Env;
  before(async () => {
    env = await startEnv();
  });
  after(async () => {
    await env.close();
  });

  it("returns kubeclip's verdict with field errors as config.x: message", async () => {
    env.kubeclip.onValidate = () => ({
      ok: false,
      errors: [{ field: "config.egressMode", message: 'must be one of "cilium", "standard", got "open"' }],
      warnings: ["w1"],
    });
    const v = await validateConfig(env.nc, "paperclip", { egressMode: "open" }, { timeoutMs: 2_000, display: "nats://x" });
    assert.deepEqual(v, { ok: false, errors: ['config.egressMode: must be one of "cilium", "standard", got "open"'], warnings: ["w1"], normalizedConfig: undefined });
    assert.deepEqual(env.kubeclip.validateRequests.at(-1), { egressMode: "open" });
  });

  it("reports no responders as kubeclip unreachable", async () => {
    await assert.rejects(validateConfig(env.nc, "nobody", {}, { timeoutMs: 2_000, display: "nats://x" }), (err: unknown) => {
      assert.ok(err instanceof UnreachableError);
      assert.equal(err.message, "kubeclip unreachable at nats://x: no kubeclip worker answers nobody.api.validate");
      return true;
    });
  });

  it("reports a silent responder as kubeclip unreachable", async () => {
    const sub = env.nc.subscribe("silent.api.validate", { callback: () => undefined });
    await env.nc.flush();
    try {
      await assert.rejects(validateConfig(env.nc, "silent", {}, { timeoutMs: 300, display: "nats://x" }), {
        message: "kubeclip unreachable at nats://x: no answer on silent.api.validate in time",
      });
    } finally {
      sub.unsubscribe();
    }
  });

  it("collects ping replies of every replica", async () => {
    const { replies, invalid } = await ping(env.nc, "paperclip", 300);
    assert.equal(invalid, 0);
    assert.deepEqual(replies.map((r) => r.worker).sort(), ["dispatcher", "exec-worker", "run-watcher", "tenant-worker"]);
    const none = await ping(env.nc, "nobody", 300);
    assert.deepEqual(none, { replies: [], invalid: 0 });
  });
});
