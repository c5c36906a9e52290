// Native file sync (environmentSyncIn / environmentSyncOut): Paperclip's host hands the plugin
// file mappings instead of moving them as base64 over execute (≤ 4 MiB a call). Each mapping is
// one exec of sandboxd (at /kubeclip/bin/sandboxd in every exec-capable pod) with a tar stream
// on stdin or stdout, over kubeclip's exec protocol (its flow control, failover and budgets):
//
//   sync in   host files → pack (tar.ts) → stdin of `sandboxd untar --root DIR`
//             directory: DIR = targetPath, replaced as the host's own route does (rm -rf, then
//             extract); file: DIR = dirname(targetPath), one entry basename(targetPath) carrying
//             the mapping's mode. Then the operation's postUploadCommands, in order, fail-fast,
//             each run exactly as given: `sh -c <command>`.
//   sync out  stdout of `sandboxd tar --root DIR ... NAME` → Extractor (tar.ts) → host files.
//             The archive comes from the tenant's pod: hostile. The extractor refuses what could
//             write outside the mapping's targetPath, and the operator's bounds (settings
//             maxSyncOutBytes, maxSyncOutFiles) cap what one mapping writes.

import path from "node:path";
import type { PluginEnvironmentSyncResult, PluginSyncOperation } from "@paperclipai/plugin-sdk";
import { Extractor, pack } from "./tar.js";
import { isObject } from "./json.js";
import type { ByteBudget } from "./limiter.js";

/** Where kubeclip puts sandboxd in every exec-capable pod (policy.SandboxdBinary). */
export const SANDBOXD = "/kubeclip/bin/sandboxd";
/** A sync in's journal: its output is one JSON line or one refusal line. */
export const SYNC_IN_JOURNAL_BYTES = 64 << 10;
/**
 * A sync out's journal cap for an archive of at most maxBytes of files: their headers need room
 * beyond that (a quarter more, plus 64 MiB); sandboxd holds it to its --output-bytes-limit.
 * The same figure as kubeclip's Go client (pkg/execclient SyncOut).
 */
export function syncOutJournalBytes(maxBytes: number): number {
  return maxBytes + Math.floor(maxBytes / 4) + (64 << 20);
}
/** How much of a sync command's stderr is held for its error message. */
export const SYNC_STDERR_BYTES = 64 << 10;
/** The most of a failed post-upload command's output quoted in the error (the host's own figure). */
const FAILED_OUTPUT_CHARS = 4_000;

/** One exec on the lease, as sync needs it. */
export interface SyncExec {
  command: string;
  args: string[];
  cwd?: string;
  timeoutMs: number;
  stdinStream?: AsyncIterable<Uint8Array>;
  stdoutSink?: (data: Uint8Array) => Promise<void>;
  /** The exec's journal cap (sync out asks sandboxd for room for a whole archive). */
  maxOutputBytes?: number;
}

export interface SyncExecResult {
  exitCode: number | null;
  timedOut: boolean;
  stdout: string;
  stderr: string;
  metadata: { truncated?: boolean; cancelled?: boolean };
}

export type SyncRunner = (spec: SyncExec) => Promise<SyncExecResult>;

export interface SyncOutBounds {
  maxBytes: number;
  maxFiles: number;
  /** The company's bytes being extracted at once, across its syncs (limiter.ts SYNC_OUT_COMPANY_BYTES). */
  inFlight?: { bytes: ByteBudget; company: string };
}

/** A sync that cannot proceed: names the operation and mapping (never file contents). */
export class SyncError extends Error {
  override name = "SyncError";
}

/** The hook's deadline: each exec gets what is left of it. */
class Budget {
  private readonly end: number;
  constructor(ms: number) {
    this.end = Date.now() + ms;
  }
  left(what: string): number {
    const ms = this.end - Date.now();
    if (ms < 1_000) throw new SyncError(`${what}: the sync's budget ran out`);
    return ms;
  }
}

interface Mapping {
  sourcePath: string;
  targetPath: string;
  kind: "file" | "directory";
  mode?: number;
  exclude: string[];
  followSymlinks: boolean;
}

interface Operation {
  operationId: string;
  files: Mapping[];
  commands: { command: string; cwd?: string; timeoutMs?: number }[];
}

/** A sandbox path: absolute POSIX, normalized, no `..`, no NUL. */
function sandboxPath(v: unknown, field: string): string {
  if (typeof v !== "string" || !v.startsWith("/") || v.includes("\0") || v.split("/").includes("..")) {
    throw new SyncError(`${field}: must be an absolute POSIX path without '..'`);
  }
  return path.posix.normalize(v).replace(/(.)\/$/, "$1");
}

/** A host path: absolute, normalized, no NUL. */
function hostPath(v: unknown, field: string): string {
  if (typeof v !== "string" || !path.isAbsolute(v) || v.includes("\0") || v.split(path.sep).includes("..")) {
    throw new SyncError(`${field}: must be an absolute host path without '..'`);
  }
  return path.normalize(v);
}

/** The operations as the host sent them, checked (the host is trusted, but careless). */
export function readOperations(ops: unknown, direction: "in" | "out"): Operation[] {
  if (!Array.isArray(ops)) throw new SyncError("operations: must be an array");
  const sandbox = direction === "in" ? "targetPath" : "sourcePath";
  return ops.map((raw: unknown, i): Operation => {
    const at = `operations[${i}]`;
    if (!isObject(raw) || typeof raw.operationId !== "string") throw new SyncError(`${at}.operationId: must be a string`);
    if (!Array.isArray(raw.files)) throw new SyncError(`${at}.files: must be an array`);
    const files = raw.files.map((f: unknown, j): Mapping => {
      const fat = `${at}.files[${j}]`;
      if (!isObject(f)) throw new SyncError(`${fat}: must be an object`);
      const m = f;
      if (m.kind !== "file" && m.kind !== "directory") throw new SyncError(`${fat}.kind: must be "file" or "directory"`);
      if (m.mode !== undefined && m.mode !== null && (typeof m.mode !== "number" || !Number.isInteger(m.mode) || m.mode < 0 || m.mode > 0o7777)) {
        throw new SyncError(`${fat}.mode: must be a POSIX mode (0 to 0o7777)`);
      }
      const exclude: unknown = m.exclude ?? [];
      if (!Array.isArray(exclude) || !exclude.every((e): e is string => typeof e === "string" && !e.includes("\0"))) throw new SyncError(`${fat}.exclude: must be an array of globs`);
      const check = (key: "sourcePath" | "targetPath"): string => (key === sandbox ? sandboxPath(m[key], `${fat}.${key}`) : hostPath(m[key], `${fat}.${key}`));
      const mapping: Mapping = {
        sourcePath: check("sourcePath"),
        targetPath: check("targetPath"),
        kind: m.kind,
        exclude,
        followSymlinks: m.followSymlinks === true,
      };
      if (typeof m.mode === "number") mapping.mode = m.mode;
      if (mapping[sandbox] === "/") throw new SyncError(`${fat}.${sandbox}: the sandbox's / is not a sync target`);
      return mapping;
    });
    const cmds: unknown = raw.postUploadCommands ?? [];
    if (!Array.isArray(cmds)) throw new SyncError(`${at}.postUploadCommands: must be an array`);
    if (direction === "out" && cmds.length > 0) throw new SyncError(`${at}.postUploadCommands: only sync in runs commands`);
    const commands = cmds.map((c: unknown, k) => {
      const cat = `${at}.postUploadCommands[${k}]`;
      if (!isObject(c) || typeof c.command !== "string" || c.command === "") throw new SyncError(`${cat}.command: must be a non-empty string`);
      const out: { command: string; cwd?: string; timeoutMs?: number } = { command: c.command };
      if (c.cwd !== undefined && c.cwd !== null) out.cwd = sandboxPath(c.cwd, `${cat}.cwd`);
      if (c.timeoutMs !== undefined && c.timeoutMs !== null) {
        if (typeof c.timeoutMs !== "number" || !Number.isSafeInteger(c.timeoutMs) || c.timeoutMs <= 0) throw new SyncError(`${cat}.timeoutMs: must be a positive integer`);
        out.timeoutMs = c.timeoutMs;
      }
      return out;
    });
    return { operationId: raw.operationId, files, commands };
  });
}

/** Where a sync-in mapping lands: a directory's own path, a file's directory. */
function targetRoot(m: Mapping): string {
  return m.kind === "directory" ? m.targetPath : path.posix.dirname(m.targetPath);
}

function within(p: string, root: string): boolean {
  return p === root || root === "/" || p.startsWith(`${root}/`);
}

/**
 * A post-upload command's cwd: given, it must lie under one of the operation's target roots (the
 * contract's C2, checked again here); absent, the operation's root (the roots' common ancestor:
 * the runtime directory the host stages into), never a process default.
 */
function commandCwd(op: Operation, cwd: string | undefined, field: string): string {
  const roots = op.files.map(targetRoot);
  if (cwd !== undefined) {
    if (!roots.some((r) => within(cwd, r))) throw new SyncError(`${field}.cwd: ${cwd} is outside the operation's target roots`);
    return cwd;
  }
  const first = roots[0];
  if (first === undefined) throw new SyncError(`${field}.cwd: the operation has no files, so no target root to run in`);
  let common = first;
  for (const r of roots.slice(1)) while (!within(r, common)) common = path.posix.dirname(common);
  return common;
}

/** The one line sandboxd writes on stderr when it refuses (`untar: <entry>: <reason>`), bounded. */
function reason(r: SyncExecResult): string {
  const line = r.stderr.trim().split("\n").at(-1)?.trim() ?? "";
  if (r.metadata.cancelled) return "cancelled (the lease is being released)";
  if (r.timedOut) return "timed out";
  return line !== "" ? line.slice(0, 1_000) : `exit code ${r.exitCode ?? "none"}`;
}

function tail(text: string): string {
  const t = text.trim();
  return t.length <= FAILED_OUTPUT_CHARS ? t : `...[truncated]\n${t.slice(-FAILED_OUTPUT_CHARS)}`;
}

/** sandboxd untar's success line, `{"files":N,"bytes":N}`. */
function untarCounts(stdout: string, what: string): { files: number; bytes: number } {
  let v: unknown;
  try {
    v = JSON.parse(stdout.trim().split("\n").at(-1) ?? "");
  } catch {
    throw new SyncError(`${what}: sandboxd untar answered no counts`);
  }
  if (!isObject(v) || !Number.isSafeInteger(v.files) || !Number.isSafeInteger(v.bytes)) throw new SyncError(`${what}: sandboxd untar answered no counts`);
  return { files: v.files as number, bytes: v.bytes as number };
}

/** environmentSyncIn: every operation in order, each mapping one exec, then its commands. */
export async function syncIn(rawOps: PluginSyncOperation[], run: SyncRunner, budgetMs: number): Promise<PluginEnvironmentSyncResult> {
  const ops = readOperations(rawOps, "in");
  const budget = new Budget(budgetMs);
  const results: PluginEnvironmentSyncResult["operations"] = [];
  for (const [i, op] of ops.entries()) {
    let files = 0;
    let bytes = 0;
    for (const [j, m] of op.files.entries()) {
      const what = `operations[${i}].files[${j}] (${op.operationId}) → ${m.targetPath}`;
      const dir = targetRoot(m);
      const untar = [SANDBOXD, "untar", "--root", dir];
      // A directory is replaced, as the host's base64 route does (rm -rf, mkdir, tar -x); a file
      // is one entry written over its target.
      const spec: SyncExec =
        m.kind === "directory"
          ? { command: "sh", args: ["-c", 'rm -rf -- "$1" && shift && exec "$@"', "sh", dir, ...untar], timeoutMs: budget.left(what), maxOutputBytes: SYNC_IN_JOURNAL_BYTES, stdinStream: pack({ kind: "directory", path: m.sourcePath, exclude: m.exclude, followSymlinks: m.followSymlinks }) }
          : { command: SANDBOXD, args: untar.slice(1), timeoutMs: budget.left(what), maxOutputBytes: SYNC_IN_JOURNAL_BYTES, stdinStream: pack({ kind: "file", path: m.sourcePath, name: path.posix.basename(m.targetPath), ...(m.mode !== undefined ? { mode: m.mode } : {}) }) };
      const r = await run(spec).catch((err: unknown) => {
        throw new SyncError(`sync in ${what}: ${err instanceof Error ? err.message : String(err)}`);
      });
      if (r.exitCode !== 0 || r.timedOut || r.metadata.cancelled) throw new SyncError(`sync in ${what}: ${reason(r)}`);
      const counts = untarCounts(r.stdout, `sync in ${what}`);
      files += counts.files;
      bytes += counts.bytes;
    }
    for (const [k, c] of op.commands.entries()) {
      const field = `operations[${i}].postUploadCommands[${k}]`;
      const cwd = commandCwd(op, c.cwd, field);
      // Exactly as given: the contract forbids rewriting or appending to it.
      const r = await run({ command: "sh", args: ["-c", c.command], cwd, timeoutMs: c.timeoutMs ?? budget.left(field) });
      if (r.exitCode !== 0 || r.timedOut || r.metadata.cancelled) {
        const out = [r.stderr.trim() && `stderr: ${tail(r.stderr)}`, r.stdout.trim() && `stdout: ${tail(r.stdout)}`].filter(Boolean).join("\n");
        const why = r.metadata.cancelled ? " (cancelled: the lease is being released)" : r.timedOut ? " (timed out)" : "";
        throw new SyncError(`${field} (${op.operationId}) failed with exit code ${r.exitCode ?? "null"}${why}${out ? `:\n${out}` : ""}`);
      }
    }
    results.push({ operationId: op.operationId, filesTransferred: files, bytesTransferred: bytes });
  }
  return { operations: results };
}

/** environmentSyncOut: every operation in order, each mapping one exec whose stdout is a tar. */
export async function syncOut(rawOps: PluginSyncOperation[], run: SyncRunner, bounds: SyncOutBounds, budgetMs: number): Promise<PluginEnvironmentSyncResult> {
  const ops = readOperations(rawOps, "out");
  const budget = new Budget(budgetMs);
  const results: PluginEnvironmentSyncResult["operations"] = [];
  for (const [i, op] of ops.entries()) {
    let files = 0;
    let bytes = 0;
    for (const [j, m] of op.files.entries()) {
      const what = `operations[${i}].files[${j}] (${op.operationId}) ${m.sourcePath}`;
      const base = path.posix.basename(m.sourcePath);
      const x = new Extractor({
        root: m.kind === "directory" ? m.targetPath : path.dirname(m.targetPath),
        maxBytes: bounds.maxBytes,
        maxEntries: bounds.maxFiles,
        bytesSetting: "settings.maxSyncOutBytes",
        entriesSetting: "settings.maxSyncOutFiles",
        ...(bounds.inFlight ? { inFlight: bounds.inFlight } : {}),
        ...(m.kind === "file" ? { file: { entry: base, target: m.targetPath, ...(m.mode !== undefined ? { mode: m.mode } : {}) } } : m.mode !== undefined ? { mode: m.mode } : {}),
      });
      const args =
        m.kind === "directory"
          ? ["tar", "--root", m.sourcePath, ...m.exclude.flatMap((e) => ["--exclude", e]), ...(m.followSymlinks ? ["--follow-symlinks"] : []), "--max-bytes", String(bounds.maxBytes), "."]
          : ["tar", "--root", path.posix.dirname(m.sourcePath), "--max-bytes", String(bounds.maxBytes), base];
      try {
        const r = await run({ command: SANDBOXD, args, timeoutMs: budget.left(what), stdoutSink: (d) => x.write(d), maxOutputBytes: syncOutJournalBytes(bounds.maxBytes) });
        if (r.exitCode !== 0 || r.timedOut || r.metadata.cancelled) throw new SyncError(`sync out ${what}: ${reason(r)}`);
        if (r.metadata.truncated) throw new SyncError(`sync out ${what}: the archive passed sandboxd's output cap and was cut`);
        const counts = await x.end();
        files += counts.files;
        bytes += counts.bytes;
      } catch (err) {
        await x.abort();
        if (err instanceof SyncError) throw err;
        throw new SyncError(`sync out ${what}: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    results.push({ operationId: op.operationId, filesTransferred: files, bytesTransferred: bytes });
  }
  return { operations: results };
}
