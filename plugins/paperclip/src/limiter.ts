// Bounds the executes one company has in flight: one plugin process serves every company, and
// each execute holds up to twice settings.maxExecuteOutputBytes. Executes over the bound wait
// in order (a run's short bridge polls get a slot as soon as any of the company's commands
// ends) for at most the wait, then are refused with a message that names the setting.

/** How long an execute waits for one of its company's slots before it is refused. */
export const EXECUTE_SLOT_WAIT_MS = 60_000;

interface Slots {
  active: number;
  waiting: (() => void)[];
}

export class CompanyLimiter {
  private readonly byCompany = new Map<string, Slots>();
  private readonly waitMs: number;

  constructor(waitMs = EXECUTE_SLOT_WAIT_MS) {
    this.waitMs = waitMs;
  }

  /** Executes in flight for companyId (tests, logs). */
  active(companyId: string): number {
    return this.byCompany.get(companyId)?.active ?? 0;
  }

  /**
   * A slot of companyId's limit, waiting in order for one; resolves to its release function.
   * Throws after the wait, or when signal aborts.
   */
  async acquire(companyId: string, limit: number, signal?: AbortSignal): Promise<() => void> {
    let slots = this.byCompany.get(companyId);
    if (!slots) this.byCompany.set(companyId, (slots = { active: 0, waiting: [] }));
    const s = slots;
    let released = false;
    const release = (): void => {
      if (released) return;
      released = true;
      const next = s.waiting.shift();
      if (next) next(); // the slot passes on: active stays the same
      else if (--s.active === 0) this.byCompany.delete(companyId);
    };
    if (s.active < limit && s.waiting.length === 0) {
      s.active++;
      return release;
    }
    await new Promise<void>((resolve, reject) => {
      const grant = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        resolve();
      };
      const leave = (err: Error): void => {
        const i = s.waiting.indexOf(grant);
        if (i >= 0) s.waiting.splice(i, 1);
        signal?.removeEventListener("abort", onAbort);
        reject(err);
      };
      const timer = setTimeout(() => {
        leave(
          new Error(
            `execute refused: company ${companyId} already has ${s.active} commands in flight (settings.maxConcurrentExecutesPerCompany = ${limit}) and none ended within ${this.waitMs} ms`,
          ),
        );
      }, this.waitMs);
      const onAbort = (): void => {
        clearTimeout(timer);
        leave(new Error("execute cancelled while waiting for a slot"));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      s.waiting.push(grant);
    });
    return release;
  }
}

/**
 * The most bytes of execute output the plugin holds at once, all companies together: each
 * execute holds up to twice settings.maxExecuteOutputBytes as it streams (exec.ts Output), and
 * one plugin process serves every company. Past it (or past a company's share) an execute keeps
 * what it already holds and drops the middle of the rest, its tail still kept (never refused).
 */
export const OUTPUT_BUDGET_BYTES = 512 << 20;
/** The most of OUTPUT_BUDGET_BYTES one company's executes hold: the others always find room. */
export const OUTPUT_BUDGET_COMPANY_BYTES = 128 << 20;
/**
 * The tail every stream may hold past its company's share (within OUTPUT_BUDGET_BYTES still): an
 * agent's last lines (its `result`) survive however many commands its company runs.
 */
export const OUTPUT_TAIL_FLOOR_BYTES = 256 << 10;
/**
 * The most bytes of sync-out one company has being extracted at once on the Paperclip host's
 * disk, all its mappings together (each alone is bounded by settings.maxSyncOutBytes): a file
 * past it is refused, naming this budget.
 */
export const SYNC_OUT_COMPANY_BYTES = 4 * 2 ** 30;

/**
 * Bytes held against a bound in total and per key (a company). take never waits: a take that
 * would pass either bound takes nothing and says so; what was taken is given back when freed.
 */
export class ByteBudget {
  private total = 0;
  private readonly byKey = new Map<string, number>();
  readonly limit: number;
  readonly keyLimit: number;
  /** What one holder may take past its key's share, within the total (takeFloor). */
  readonly floor: number;

  constructor(limit: number, keyLimit = limit, floor = 0) {
    this.limit = limit;
    this.keyLimit = keyLimit;
    this.floor = floor;
  }

  /** Bytes held in total, or by key. */
  held(key?: string): number {
    return key === undefined ? this.total : (this.byKey.get(key) ?? 0);
  }

  /** Takes n bytes for key; false, taking nothing, when the total or key's share would pass its bound. */
  take(key: string, n: number): boolean {
    const mine = this.byKey.get(key) ?? 0;
    if (this.total + n > this.limit || mine + n > this.keyLimit) return false;
    this.total += n;
    this.byKey.set(key, mine + n);
    return true;
  }

  /** Takes n bytes for key past its share, within the total only (a holder's floor). */
  takeFloor(key: string, n: number): boolean {
    if (this.total + n > this.limit) return false;
    this.total += n;
    this.byKey.set(key, (this.byKey.get(key) ?? 0) + n);
    return true;
  }

  /** Gives back n bytes key took. */
  give(key: string, n: number): void {
    const mine = (this.byKey.get(key) ?? 0) - n;
    this.total -= n;
    if (mine <= 0) this.byKey.delete(key);
    else this.byKey.set(key, mine);
  }
}
