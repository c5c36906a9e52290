// A load of concurrently followed leases through the plugin's acquire hook (the code Paperclip's
// host calls), against a real nats-server at its default limits (a stream's 1,001st consumer is
// refused) and the fake kubeclip in a process of its own (test/load/kubeclip.ts): every acquire
// is published and waiting before kubeclip answers any of them. Measured at that moment: the run
// stream's consumers and this process's RSS (the plugin under the SDK's harness, and the
// driver's own calls). Used by follow-load.test.ts (a CI size) and the load/follow-load.ts driver
// (docs/architecture.md, Following thousands of leases).

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { errorMessage } from "../../src/errors.js";
import { harnessed } from "./harness.js";
import { startNatsServer } from "./nats-server.js";

export interface FollowLoad {
  leases: number;
  /** Acquires answered `created` with their own run's lease. */
  acquired: number;
  failed: number;
  firstError: string;
  /** Consumers on the run stream while every acquire was waiting. */
  consumersWaiting: number;
  /**
   * RSS and V8 heap in use of this process before the load (after one acquire) and while every
   * acquire waited, each after a full GC when node runs with --expose-gc (the driver does).
   */
  rssBeforeBytes: number;
  rssWaitingBytes: number;
  heapBeforeBytes: number;
  heapWaitingBytes: number;
  /** VmHWM at the end. */
  peakRssBytes: number;
  /** From the first acquire to all of them waiting; from kubeclip's answers to all returned. */
  waitingMs: number;
  answeredMs: number;
}

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
const POLL_MS = 20;

function rss(key: "VmRSS" | "VmHWM"): number {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB$`, "m").exec(readFileSync("/proc/self/status", "utf8"));
  if (!m?.[1]) throw new Error(`no ${key} in /proc/self/status`);
  return Number(m[1]) * 1024;
}

/** Runs n concurrent acquires through the plugin's hook; kubeclip answers once all wait. */
export async function followLoad(n: number): Promise<FollowLoad> {
  const server = await startNatsServer();
  const kubeclip = spawn(process.execPath, [fileURLToPath(new URL("../load/kubeclip.js", import.meta.url)), server.url], { stdio: ["ignore", "pipe", "inherit"] });
  const nc = await connect({ servers: server.url });
  try {
    await new Promise<void>((resolve, reject) => {
      kubeclip.stdout.on("data", (b: Buffer) => {
        if (b.toString().includes("ready")) resolve();
      });
      kubeclip.once("exit", (code) => {
        reject(new Error(`the fake kubeclip exited (${code}) before it was ready`));
      });
    });
    const jsm = await jetstreamManager(nc);
    const h = await harnessed(undefined, { natsUrl: server.url });
    try {
      const config = { backend: "pod", timeoutMs: 600_000 };
      // Warm: the connection, the settings, whatever the plugin opens once.
      await h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config, runId: runId(0), agentId: "warm" });
      global.gc?.();
      const rssBeforeBytes = rss("VmRSS");
      const heapBeforeBytes = process.memoryUsage().heapUsed;

      let failed = 0;
      let firstError = "";
      const t0 = Date.now();
      const calls = Array.from({ length: n }, (_, i) => {
        const r = runId(i + 1);
        return h.harness
          .acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config, runId: r, agentId: `agent-${i}` })
          .then((lease) => lease.providerLeaseId === `pc-${r.slice(0, 8)}`)
          .catch((err: unknown) => {
            failed++;
            if (!firstError) firstError = errorMessage(err);
            return false;
          });
      });
      // Waiting: each acquire stored in the lease stream (after the warm one), or failed.
      while ((await jsm.streams.info("PAPERCLIP_LEASES")).state.messages - 1 + failed < n) {
        await new Promise((resolve) => setTimeout(resolve, POLL_MS));
      }
      const waitingMs = Date.now() - t0;
      const consumersWaiting = (await jsm.streams.info("PAPERCLIP_RUNS")).state.consumer_count;
      global.gc?.();
      const rssWaitingBytes = rss("VmRSS");
      const heapWaitingBytes = process.memoryUsage().heapUsed;
      const t1 = Date.now();
      nc.publish("load.open");
      const ok = await Promise.all(calls);
      const answeredMs = Date.now() - t1;
      return {
        leases: n,
        acquired: ok.filter(Boolean).length,
        failed,
        firstError,
        consumersWaiting,
        rssBeforeBytes,
        rssWaitingBytes,
        heapBeforeBytes,
        heapWaitingBytes,
        peakRssBytes: rss("VmHWM"),
        waitingMs,
        answeredMs,
      };
    } finally {
      await h.shutdown();
    }
  } finally {
    kubeclip.kill();
    await nc.close();
    await server.stop();
  }
}

function runId(i: number): string {
  // The fake names the lease by the run id's first 8 characters: unique per run.
  return `${i.toString(16).padStart(8, "0")}-5a7c-4c1e-9f0b-0e8b6f4a0000`;
}

/** One line of raw columns. */
export function formatLoad(r: FollowLoad): string {
  const mib = (b: number): string => (b / (1 << 20)).toFixed(1);
  return [
    `leases=${r.leases}`,
    `acquired=${r.acquired}`,
    `failed=${r.failed}`,
    `consumers_waiting=${r.consumersWaiting}`,
    `rss_before_mib=${mib(r.rssBeforeBytes)}`,
    `rss_waiting_mib=${mib(r.rssWaitingBytes)}`,
    `heap_before_mib=${mib(r.heapBeforeBytes)}`,
    `heap_waiting_mib=${mib(r.heapWaitingBytes)}`,
    `heap_per_lease_kib=${((r.heapWaitingBytes - r.heapBeforeBytes) / 1024 / r.leases).toFixed(1)}`,
    `peak_rss_mib=${mib(r.peakRssBytes)}`,
    `waiting_ms=${r.waitingMs}`,
    `answered_ms=${r.answeredMs}`,
    ...(r.firstError ? [`first_error=${JSON.stringify(r.firstError)}`] : []),
  ].join(" ");
}
