// Paperclip's login pseudo-terminals (the onLoginPty* hooks): an adapter's login command (Claude
// `setup-token`, Codex and Grok device logins) run on a terminal in a lease's pod through
// kubeclip's exec service, its output streamed to the host as `loginPty.output` notifications and
// its end as one `loginPty.exit`.
//
//   open  {hostRouteId, companyId, providerLeaseId, loginCommandKey, sessionHome} → a terminal
//         exec on the lease (commands.ts openLogin finds the lease and checks its company), reply
//         {workerSessionId}
//   input {workerSessionId, data} → the exec's stdin, in order, bounded
//   stop  {workerSessionId}       → SIGKILL (idempotent; the exit follows)
//   close {hostRouteId}           → stop and forget, always answered {hostRouteId} at once: the
//                                   host retires the whole worker when a close goes unanswered
//
// The request carries no command: the key picks one of a fixed table. Terminal bytes (a setup
// token is typed and printed there) are never logged, thrown or kept beyond the exec's bounds.

import { randomUUID } from "node:crypto";
import type { PluginLoginCommandKey, PluginLoginPtyOpenParams } from "@paperclipai/plugin-sdk/protocol";
import { DRIVER_KEY } from "./manifest.js";

/** The terminal's size: the host sends none and has no resize hook. */
export const LOGIN_TTY = { rows: 40, cols: 120 } as const;
/** The login command's budget in the pod; the host's own session deadline is shorter. */
export const LOGIN_TIMEOUT_MS = 30 * 60_000;
/** The most output one login sends: the host's own total per route (8 Mi characters). */
export const LOGIN_OUTPUT_BYTES = 8 << 20;
/** The largest one input call (a pasted code or token is a few hundred bytes). */
export const MAX_INPUT_BYTES = 64 << 10;
/** The most input held for one terminal that the pod has not taken yet. */
export const MAX_QUEUED_INPUT_BYTES = 256 << 10;
/** The most login terminals one worker holds at once, shared by the companies (loginShare). */
export const MAX_LOGIN_TERMINALS = 64;
/**
 * A terminal that got no input for this long is stopped (its exit says no code). A login is one
 * person's and minutes long: Claude's setup-token waits for the code its user pastes, a device
 * login (Codex, Grok) for its user to type the shown code in a browser, which takes a minute or
 * two; the device codes themselves expire after about 15 minutes. Ten minutes without a keystroke
 * is a login nobody is doing, and a slot that another company may need; without it a terminal
 * held a slot for the whole LOGIN_TIMEOUT_MS (30 minutes).
 */
export const LOGIN_IDLE_MS = 10 * 60_000;
/**
 * How long a company refused for want of a free slot keeps its claim: counted among the companies
 * that share the slots, it lowers the others' share, so the next slot that frees is not taken
 * again by a company over its new share, and the refused company's retry finds it.
 */
export const LOGIN_CLAIM_MS = 2 * 60_000;

/**
 * One company's share of total login slots when `companies` companies hold or claim terminals:
 * max-min fair at admission. A company alone may use every slot; when others arrive each may open
 * terminals only while it holds fewer than total / companies (at least one). Nothing running is
 * stopped to make room: the share binds at admission, and the idle stop frees slots.
 */
export function loginShare(total: number, companies: number): number {
  return Math.max(1, Math.floor(total / Math.max(1, companies)));
}
/** Where the host puts a login's home: exactly `<root>/<uuid>` (server login-command.js). */
export const SESSION_HOME_ROOT = "/tmp/paperclip-adapter-login";
const SESSION_HOME = /^\/tmp\/paperclip-adapter-login\/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** Host route ids are the host's UUIDs; anything printable and short is accepted. */
const ROUTE_ID = /^[A-Za-z0-9._:-]{1,128}$/;

export interface LoginCommand {
  command: string;
  args: readonly string[];
  /** The variable that names the login's home (the adapters' credential directory). */
  homeEnv: string;
}

/**
 * The fixed command of each key, as the installed adapters name them: adapter-claude-local
 * CLAUDE_SETUP_TOKEN_COMMAND, adapter-codex-local CODEX_DEVICE_LOGIN_COMMAND (the server reads
 * the credential from `$CODEX_HOME/auth.json`), adapter-grok-local GROK_DEVICE_LOGIN_COMMAND
 * (`GROK_HOME`). Claude's token is printed, not stored: its home only keeps it from the pod's.
 */
export const LOGIN_COMMANDS: Readonly<Record<PluginLoginCommandKey, LoginCommand>> = {
  claude: { command: "claude", args: ["setup-token"], homeEnv: "HOME" },
  codex: { command: "codex", args: ["login", "--device-auth"], homeEnv: "CODEX_HOME" },
  grok: { command: "grok", args: ["login", "--device-auth"], homeEnv: "GROK_HOME" },
};

/**
 * Makes the home (only its owner may read it) and runs the login command in it. The home and
 * the command are arguments, never spliced into the script.
 */
const LAUNCH = 'umask 077 && mkdir -p -- "$1" && cd -- "$1" && shift && exec "$@"';

/** The exec a login runs: /bin/sh LAUNCH with the home and the fixed command. */
export function loginExec(key: PluginLoginCommandKey, sessionHome: string): { command: string; args: string[]; env: Record<string, string> } {
  const c: LoginCommand = LOGIN_COMMANDS[key];
  return {
    command: "/bin/sh",
    args: ["-c", LAUNCH, "kubeclip-login", sessionHome, c.command, ...c.args],
    env: { [c.homeEnv]: sessionHome, TERM: "xterm-256color" },
  };
}

/** An open request, checked. */
export interface LoginOpen {
  hostRouteId: string;
  companyId: string;
  environmentId: string;
  providerLeaseId: string;
  key: PluginLoginCommandKey;
  sessionHome: string;
}

/** Checks an open request field by field (the company is hostile); throws naming the field. */
export function checkOpen(p: PluginLoginPtyOpenParams): LoginOpen {
  const str = (v: unknown, field: string): string => {
    if (typeof v !== "string" || v === "") throw new Error(`${field}: missing`);
    if (v.length > 256) throw new Error(`${field}: longer than 256 characters`);
    return v;
  };
  const hostRouteId = str(p.hostRouteId, "hostRouteId");
  if (!ROUTE_ID.test(hostRouteId)) throw new Error("hostRouteId: not a route id (letters, digits, . _ : -, at most 128)");
  if (p.driverKey !== DRIVER_KEY) throw new Error(`driverKey: not ${DRIVER_KEY}`);
  const key: unknown = p.loginCommandKey;
  if (typeof key !== "string" || !Object.hasOwn(LOGIN_COMMANDS, key)) {
    throw new Error(`loginCommandKey: not one of ${Object.keys(LOGIN_COMMANDS).join(", ")}`);
  }
  const sessionHome = str(p.sessionHome, "sessionHome");
  if (!SESSION_HOME.test(sessionHome)) throw new Error(`sessionHome: not ${SESSION_HOME_ROOT}/<uuid>`);
  return {
    hostRouteId,
    companyId: str(p.companyId, "companyId"),
    environmentId: typeof p.environmentId === "string" ? p.environmentId : "",
    providerLeaseId: str(p.providerLeaseId, "providerLeaseId"),
    key: key as PluginLoginCommandKey,
    sessionHome,
  };
}

/**
 * A terminal's input: bytes pushed by the input hook, read by the exec's stdin sender in order.
 * Bounded: a push beyond MAX_QUEUED_INPUT_BYTES not yet taken is refused. return() ends it,
 * settling a pending read (the exec ended).
 */
export class InputQueue implements AsyncIterableIterator<Uint8Array> {
  private readonly items: Uint8Array[] = [];
  private queued = 0;
  private ended = false;
  private waiter: ((r: IteratorResult<Uint8Array>) => void) | undefined;

  push(data: Uint8Array): void {
    if (this.ended) throw new Error("workerSessionId: the login terminal takes no more input");
    if (this.queued + data.byteLength > MAX_QUEUED_INPUT_BYTES) {
      throw new Error(`data: more than ${MAX_QUEUED_INPUT_BYTES} bytes of input wait for the terminal`);
    }
    const w = this.waiter;
    if (w) {
      this.waiter = undefined;
      w({ value: data, done: false });
      return;
    }
    this.items.push(data);
    this.queued += data.byteLength;
  }

  next(): Promise<IteratorResult<Uint8Array>> {
    const first = this.items.shift();
    if (first) {
      this.queued -= first.byteLength;
      return Promise.resolve({ value: first, done: false });
    }
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve) => (this.waiter = resolve));
  }

  return(): Promise<IteratorResult<Uint8Array>> {
    this.ended = true;
    this.items.length = 0;
    this.queued = 0;
    const w = this.waiter;
    this.waiter = undefined;
    w?.({ value: undefined, done: true });
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<Uint8Array> {
    return this;
  }
}

/** What a terminal's exec is given: its input, and a signal that stops it. */
export interface TerminalIO {
  input: InputQueue;
  signal: AbortSignal;
  /** Each output piece, text as it came; dropped once the terminal is closed. */
  output(text: string): void;
}

/** One terminal's entry. */
interface Terminal {
  hostRouteId: string;
  companyId: string;
  workerSessionId: string;
  input: InputQueue;
  stop: AbortController;
  closed: boolean;
  /** Stops the terminal after LOGIN_IDLE_MS without input (re-armed by each input). */
  idle?: NodeJS.Timeout | undefined;
}

/** LoginTerminals' bounds (tests shorten them). */
export interface LoginTerminalLimits {
  /** Slots of the worker, shared by the companies (default MAX_LOGIN_TERMINALS). */
  total?: number;
  /** Default LOGIN_IDLE_MS. */
  idleMs?: number;
  /** Default LOGIN_CLAIM_MS. */
  claimMs?: number;
  now?: () => number;
}

/** Where a terminal's output and end go: ctx.loginPty. */
export interface LoginPtySink {
  output(hostRouteId: string, workerSessionId: string, chunk: string): void;
  exit(hostRouteId: string, workerSessionId: string, exitCode: number | null): void;
}

/**
 * The worker's login terminals by route id (the host's authoritative key) and by session id (the
 * key of input and stop). A route is reserved before anything is awaited, so a close that
 * overtakes its open still finds it.
 */
export class LoginTerminals {
  private readonly byRoute = new Map<string, Terminal>();
  private readonly bySession = new Map<string, Terminal>();
  /** Companies refused for want of a free slot, until when their claim lasts. */
  private readonly claims = new Map<string, number>();
  private readonly sink: () => LoginPtySink;
  private readonly newId: () => string;
  private readonly total: number;
  private readonly idleMs: number;
  private readonly claimMs: number;
  private readonly now: () => number;

  constructor(sink: () => LoginPtySink, newId: () => string = randomUUID, limits: LoginTerminalLimits = {}) {
    this.sink = sink;
    this.newId = newId;
    this.total = limits.total ?? MAX_LOGIN_TERMINALS;
    this.idleMs = limits.idleMs ?? LOGIN_IDLE_MS;
    this.claimMs = limits.claimMs ?? LOGIN_CLAIM_MS;
    this.now = limits.now ?? Date.now;
  }

  /**
   * Admits one more terminal of companyId or throws naming the bound: the worker's slots, and the
   * company's share of them among the companies that hold terminals or claim one (loginShare). A
   * company refused because every slot is taken claims one for LOGIN_CLAIM_MS.
   */
  private admit(companyId: string): void {
    const now = this.now();
    for (const [c, until] of this.claims) if (until <= now) this.claims.delete(c);
    const held = new Map<string, number>();
    for (const o of this.byRoute.values()) held.set(o.companyId, (held.get(o.companyId) ?? 0) + 1);
    const companies = new Set([...held.keys(), ...this.claims.keys(), companyId]).size;
    const share = loginShare(this.total, companies);
    const mine = held.get(companyId) ?? 0;
    if (mine >= share) {
      throw new Error(`companyId: the company holds ${mine} login terminals, its share of this worker's ${this.total} among ${companies} companies`);
    }
    if (this.byRoute.size >= this.total) {
      this.claims.set(companyId, now + this.claimMs);
      throw new Error(`hostRouteId: this worker's ${this.total} login terminals are all open; a slot is kept for this company as one frees (try again shortly)`);
    }
    this.claims.delete(companyId);
  }

  /** (Re)arms t's idle stop. */
  private armIdle(t: Terminal): void {
    clearTimeout(t.idle);
    t.idle = setTimeout(() => {
      t.stop.abort();
    }, this.idleMs);
    t.idle.unref();
  }

  get size(): number {
    return this.byRoute.size;
  }

  /**
   * Opens a terminal of companyId: prepare (the lease checks, the connection) and then run (the exec, until it
   * ends) get its IO. Answers the session id once prepare succeeded; run's end is the exit
   * notification (its exit code, or null when it failed). A failed prepare forgets the route.
   */
  async open(hostRouteId: string, companyId: string, prepare: () => Promise<(io: TerminalIO) => Promise<number | null>>): Promise<string> {
    if (this.byRoute.has(hostRouteId)) throw new Error("hostRouteId: a login terminal with this route id is open");
    this.admit(companyId);
    const t: Terminal = { hostRouteId, companyId, workerSessionId: this.newId(), input: new InputQueue(), stop: new AbortController(), closed: false };
    this.byRoute.set(hostRouteId, t);
    let run: (io: TerminalIO) => Promise<number | null>;
    try {
      run = await prepare();
    } catch (err) {
      this.forget(t);
      throw err;
    }
    if (t.closed) throw new Error("hostRouteId: the login terminal was closed while it opened");
    this.bySession.set(t.workerSessionId, t);
    this.armIdle(t);
    const sink = this.sink();
    const io: TerminalIO = {
      input: t.input,
      signal: t.stop.signal,
      output: (text) => {
        if (!t.closed && text !== "") sink.output(t.hostRouteId, t.workerSessionId, text);
      },
    };
    void run(io)
      .catch(() => null)
      .then((code) => {
        // Ended: forgotten now (a later close is answered all the same), so an exit the host
        // never closes holds no slot.
        const closed = t.closed;
        this.forget(t);
        if (!closed) sink.exit(t.hostRouteId, t.workerSessionId, code);
      });
    return t.workerSessionId;
  }

  /** Writes data to a terminal's stdin, after what came before. */
  input(workerSessionId: string, data: string): void {
    const t = this.bySession.get(workerSessionId);
    if (!t || t.closed) throw new Error("workerSessionId: no open login terminal with this id");
    if (typeof data !== "string") throw new Error("data: not a string");
    const bytes = Buffer.from(data, "utf8");
    if (bytes.byteLength > MAX_INPUT_BYTES) throw new Error(`data: longer than ${MAX_INPUT_BYTES} bytes`);
    if (bytes.byteLength > 0) t.input.push(bytes);
    this.armIdle(t);
  }

  /** Stops a terminal's command; nothing for one already stopped, closed or unknown. */
  stop(workerSessionId: string): void {
    this.bySession.get(workerSessionId)?.stop.abort();
  }

  /** Stops and forgets the route's terminal; nothing for an unknown route. */
  close(hostRouteId: string): void {
    const t = this.byRoute.get(hostRouteId);
    if (t) this.forget(t);
  }

  /** Stops and forgets every terminal (shutdown). */
  closeAll(): void {
    for (const t of [...this.byRoute.values()]) this.forget(t);
  }

  private forget(t: Terminal): void {
    clearTimeout(t.idle);
    t.closed = true;
    t.stop.abort();
    void t.input.return();
    this.byRoute.delete(t.hostRouteId);
    this.bySession.delete(t.workerSessionId);
  }
}
