// A load of concurrently followed leases through the plugin's acquire hook (the code Paperclip's
// host calls), against a real nats-server at its default limits (a stream's 1,001st consumer is
// refused) and the fake kubeclip: every acquire is published and waiting before kubeclip answers
// any of them. Measured at that moment: the run stream's consumers and this process's RSS.
// Used by follow-load.test.ts (a CI size) and the load/follow-load.ts driver (docs/follow.md).

import { readFileSync } from "node:fs";
import { jetstreamManager } from "@nats-io/jetstream";
import { errorMessage } from "../../src/errors.js";
import { harnessed } from "./harness.js";
import { startEnv } from "./harness.js";

export interface FollowLoad {
  leases: number;
  /** Acquires answered `created` with their own run's lease. */
  acquired: number;
  failed: number;
  firstError: string;
  /** Consumers on the run stream while every acquire was waiting (the most seen then). */
  consumersWaiting: number;
  /** RSS of this process (plugin, fake kubeclip, harness) before the load and while waiting. */
  rssBeforeBytes: number;
  rssWaitingBytes: number;
  /** VmHWM at the end. */
  peakRssBytes: number;
  /** From the first acquire to all of them waiting; from kubeclip's answers to all returned. */
  waitingMs: number;
  answeredMs: number;
}

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";

function rss(key: "VmRSS" | "VmHWM"): number {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB$`, "m").exec(readFileSync("/proc/self/status", "utf8"));
  if (!m?.[1]) throw new Error(`no ${key} in /proc/self/status`);
  return Number(m[1]) * 1024;
}

/** Runs n concurrent acquires through the plugin's hook; kubeclip answers once all wait. */
export async function followLoad(n: number): Promise<FollowLoad> {
  const env = await startEnv();
  const h = await harnessed(undefined, { natsUrl: env.server.url });
  const jsm = await jetstreamManager(env.nc);
  try {
    // Warm: the connection, the settings, whatever the plugin opens once.
    await h.harness.acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { backend: "pod", timeoutMs: 600_000 }, runId: runId(0), agentId: "warm" });
    global.gc?.();
    const rssBeforeBytes = rss("VmRSS");

    let failed = 0;
    let firstError = "";
    let requests = 0;
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    let allWaiting!: () => void;
    const waiting = new Promise<void>((resolve) => (allWaiting = resolve));
    const check = (): void => {
      if (requests + failed === n) allWaiting();
    };
    env.kubeclip.onAcquire = async () => {
      requests++;
      check();
      await gate;
      return { kind: "created" };
    };
    const t0 = Date.now();
    const calls = Array.from({ length: n }, (_, i) => {
      const r = runId(i + 1);
      return h.harness
        .acquireLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: { backend: "pod", timeoutMs: 600_000 }, runId: r, agentId: `agent-${i}` })
        .then((lease) => lease.providerLeaseId === `pc-${r.slice(0, 8)}`)
        .catch((err: unknown) => {
          failed++;
          if (!firstError) firstError = errorMessage(err);
          check();
          return false;
        });
    });
    await waiting;
    const waitingMs = Date.now() - t0;
    const consumersWaiting = (await jsm.streams.info("PAPERCLIP_RUNS")).state.consumer_count;
    const rssWaitingBytes = rss("VmRSS");
    const t1 = Date.now();
    open();
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
      peakRssBytes: rss("VmHWM"),
      waitingMs,
      answeredMs,
    };
  } finally {
    await h.shutdown();
    await env.close();
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
    `peak_rss_mib=${mib(r.peakRssBytes)}`,
    `waiting_ms=${r.waitingMs}`,
    `answered_ms=${r.answeredMs}`,
    ...(r.firstError ? [`first_error=${JSON.stringify(r.firstError)}`] : []),
  ].join(" ");
}
