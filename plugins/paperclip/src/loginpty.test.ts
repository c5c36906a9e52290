import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, before, describe, it } from "node:test";
import type { PluginLoginPtyOpenParams } from "@paperclipai/plugin-sdk/protocol";
import { harnessed, startEnv, type Env, type Harnessed } from "../test/support/harness.js";
import { InputQueue, LOGIN_COMMANDS, LOGIN_IDLE_MS, LoginTerminals, MAX_INPUT_BYTES, MAX_LOGIN_TERMINALS, MAX_QUEUED_INPUT_BYTES, SESSION_HOME_ROOT, checkOpen, loginExec, loginShare, type LoginPtySink, type TerminalIO } from "./loginpty.js";

const C = "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13";
const OTHER = "5a1e0b7c-2d3f-4a6b-8c9d-0e1f2a3b4c5d";
let n = 0;
const newRun = (): string => `${(0x2e8b0000 + ++n).toString(16)}-5a7c-4c1e-9f0b-2a9d7c3e1b44`;
const SECRET_CODE = "sk-ant-oat01-typed-secret";

async function eventually(cond: () => boolean, what: string, ms = 5_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) assert.fail(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** What ctx.loginPty was sent. */
class Sink implements LoginPtySink {
  readonly chunks: { hostRouteId: string; workerSessionId: string; chunk: string }[] = [];
  readonly exits: { hostRouteId: string; workerSessionId: string; exitCode: number | null }[] = [];
  output(hostRouteId: string, workerSessionId: string, chunk: string): void {
    this.chunks.push({ hostRouteId, workerSessionId, chunk });
  }
  exit(hostRouteId: string, workerSessionId: string, exitCode: number | null): void {
    this.exits.push({ hostRouteId, workerSessionId, exitCode });
  }
  text(route: string): string {
    return this.chunks.filter((c) => c.hostRouteId === route).map((c) => c.chunk).join("");
  }
}

describe("login pty checks", () => {
  const good: PluginLoginPtyOpenParams = {
    hostRouteId: randomUUID(),
    driverKey: "kubernetes",
    companyId: C,
    environmentId: "env-1",
    providerLeaseId: "pc-1",
    loginCommandKey: "claude",
    sessionHome: `${SESSION_HOME_ROOT}/${randomUUID()}`,
  };
  const refused: [string, Partial<Record<keyof PluginLoginPtyOpenParams, unknown>>, RegExp][] = [
    ["a relative home", { sessionHome: "tmp/paperclip-adapter-login/0b1c" }, /^sessionHome: not \/tmp\/paperclip-adapter-login\/<uuid>$/],
    ["a traversal", { sessionHome: `${SESSION_HOME_ROOT}/../../etc` }, /^sessionHome: /],
    ["a home with a shell character", { sessionHome: `${SESSION_HOME_ROOT}/${randomUUID()};rm -rf /` }, /^sessionHome: /],
    ["an upper-case uuid", { sessionHome: `${SESSION_HOME_ROOT}/${randomUUID().toUpperCase()}` }, /^sessionHome: /],
    ["a home elsewhere", { sessionHome: `/root/${randomUUID()}` }, /^sessionHome: /],
    ["no home", { sessionHome: "" }, /^sessionHome: missing$/],
    ["a command", { loginCommandKey: "bash" }, /^loginCommandKey: not one of claude, codex, grok$/],
    ["a prototype key", { loginCommandKey: "constructor" }, /^loginCommandKey: /],
    ["another driver", { driverKey: "e2b" }, /^driverKey: not kubernetes$/],
    ["no route", { hostRouteId: "" }, /^hostRouteId: missing$/],
    ["a route with spaces", { hostRouteId: "a b" }, /^hostRouteId: not a route id/],
    ["no company", { companyId: "" }, /^companyId: missing$/],
    ["no lease", { providerLeaseId: undefined }, /^providerLeaseId: missing$/],
  ];
  for (const [name, change, want] of refused) {
    it(`refuses ${name}, naming the field`, () => {
      assert.throws(() => checkOpen({ ...good, ...change } as PluginLoginPtyOpenParams), (err) => err instanceof Error && want.test(err.message));
    });
  }

  it("accepts the host's request and maps each key to its fixed command", () => {
    assert.equal(checkOpen(good).key, "claude");
    assert.deepEqual(LOGIN_COMMANDS.claude, { command: "claude", args: ["setup-token"], homeEnv: "HOME" });
    assert.deepEqual(LOGIN_COMMANDS.codex, { command: "codex", args: ["login", "--device-auth"], homeEnv: "CODEX_HOME" });
    assert.deepEqual(LOGIN_COMMANDS.grok, { command: "grok", args: ["login", "--device-auth"], homeEnv: "GROK_HOME" });
    const e = loginExec("codex", good.sessionHome);
    assert.equal(e.command, "/bin/sh");
    assert.deepEqual(e.args.slice(3), [good.sessionHome, "codex", "login", "--device-auth"], "the home and the command are arguments, not script");
    assert.equal(e.env.CODEX_HOME, good.sessionHome);
  });
});

describe("login terminals", () => {
  it("finds a route closed while it opened, and opens nothing", async () => {
    const sink = new Sink();
    const t = new LoginTerminals(() => sink);
    let go!: () => void;
    const gate = new Promise<void>((r) => (go = r));
    let ran = false;
    const opening = t.open("route-1", C, async () => {
      await gate;
      return () => {
        ran = true;
        return Promise.resolve(0);
      };
    });
    t.close("route-1");
    go();
    await assert.rejects(opening, /^Error: hostRouteId: the login terminal was closed while it opened$/);
    assert.equal(ran, false);
    assert.equal(t.size, 0);
  });

  it("bounds input per call and held input", async () => {
    const sink = new Sink();
    const t = new LoginTerminals(() => sink);
    let end!: (code: number) => void;
    const sid = await t.open("route-b", C, () => Promise.resolve(() => new Promise<number>((r) => (end = r))));
    assert.throws(() => { t.input(sid, "x".repeat(MAX_INPUT_BYTES + 1)); }, /^Error: data: longer than 65536 bytes$/);
    const piece = "y".repeat(MAX_INPUT_BYTES);
    for (let i = 0; i < MAX_QUEUED_INPUT_BYTES / MAX_INPUT_BYTES; i++) t.input(sid, piece);
    assert.throws(() => { t.input(sid, "z"); }, /^Error: data: more than 262144 bytes of input wait for the terminal$/);
    end(0);
    await eventually(() => sink.exits.some((e) => e.hostRouteId === "route-b"), "route-b's exit");
    assert.throws(() => { t.input(sid, "late"); }, /^Error: workerSessionId: no open login terminal with this id$/);
    t.closeAll();
  });

  // Issue 26 item 13: 16 companies at 4 terminals each held all 64 slots for 30 minutes.
  it("shares a worker's slots max-min fair: a company alone uses them all, an arriving one gets its share", async () => {
    assert.equal(MAX_LOGIN_TERMINALS, 64);
    assert.deepEqual([1, 2, 16, 17, 64, 100].map((n) => loginShare(64, n)), [64, 32, 4, 3, 1, 1]);
    let clock = 0;
    const sink = new Sink();
    const t = new LoginTerminals(() => sink, randomUUID, { total: 4, claimMs: 1_000, now: () => clock });
    const ends = new Map<string, (code: number) => void>();
    const open = (route: string, company: string): Promise<string> =>
      t.open(route, company, () => Promise.resolve(() => new Promise<number>((r) => ends.set(route, r))));
    // Alone, a company may hold every slot (before: at most 4 of 64).
    for (let i = 0; i < 4; i++) await open(`c${i}`, C);
    await assert.rejects(open("c4", C), /^Error: companyId: the company holds 4 login terminals, its share of this worker's 4 among 1 companies$/);
    // Another company arrives at a full worker: refused, nothing running stopped; its claim lowers C's share to 2.
    await assert.rejects(open("o0", OTHER), /^Error: hostRouteId: this worker's 4 login terminals are all open; a slot is kept for this company as one frees \(try again shortly\)$/);
    assert.equal(t.size, 4);
    ends.get("c0")?.(0);
    await eventually(() => t.size === 3, "c0's end");
    // The freed slot is OTHER's: C, over its share of 2 among 2 companies, cannot take it back.
    await assert.rejects(open("c5", C), /^Error: companyId: the company holds 3 login terminals, its share of this worker's 4 among 2 companies$/);
    await open("o0", OTHER);
    ends.get("c1")?.(0);
    ends.get("c2")?.(0);
    await eventually(() => t.size === 2, "c1's and c2's ends");
    // Both hold their share now (C 1 of 2, OTHER 1 of 2): each may open one more.
    await open("c6", C);
    await open("o1", OTHER);
    await assert.rejects(open("o2", OTHER), /^Error: companyId: the company holds 2 login terminals, its share of this worker's 4 among 2 companies$/);
    // OTHER gone and its claim lapsed: C alone again may use every slot.
    t.close("o0");
    t.close("o1");
    clock += 1_000;
    await open("c7", C);
    await open("c8", C);
    assert.equal(t.size, 4);
    t.closeAll();
  });

  it("stops a terminal that got no input for LOGIN_IDLE_MS; input re-arms it", async (ctx) => {
    assert.equal(LOGIN_IDLE_MS, 10 * 60_000);
    const sink = new Sink();
    const t = new LoginTerminals(() => sink, randomUUID, { idleMs: 1_000 });
    let io!: TerminalIO;
    ctx.mock.timers.enable({ apis: ["setTimeout"] });
    const sid = await t.open("idle", C, () =>
      Promise.resolve((got: TerminalIO) => {
        io = got;
        return new Promise<number | null>((r) => {
          got.signal.addEventListener("abort", () => { r(null); });
        });
      }),
    );
    ctx.mock.timers.tick(900);
    t.input(sid, "a");
    ctx.mock.timers.tick(900);
    assert.equal(io.signal.aborted, false, "input re-armed the idle stop");
    ctx.mock.timers.tick(100);
    assert.equal(io.signal.aborted, true, "1 s without input stops it");
    ctx.mock.timers.reset();
    await eventually(() => sink.exits.some((e) => e.hostRouteId === "idle"), "the exit");
    assert.deepEqual(sink.exits.find((e) => e.hostRouteId === "idle"), { hostRouteId: "idle", workerSessionId: sid, exitCode: null });
    assert.equal(t.size, 0);
  });

  it("ends a pending read when the queue is returned", async () => {
    const q = new InputQueue();
    const pending = q.next();
    await q.return();
    assert.deepEqual(await pending, { value: undefined, done: true });
    assert.throws(() => { q.push(new Uint8Array(1)); }, /takes no more input/);
  });
});

describe("login pty hooks", () => {
  let env: Env;
  let h: Harnessed;
  const sink = new Sink();
  let bin: string;
  const savedPath = process.env.PATH;
  const homes: string[] = [];
  const cfg = { backend: "pod", streamRunLogs: false };

  before(async () => {
    // The pod's `claude`, as tests/images/claude-stub answers setup-token: a prompt, a line
    // read, where it ran, a saved message.
    bin = mkdtempSync(join(tmpdir(), "kubeclip-loginpty-"));
    writeFileSync(
      join(bin, "claude"),
      '#!/bin/sh\n[ "$1" = setup-token ] || exit 2\nprintf "Paste code here if prompted > "\nread -r code\necho "got=$code home=$HOME cwd=$(pwd) term=$TERM"\necho "Token saved"\nexit 0\n',
    );
    chmodSync(join(bin, "claude"), 0o755);
    process.env.PATH = `${bin}:${savedPath ?? ""}`;
    env = await startEnv();
    h = await harnessed(undefined, { natsUrl: env.server.url });
    Object.defineProperty(h.harness.ctx, "loginPty", { value: sink });
  });
  after(async () => {
    process.env.PATH = savedPath;
    await h.shutdown();
    await env.close();
    rmSync(bin, { recursive: true, force: true });
    for (const d of homes) rmSync(d, { recursive: true, force: true });
  });
  afterEach(() => {
    assert.deepEqual(env.sandbox.invalid.splice(0), []);
  });

  const d = (): Harnessed["plugin"]["definition"] => h.plugin.definition;

  /** A login's lease, as the host acquires it: no agent, no issue, no execution workspace. */
  async function lease(companyId = C): Promise<{ runId: string; providerLeaseId: string }> {
    const runId = newRun();
    const providerLeaseId = `pc-${runId.slice(0, 8)}`;
    env.sandbox.addLease(companyId, runId, providerLeaseId);
    const l = await h.harness.acquireLease({ driverKey: "kubernetes", companyId, environmentId: "env-1", config: { ...cfg, reuseLease: true }, runId, adapterType: "claude_local" });
    assert.equal(l.providerLeaseId, providerLeaseId);
    return { runId, providerLeaseId };
  }

  function openParams(providerLeaseId: string, extra: Partial<PluginLoginPtyOpenParams> = {}): PluginLoginPtyOpenParams {
    const sessionHome = `${SESSION_HOME_ROOT}/${randomUUID()}`;
    homes.push(sessionHome);
    return { hostRouteId: randomUUID(), driverKey: "kubernetes", companyId: C, environmentId: "env-1", providerLeaseId, loginCommandKey: "claude", sessionHome, ...extra };
  }

  const hook = <T>(f: T | undefined): T => {
    assert.ok(f, "hook missing");
    return f;
  };
  const input = (workerSessionId: string, data: string): Promise<void> => hook(d().onLoginPtyInput?.bind(d()))({ workerSessionId, data });
  const stop = (workerSessionId: string): Promise<void> => hook(d().onLoginPtyStop?.bind(d()))({ workerSessionId });

  async function open(p: PluginLoginPtyOpenParams): Promise<string> {
    const r = await d().onLoginPtyOpen?.(p);
    assert.ok(r);
    return r.workerSessionId;
  }

  it("runs claude setup-token on a terminal: output as it comes, input in order, the exit", async () => {
    const { providerLeaseId } = await lease();
    const starts = env.sandbox.startRequests.length;
    const p = openParams(providerLeaseId);
    const sid = await open(p);
    assert.match(sid, /^[0-9a-f-]{36}$/);
    await eventually(() => sink.text(p.hostRouteId).includes("Paste code here if prompted > "), "the prompt");
    const start = env.sandbox.startRequests[starts];
    assert.ok(start);
    assert.deepEqual(start.tty, { rows: 40, cols: 120 });
    assert.equal(start.stdinBytes, -1);
    assert.equal(start.command, "/bin/sh");
    assert.deepEqual((start.args as string[]).slice(3), [p.sessionHome, "claude", "setup-token"]);
    // Typed as the host does: pieces, then a Return, each its own call.
    for (const piece of ["sk-ant-", "oat01-", "typed-secret", "\n"]) await input(sid, piece);
    await eventually(() => sink.exits.some((e) => e.hostRouteId === p.hostRouteId), "the exit");
    assert.deepEqual(sink.exits.find((e) => e.hostRouteId === p.hostRouteId), { hostRouteId: p.hostRouteId, workerSessionId: sid, exitCode: 0 });
    const text = sink.text(p.hostRouteId);
    assert.ok(text.includes(`got=${SECRET_CODE} home=${p.sessionHome} cwd=${p.sessionHome} term=xterm-256color`), text);
    assert.ok(text.includes("Token saved"));
    assert.ok(sink.chunks.filter((c) => c.hostRouteId === p.hostRouteId).every((c) => c.workerSessionId === sid));
    assert.equal(statSync(p.sessionHome).mode & 0o777, 0o700, "the home is its owner's only");
    await assert.rejects(input(sid, "late"), /^Error: workerSessionId: no open login terminal with this id$/);
    assert.deepEqual(await d().onLoginPtyClose?.({ hostRouteId: p.hostRouteId }), { hostRouteId: p.hostRouteId });
    assert.ok(!JSON.stringify(h.harness.logs).includes("typed-secret"), "no input is logged");
    assert.ok(!JSON.stringify(h.harness.logs).includes("Paste code"), "no output is logged");
    assert.ok(h.harness.logs.some((l) => l.message === "login terminal ended" && l.meta?.exitCode === 0));
  });

  it("acquires a login's lease, which binds no agent, as an agent of its own that is never reused", async () => {
    const { runId } = await lease();
    const acq = env.kubeclip.requests.find((q) => q.payload.runId === runId);
    assert.equal(acq?.payload.agentId, `login-${runId}`);
    assert.equal(acq.payload.reuseLease, undefined);
  });

  it("stops the command: idempotent, and the exit says no code", async () => {
    const { providerLeaseId } = await lease();
    const p = openParams(providerLeaseId);
    const sid = await open(p);
    await eventually(() => sink.text(p.hostRouteId).includes("prompted"), "the prompt");
    await stop(sid);
    await stop(sid);
    await eventually(() => sink.exits.some((e) => e.hostRouteId === p.hostRouteId), "the exit");
    assert.equal(sink.exits.find((e) => e.hostRouteId === p.hostRouteId)?.exitCode, null);
    assert.ok(env.sandbox.signals.some((s) => s.signal === "SIGKILL" && s.delivered));
    await stop(sid);
    await stop("nobody");
  });

  it("closes by route id alone: the command is killed and nothing more is sent", async () => {
    const { providerLeaseId } = await lease();
    const p = openParams(providerLeaseId);
    await open(p);
    await eventually(() => sink.text(p.hostRouteId).includes("prompted"), "the prompt");
    const signals = env.sandbox.signals.length;
    assert.deepEqual(await d().onLoginPtyClose?.({ hostRouteId: p.hostRouteId }), { hostRouteId: p.hostRouteId });
    await eventually(() => env.sandbox.signals.slice(signals).some((s) => s.signal === "SIGKILL"), "the kill");
    const sent = sink.chunks.length;
    await eventually(() => [...env.sandbox.execs.values()].every((j) => j.exit !== undefined), "the command's end");
    assert.equal(sink.exits.filter((e) => e.hostRouteId === p.hostRouteId).length, 0, "no exit after a close");
    assert.equal(sink.chunks.length, sent);
    // A close of a route the worker never had (a lost open) is answered all the same.
    assert.deepEqual(await d().onLoginPtyClose?.({ hostRouteId: "never-opened" }), { hostRouteId: "never-opened" });
  });

  it("refuses a lease of another company, and one it does not hold, the same way", async () => {
    const { providerLeaseId } = await lease(OTHER);
    const starts = env.sandbox.startRequests.length;
    const want = /^Error: providerLeaseId: no lease of company 7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13 with this id is held by this plugin worker$/;
    await assert.rejects(open(openParams(providerLeaseId)), want);
    await assert.rejects(open(openParams("pc-nobody")), want);
    assert.equal(env.sandbox.startRequests.length, starts, "nothing ran");
    await assert.rejects(open({ ...openParams(providerLeaseId), companyId: OTHER, sessionHome: "/tmp/x" }), /^Error: sessionHome: /);
    await assert.rejects(open({ ...openParams(providerLeaseId), companyId: OTHER, loginCommandKey: "sh" as "claude" }), /^Error: loginCommandKey: /);
    assert.equal(env.sandbox.startRequests.length, starts, "nothing ran");
  });

  // Issue 26 item 12: the lease book is keyed by company and lease.
  it("keeps a company's lease when another company is answered with the same id and releases it", async () => {
    const { runId, providerLeaseId } = await lease();
    // Another company's acquire answered with this company's lease id (a copied `created`: the
    // fake names a lease after its run id's first 8 characters).
    const foreignRun = `${runId.slice(0, 8)}-ffff-4c1e-9f0b-2a9d7c3e1b44`;
    env.sandbox.addLease(OTHER, foreignRun, providerLeaseId);
    const foreign = await h.harness.acquireLease({ driverKey: "kubernetes", companyId: OTHER, environmentId: "env-1", config: cfg, runId: foreignRun, adapterType: "claude_local" });
    assert.equal(foreign.providerLeaseId, providerLeaseId);
    await h.harness.releaseLease({ driverKey: "kubernetes", companyId: OTHER, environmentId: "env-1", config: cfg, providerLeaseId, leaseMetadata: foreign.metadata });
    const p = openParams(providerLeaseId);
    const sid = await open(p);
    await eventually(() => sink.text(p.hostRouteId).includes("prompted"), "the prompt");
    await stop(sid);
    await eventually(() => sink.exits.some((e) => e.hostRouteId === p.hostRouteId), "the exit");
  });

  it("forgets a released lease", async () => {
    const { runId, providerLeaseId } = await lease();
    await h.harness.releaseLease({ driverKey: "kubernetes", companyId: C, environmentId: "env-1", config: cfg, providerLeaseId, leaseMetadata: { kubeclip: { runId, companyId: C } } });
    await assert.rejects(open(openParams(providerLeaseId)), /^Error: providerLeaseId: no lease of company /);
  });
});
