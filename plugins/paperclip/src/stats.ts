// What one lease cost Paperclip: how many times each hook was called and how long the execute
// calls took, measured at the hook (from the SDK handing the call over to the result going back:
// what Paperclip waited, minus the local JSON-RPC hop). Logged once when the lease ends, so an
// operator sees a run's exec load in Paperclip's log without a line per command (~90 a run).

/** Samples kept per lease for the percentiles: exact up to this many executes, sampled beyond. */
export const MAX_SAMPLES = 10_000;
/** Leases tracked at once; the oldest is dropped beyond (a lease Paperclip never released). */
export const MAX_LEASES = 512;

export interface LeaseSummary {
  hooks: Record<string, number>;
  executes: number;
  execP50Ms: number;
  execP99Ms: number;
  execMaxMs: number;
  /** Execs of native sync (sandboxd untar/tar, post-upload commands): execs that are no execute call. */
  syncExecs: number;
  /** Bytes of regular files native sync moved, both ways. */
  syncBytes: number;
}

/** One lease's counts. */
export class LeaseStats {
  readonly hooks: Record<string, number> = {};
  private readonly samples: number[] = [];
  private executes = 0;
  private max = 0;
  private syncExecs = 0;
  private syncBytes = 0;
  private readonly random: () => number;

  constructor(random: () => number = Math.random) {
    this.random = random;
  }

  hook(name: string): void {
    this.hooks[name] = (this.hooks[name] ?? 0) + 1;
  }

  /** One execute call and its duration. */
  execute(ms: number): void {
    this.hook("execute");
    this.executes++;
    this.max = Math.max(this.max, ms);
    if (this.samples.length < MAX_SAMPLES) {
      this.samples.push(ms);
      return;
    }
    // Reservoir sampling: every execute has the same chance to be among the samples.
    const i = Math.floor(this.random() * this.executes);
    if (i < MAX_SAMPLES) this.samples[i] = ms;
  }

  /** One native sync hook: the execs it ran and the bytes it moved. */
  sync(execs: number, bytes: number): void {
    this.syncExecs += execs;
    this.syncBytes += bytes;
  }

  summary(): LeaseSummary {
    const sorted = [...this.samples].sort((a, b) => a - b);
    return {
      hooks: { ...this.hooks },
      executes: this.executes,
      execP50Ms: percentile(sorted, 0.5),
      execP99Ms: percentile(sorted, 0.99),
      execMaxMs: this.max,
      syncExecs: this.syncExecs,
      syncBytes: this.syncBytes,
    };
  }
}

/** The nearest-rank percentile of sorted values (0 for none). */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return 0;
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil(p * sorted.length)));
  return sorted[rank - 1] ?? 0;
}

/** LeaseStats per providerLeaseId, bounded. */
export class StatsBook {
  private readonly leases = new Map<string, LeaseStats>();

  /** The lease's stats, created on first use. */
  of(providerLeaseId: string): LeaseStats {
    let s = this.leases.get(providerLeaseId);
    if (!s) {
      if (this.leases.size >= MAX_LEASES) {
        const oldest = this.leases.keys().next().value;
        if (oldest !== undefined) this.leases.delete(oldest);
      }
      s = new LeaseStats();
      this.leases.set(providerLeaseId, s);
    }
    return s;
  }

  /** Removes and returns the lease's stats (undefined when none were kept). */
  take(providerLeaseId: string): LeaseStats | undefined {
    const s = this.leases.get(providerLeaseId);
    this.leases.delete(providerLeaseId);
    return s;
  }

  get size(): number {
    return this.leases.size;
  }
}
