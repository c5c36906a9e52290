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
