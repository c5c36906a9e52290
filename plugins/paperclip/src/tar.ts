// A minimal streaming tar (POSIX ustar, with PAX records where ustar cannot hold a field), for
// native sync (sync.ts): Node has none built in.
//
//   pack       host files → a tar stream, read a piece at a time (sync in: never a whole tree in
//              memory); what sandboxd untar reads on stdin
//   Extractor  a tar stream → files under a host directory (sync out). The stream comes from a
//              tenant's pod: it is hostile. Every entry is checked before anything is written,
//              nothing is written outside the root, and the first refusal is an ArchiveError
//              naming the entry; on a refusal everything the extraction created is removed.
//
// What the extractor refuses: absolute names, `..`, names over 4096 bytes, NUL in a name, PAX
// headers over 1 MiB or of more than 256 records, more than 2 MiB of headers before one entry
// (PAX, global PAX, GNU long names: a flood of them), a header with no entry after it,
// hardlinks, device nodes, fifos, sparse and unknown entry types, a directory or link that
// carries data, a symlink whose resolution leaves the root at any step (resolveLink: lexical and
// through every link, dangling or not), an entry whose parent is not a real directory (never
// written through a link), more regular-file bytes or more entries than the operator's bounds.
// Symlinks that stay inside the root are kept as links (tar's behaviour); they are created after
// every other entry, so no entry of the archive is written through one.
//
// sandboxd's Go extractor (pkg/sandboxd/untar.go) follows the same rules: testdata/archives at
// the repository's root holds the archives both are tested with, and the outcome each must give.

import { constants, type Dirent } from "node:fs";
import { lstat, mkdir, open, readdir, readlink, rename, rm, stat, symlink, type FileHandle } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import path from "node:path";
import type { ByteBudget } from "./limiter.js";

export const BLOCK = 512;
/** Longest entry name or link target accepted (PATH_MAX). */
export const MAX_NAME_BYTES = 4096;
/** Largest PAX extended header accepted (sandboxd's bound too). */
export const MAX_PAX_BYTES = 1 << 20;
/** The most records of one PAX header, local or global (sandboxd's bound too). */
export const MAX_PAX_RECORDS = 256;
/**
 * The most header bytes before one entry, blocks counted: its PAX header, global PAX headers and
 * GNU long names and links (sandboxd's bound too). One PAX header of MAX_PAX_BYTES fits; a flood
 * of headers is refused here, not held: what one entry's headers set is dropped at the next entry.
 */
export const MAX_ENTRY_META_BYTES = 2 << 20;
/** The most links followed resolving one symlink (Linux's own limit). */
export const MAX_LINK_HOPS = 40;
/** How much of a host file pack reads at a time. */
export const READ_BYTES = 256 << 10;
/** Names tar leaves out of every archive the host builds (`--exclude ._*`: macOS sidecars). */
export const ALWAYS_EXCLUDED = ["._*"];

/** A refusal of one entry: the message names it. */
export class ArchiveError extends Error {
  override name = "ArchiveError";
  readonly entry: string;
  constructor(entry: string, reason: string) {
    super(`${entry}: ${reason}`);
    this.entry = entry;
  }
}

// ---- globs: tar's --exclude ----

/**
 * A matcher for tar's `--exclude` patterns as GNU tar applies them by default (what the host's
 * base64 route runs): wildcards (`*` and `?` also match `/`, `[...]`, `\` escapes), unanchored (a
 * pattern matches the whole relative name or any part of it starting after a `/`), and a match
 * of a directory excludes everything under it.
 */
export function excludeMatcher(patterns: readonly string[]): (relative: string) => boolean {
  const res = patterns.filter((p) => p !== "").map((p) => new RegExp(`^(?:.*/)?${globSource(p)}(?:/.*)?$`, "s"));
  return (relative) => res.some((re) => re.test(relative));
}

function globSource(glob: string): string {
  let out = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob.charAt(i);
    if (c === "*") out += ".*";
    else if (c === "?") out += ".";
    else if (c === "\\" && i + 1 < glob.length) out += escapeRe(glob.charAt(++i));
    else if (c === "[") {
      const end = glob.indexOf("]", i + 2);
      if (end < 0) {
        out += "\\[";
        continue;
      }
      let body = glob.slice(i + 1, end);
      const negate = body.startsWith("!") || body.startsWith("^");
      if (negate) body = body.slice(1);
      out += `[${negate ? "^" : ""}${body.replace(/[\\\]^]/g, "\\$&")}]`;
      i = end;
    } else out += escapeRe(c);
  }
  return out;
}

function escapeRe(c: string): string {
  return c.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}

// ---- headers ----

interface HeaderFields {
  name: string;
  mode: number;
  size: number;
  mtime: number;
  /** The typeflag: "0" file, "2" symlink, "5" directory, "x" PAX (tests write others). */
  type: string;
  linkname?: string;
}

const USTAR_MAX_SIZE = 0o77777777777;

function octal(buf: Buffer, offset: number, width: number, value: number): void {
  buf.write(`${value.toString(8).padStart(width - 1, "0")}\0`, offset, width, "ascii");
}

function header(h: HeaderFields, name: Buffer, prefix: Buffer, linkname: Buffer): Buffer {
  const b = Buffer.alloc(BLOCK);
  name.copy(b, 0);
  octal(b, 100, 8, h.mode & 0o7777);
  octal(b, 108, 8, 0);
  octal(b, 116, 8, 0);
  octal(b, 124, 12, h.size);
  octal(b, 136, 12, Math.max(0, Math.floor(h.mtime)));
  b.write(h.type, 156, 1, "ascii");
  linkname.copy(b, 157);
  b.write("ustar\0" + "00", 257, 8, "ascii");
  prefix.copy(b, 345);
  b.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of b) sum += byte;
  b.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, 8, "ascii");
  return b;
}

/** One PAX record, `<len> <key>=<value>\n`, its length counting its own digits. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const n = Buffer.byteLength(body);
  let len = n + String(n).length;
  if (String(len).length !== String(n).length) len = n + String(len).length;
  return `${len}${body}`;
}

/** The blocks for one entry's header: a PAX header first when ustar cannot hold a field. */
export function entryHeader(h: HeaderFields): Buffer[] {
  const records: string[] = [];
  let name = Buffer.from(h.name);
  let prefix = Buffer.alloc(0);
  const ascii = /^[\x20-\x7e]*$/.test(h.name);
  if (!ascii || name.byteLength > 100) {
    const cut = ascii ? splitUstar(h.name) : undefined;
    if (cut) {
      prefix = Buffer.from(cut[0]);
      name = Buffer.from(cut[1]);
    } else {
      records.push(paxRecord("path", h.name));
      name = Buffer.from(asciiStub(h.name, 100));
    }
  }
  let link = Buffer.from(h.linkname ?? "");
  if (link.byteLength > 100 || !/^[\x20-\x7e]*$/.test(h.linkname ?? "")) {
    records.push(paxRecord("linkpath", h.linkname ?? ""));
    link = Buffer.alloc(0);
  }
  let size = h.size;
  if (size > USTAR_MAX_SIZE) {
    records.push(paxRecord("size", String(size)));
    size = 0;
  }
  const main = header({ ...h, size }, name, prefix, link);
  if (records.length === 0) return [main];
  const data = Buffer.from(records.join(""));
  const pax = header({ name: "PaxHeader", mode: 0o644, size: data.byteLength, mtime: h.mtime, type: "x" }, Buffer.from(asciiStub(`PaxHeaders/${h.name}`, 100)), Buffer.alloc(0), Buffer.alloc(0));
  return [pax, data, Buffer.alloc(pad(data.byteLength)), main];
}

/** prefix/name for ustar: the name's last ≤100 bytes after a `/`, the rest ≤155. */
function splitUstar(name: string): [string, string] | undefined {
  for (let i = name.length - 1; i > 0; i--) {
    if (name[i] !== "/") continue;
    const p = name.slice(0, i);
    const n = name.slice(i + 1);
    if (n.length > 0 && n.length <= 100 && p.length <= 155) return [p, n];
    if (n.length > 100) return undefined;
  }
  return undefined;
}

function asciiStub(name: string, max: number): string {
  return name.replace(/[^\x20-\x7e]/g, "_").slice(-max);
}

function pad(n: number): number {
  return (BLOCK - (n % BLOCK)) % BLOCK;
}

// ---- pack ----

export interface PackStats {
  /** Regular files written. */
  files: number;
  /** Their bytes. */
  bytes: number;
}

export type PackSource =
  /** One host file as one entry named `name`, with `mode` when given (else the file's). */
  | { kind: "file"; path: string; name: string; mode?: number }
  /** A host directory's entries (never the directory itself), names relative to it. */
  | { kind: "directory"; path: string; exclude?: readonly string[]; followSymlinks?: boolean };

/**
 * The tar stream of src, a piece at a time: headers, then each file's bytes in READ_BYTES reads,
 * then the end-of-archive blocks. stats counts regular files and their bytes as they go. A file
 * that changes size while it is read fails the pack (the header already named its size).
 */
export async function* pack(src: PackSource, stats: PackStats = { files: 0, bytes: 0 }): AsyncGenerator<Uint8Array> {
  if (src.kind === "file") {
    const st = await stat(src.path);
    if (!st.isFile()) throw new ArchiveError(src.path, "is not a regular file");
    yield* fileEntry(src.path, src.name, src.mode ?? st.mode, st.size, st.mtimeMs / 1000, stats);
  } else {
    const excluded = excludeMatcher([...ALWAYS_EXCLUDED, ...(src.exclude ?? [])]);
    const st = await stat(src.path);
    if (!st.isDirectory()) throw new ArchiveError(src.path, "is not a directory");
    yield* walk(src.path, "", excluded, src.followSymlinks === true, new Set([`${st.dev}:${st.ino}`]), stats);
  }
  yield Buffer.alloc(2 * BLOCK);
}

async function* walk(
  root: string,
  rel: string,
  excluded: (relative: string) => boolean,
  follow: boolean,
  ancestors: Set<string>,
  stats: PackStats,
): AsyncGenerator<Uint8Array> {
  const dir = path.join(root, rel);
  const entries: Dirent[] = await readdir(dir, { withFileTypes: true });
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    const name = rel === "" ? e.name : `${rel}/${e.name}`;
    if (excluded(name)) continue;
    const full = path.join(root, name);
    let st = await lstat(full);
    if (follow && st.isSymbolicLink()) {
      // Followed only while every step stays inside the source: never a host file outside it.
      const where = await resolveLink(root, name, await readlink(full));
      if (where !== "inside") throw new ArchiveError(name, `a symlink that ${where === "loop" ? "loops" : "leads out of the source"} (followSymlinks): refused`);
      const target = await stat(full).catch(() => undefined);
      if (!target) continue; // a dangling link, followed: nothing to send (tar -h warns and skips it)
      st = target;
    }
    if (st.isSymbolicLink()) {
      const target = await readlink(full);
      for (const b of entryHeader({ name, mode: 0o777, size: 0, mtime: st.mtimeMs / 1000, type: "2", linkname: target })) yield b;
    } else if (st.isDirectory()) {
      const id = `${st.dev}:${st.ino}`;
      if (ancestors.has(id)) throw new ArchiveError(name, "a symlink loop (followSymlinks)");
      for (const b of entryHeader({ name: `${name}/`, mode: st.mode, size: 0, mtime: st.mtimeMs / 1000, type: "5" })) yield b;
      ancestors.add(id);
      yield* walk(root, name, excluded, follow, ancestors, stats);
      ancestors.delete(id);
    } else if (st.isFile()) {
      yield* fileEntry(full, name, st.mode, st.size, st.mtimeMs / 1000, stats);
    }
    // Sockets, fifos and devices on the host are not sent.
  }
}

async function* fileEntry(file: string, name: string, mode: number, size: number, mtime: number, stats: PackStats): AsyncGenerator<Uint8Array> {
  const fh = await open(file, constants.O_RDONLY);
  try {
    for (const b of entryHeader({ name, mode, size, mtime, type: "0" })) yield b;
    let left = size;
    while (left > 0) {
      const buf = Buffer.allocUnsafe(Math.min(READ_BYTES, left));
      const { bytesRead } = await fh.read(buf, 0, buf.byteLength, size - left);
      if (bytesRead === 0) throw new ArchiveError(name, `shrank while it was read (${size - left} of ${size} bytes)`);
      left -= bytesRead;
      yield buf.subarray(0, bytesRead);
    }
    if (pad(size) > 0) yield Buffer.alloc(pad(size));
  } finally {
    await fh.close();
  }
  stats.files++;
  stats.bytes += size;
}

// ---- extract ----

export interface ExtractOptions {
  /** The host directory entries land under (created if missing). */
  root: string;
  /** The most regular-file bytes (sum of sizes) accepted. */
  maxBytes: number;
  /** The most entries (files, directories, links) accepted. */
  maxEntries: number;
  /** Names the bound in refusals, e.g. "settings.maxSyncOutBytes". */
  bytesSetting: string;
  entriesSetting: string;
  /**
   * A file mapping: the archive must hold exactly one regular file named `entry`, written to
   * `target` (not under root) with `mode` when given.
   */
  file?: { entry: string; target: string; mode?: number };
  /** The mode of every regular file (a directory mapping's `mode`); else the entry's, without setuid/setgid/sticky and group/other write. */
  mode?: number;
  /**
   * The company's bytes being extracted at once, all its extractions together (limiter.ts
   * SYNC_OUT_COMPANY_BYTES): each regular file takes its size before a byte is written, and
   * the extraction gives it all back when it ends or aborts.
   */
  inFlight?: { bytes: ByteBudget; company: string };
}

export interface ExtractResult {
  files: number;
  bytes: number;
}

type State =
  | { kind: "header" }
  | { kind: "pax"; left: number; global: boolean; parts: Buffer[]; entry: string }
  | { kind: "longname"; left: number; link: boolean; parts: Buffer[] }
  | { kind: "data"; left: number; padding: number; fh: FileHandle | undefined; temp: string; final: string; mode: number; name: string }
  | { kind: "end" };

/**
 * Writes a tar stream under root as it arrives (write each chunk, awaiting it, then end). Any
 * refusal throws ArchiveError naming the entry; the caller then calls abort, which removes what
 * this extraction created. Memory: one header, a PAX header (≤ 1 MiB) and the chunk in hand.
 */
export class Extractor {
  private readonly opts: ExtractOptions;
  private state: State = { kind: "header" };
  private pending: Buffer = Buffer.alloc(0);
  private zeroBlocks = 0;
  /** The last PAX header's records since the last entry (a PAX header replaces the one before). */
  private pax: Map<string, string> = new Map();
  private longName: string | undefined;
  private longLink: string | undefined;
  /** A PAX or GNU long-name header waits for its entry. */
  private localPending = false;
  /** Header bytes since the last entry (MAX_ENTRY_META_BYTES). */
  private metaBytes = 0;
  private entries = 0;
  private files = 0;
  private bytes = 0;
  private fileDone = false;
  /** What this extraction made, in order: removed in reverse by abort. */
  private readonly created: { path: string; dir: boolean }[] = [];
  private readonly links: { name: string; target: string }[] = [];
  private rootReady = false;
  private failed: Error | undefined;
  /** Bytes taken from opts.inFlight. */
  private inFlight = 0;

  constructor(opts: ExtractOptions) {
    this.opts = opts;
  }

  async write(chunk: Uint8Array): Promise<void> {
    if (this.failed) throw this.failed;
    try {
      await this.consume(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
    } catch (err) {
      this.failed = err instanceof Error ? err : new Error(String(err));
      throw err;
    }
  }

  /** The archive ended: checks it was whole, creates the links, and returns the counts. */
  async end(): Promise<ExtractResult> {
    if (this.failed) throw this.failed;
    try {
      // Whole entries only: the end-of-archive blocks, or at least a header boundary.
      if (this.state.kind !== "end" && !(this.state.kind === "header" && this.pending.byteLength === 0)) {
        throw new ArchiveError(this.currentName(), "the archive ended in the middle of an entry");
      }
      if (this.localPending) throw new ArchiveError("(archive)", "a PAX or GNU long-name header with no entry after it");
      if (this.opts.file && !this.fileDone) throw new ArchiveError(this.opts.file.entry, "not in the archive");
      await this.ensureRoot();
      await this.makeLinks();
      return { files: this.files, bytes: this.bytes };
    } catch (err) {
      this.failed = err instanceof Error ? err : new Error(String(err));
      throw err;
    } finally {
      this.giveBack();
    }
  }

  private giveBack(): void {
    if (this.opts.inFlight && this.inFlight > 0) this.opts.inFlight.bytes.give(this.opts.inFlight.company, this.inFlight);
    this.inFlight = 0;
  }

  /** Removes everything this extraction created (after a refusal or a failed transfer). */
  async abort(): Promise<void> {
    this.giveBack();
    const s = this.state;
    if (s.kind === "data") {
      await s.fh?.close().catch(() => undefined);
      await rm(s.temp, { force: true }).catch(() => undefined);
    }
    for (const c of [...this.created].reverse()) {
      await rm(c.path, { force: true, recursive: c.dir }).catch(() => undefined);
    }
    this.created.length = 0;
  }

  private currentName(): string {
    const s = this.state;
    return s.kind === "data" ? s.name : s.kind === "pax" ? s.entry : "(archive)";
  }

  private async consume(chunk: Buffer): Promise<void> {
    let buf = this.pending.byteLength > 0 ? Buffer.concat([this.pending, chunk]) : chunk;
    this.pending = Buffer.alloc(0);
    while (buf.byteLength > 0) {
      const s = this.state;
      switch (s.kind) {
        case "end":
          return; // after the end-of-archive blocks: ignored
        case "header": {
          if (buf.byteLength < BLOCK) {
            this.pending = Buffer.from(buf);
            return;
          }
          const block = buf.subarray(0, BLOCK);
          buf = buf.subarray(BLOCK);
          await this.header(block);
          break;
        }
        case "pax":
        case "longname": {
          const take = Math.min(s.left, buf.byteLength);
          s.parts.push(Buffer.from(buf.subarray(0, take)));
          s.left -= take;
          buf = buf.subarray(take);
          if (s.left === 0) {
            if (s.kind === "pax") this.paxDone(s.parts, s.global, s.entry);
            else this.longDone(s.parts, s.link);
          }
          break;
        }
        case "data": {
          if (s.left > 0) {
            const take = Math.min(s.left, buf.byteLength);
            if (s.fh) await writeAll(s.fh, buf.subarray(0, take));
            s.left -= take;
            buf = buf.subarray(take);
          }
          if (s.left === 0 && s.padding > 0) {
            const skip = Math.min(s.padding, buf.byteLength);
            s.padding -= skip;
            buf = buf.subarray(skip);
          }
          if (s.left === 0 && s.padding === 0) await this.fileDoneWriting(s);
          break;
        }
      }
    }
    // A file whose bytes all arrived with the header's block: finish it now.
    const s = this.state;
    if (s.kind === "data" && s.left === 0 && s.padding === 0) await this.fileDoneWriting(s);
  }

  private async header(block: Buffer): Promise<void> {
    if (block.every((b) => b === 0)) {
      if (++this.zeroBlocks === 2) this.state = { kind: "end" };
      return;
    }
    if (this.zeroBlocks > 0) throw new ArchiveError("(archive)", "a lone zero block inside the archive");
    const rawName = cstr(block, 0, 100);
    let sum = 0;
    for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : (block[i] ?? 0);
    const want = parseNumber(block, 148, 8);
    if (want !== sum) throw new ArchiveError(safeName(rawName), "not a tar header (bad checksum)");
    const type = String.fromCharCode(block[156] ?? 0);
    const size = parseNumber(block, 124, 12);
    if (size === undefined || size < 0) throw new ArchiveError(safeName(rawName), "bad size field");
    const magic = block.subarray(257, 263).toString("latin1");
    const prefix = magic === "ustar\0" ? cstr(block, 345, 155) : "";
    const headerName = prefix ? `${prefix}/${rawName}` : rawName;

    if (type === "x" || type === "g") {
      if (size > MAX_PAX_BYTES) throw new ArchiveError(safeName(headerName), `a PAX header of ${size} bytes (at most ${MAX_PAX_BYTES})`);
      this.countMeta(size, headerName);
      this.state = { kind: "pax", left: size + pad(size), global: type === "g", parts: [], entry: safeName(headerName) };
      if (size === 0) this.paxDone([], type === "g", headerName);
      return;
    }
    if (type === "L" || type === "K") {
      if (size > MAX_NAME_BYTES + 1) throw new ArchiveError(safeName(headerName), `a long ${type === "K" ? "link" : "name"} of ${size} bytes (at most ${MAX_NAME_BYTES})`);
      this.countMeta(size, headerName);
      this.state = { kind: "longname", left: size + pad(size), link: type === "K", parts: [] };
      if (size === 0) this.longDone([], type === "K");
      return;
    }

    const pax = this.pax;
    this.pax = new Map();
    // A GNU long name wins over a PAX path, as archive/tar (sandboxd) reads them.
    const nameRaw = this.longName ?? pax.get("path") ?? headerName;
    const linkRaw = this.longLink ?? pax.get("linkpath") ?? cstr(block, 157, 100);
    this.longName = undefined;
    this.longLink = undefined;
    this.localPending = false;
    this.metaBytes = 0;
    if (pax.size > MAX_PAX_RECORDS) throw new ArchiveError(safeName(nameRaw), `a PAX header of more than ${MAX_PAX_RECORDS} records: refused`);
    for (const key of pax.keys()) if (key.startsWith("GNU.sparse.")) throw new ArchiveError(safeName(nameRaw), "a sparse file: refused");
    let entrySize = size;
    const paxSize = pax.get("size");
    if (paxSize !== undefined) {
      if (!/^\d{1,16}$/.test(paxSize)) throw new ArchiveError(safeName(nameRaw), "bad PAX size");
      entrySize = Number(paxSize);
    }
    const name = checkName(nameRaw);
    if (++this.entries > this.opts.maxEntries) {
      throw new ArchiveError(name, `more than ${this.opts.maxEntries} entries (${this.opts.entriesSetting})`);
    }
    // An old archive's regular file named with a trailing slash is a directory (archive/tar's reading).
    const kind = type === "\0" && nameRaw.endsWith("/") ? "5" : type;
    if ((kind === "5" || kind === "2") && entrySize !== 0) throw new ArchiveError(name, `a ${kind === "5" ? "directory" : "symlink"} that carries ${entrySize} bytes of data: refused`);
    switch (kind) {
      case "0":
      case "\0":
      case "7":
        await this.regular(name, entrySize, parseNumber(block, 100, 8) ?? 0o644);
        return;
      case "5":
        await this.directory(name);
        this.state = { kind: "header" };
        return;
      case "2":
        this.symlinkEntry(name, linkRaw);
        this.state = { kind: "header" };
        return;
      case "1":
        throw new ArchiveError(name, "a hardlink: hardlinks are refused");
      case "3":
      case "4":
        throw new ArchiveError(name, "a device node: refused");
      case "6":
        throw new ArchiveError(name, "a fifo: refused");
      case "S":
        throw new ArchiveError(name, "a sparse file: refused");
      default:
        throw new ArchiveError(name, `entry type ${JSON.stringify(type)} is refused`);
    }
  }

  /** Counts a header before an entry against MAX_ENTRY_META_BYTES, its blocks counted. */
  private countMeta(size: number, headerName: string): void {
    this.metaBytes += BLOCK + size + pad(size);
    if (this.metaBytes > MAX_ENTRY_META_BYTES) {
      throw new ArchiveError(safeName(headerName), `headers before one entry pass ${MAX_ENTRY_META_BYTES} bytes (PAX, global PAX and GNU long-name headers): refused`);
    }
  }

  /**
   * A PAX header read: a local one replaces the records before it (its entry's); a global one is
   * checked and dropped (defaults this extractor has no use for), and so is any header before it
   * that waited for an entry, as archive/tar reads them.
   */
  private paxDone(parts: Buffer[], global: boolean, entry: string): void {
    this.state = { kind: "header" };
    const records = parsePax(Buffer.concat(parts), entry);
    if (global) {
      if (records.size > MAX_PAX_RECORDS) throw new ArchiveError(safeName(entry), `a global PAX header of more than ${MAX_PAX_RECORDS} records: refused`);
      this.pax = new Map();
      this.longName = undefined;
      this.longLink = undefined;
      this.localPending = false;
      return;
    }
    this.pax = records;
    this.localPending = true;
  }

  private longDone(parts: Buffer[], link: boolean): void {
    this.state = { kind: "header" };
    this.localPending = true;
    const v = cstr(Buffer.concat(parts), 0, MAX_NAME_BYTES + 1);
    if (link) this.longLink = v;
    else this.longName = v;
  }
  private async ensureRoot(): Promise<void> {
    if (this.rootReady) return;
    const dir = this.opts.file ? path.dirname(this.opts.file.target) : this.opts.root;
    await mkdir(dir, { recursive: true });
    this.rootReady = true;
  }

  /** Makes each parent of rel under root a real directory: never through a link or over a file. */
  private async parents(rel: string): Promise<void> {
    await this.ensureRoot();
    const parts = rel.split("/");
    let cur = this.opts.root;
    let sofar = "";
    for (const part of parts.slice(0, -1)) {
      cur = path.join(cur, part);
      sofar = sofar ? `${sofar}/${part}` : part;
      const st = await lstat(cur).catch(() => undefined);
      if (!st) {
        await mkdir(cur, { mode: 0o755 });
        this.created.push({ path: cur, dir: true });
      } else if (!st.isDirectory()) {
        throw new ArchiveError(rel, `its parent ${sofar} is ${st.isSymbolicLink() ? "a symlink" : "not a directory"}: nothing is written through it`);
      }
    }
  }

  private async directory(name: string): Promise<void> {
    if (this.opts.file) throw new ArchiveError(name, "a directory in a file mapping's archive");
    if (name === "") return; // the root itself
    await this.parents(name);
    const full = path.join(this.opts.root, name);
    const st = await lstat(full).catch(() => undefined);
    if (!st) {
      await mkdir(full, { mode: 0o755 });
      this.created.push({ path: full, dir: true });
    } else if (!st.isDirectory()) {
      throw new ArchiveError(name, `exists and is ${st.isSymbolicLink() ? "a symlink" : "not a directory"}`);
    }
  }

  private async regular(name: string, size: number, headerMode: number): Promise<void> {
    if (this.bytes + size > this.opts.maxBytes) {
      throw new ArchiveError(name, `${size} bytes would pass the bound of ${this.opts.maxBytes} bytes (${this.opts.bytesSetting})`);
    }
    const budget = this.opts.inFlight;
    if (budget && size > 0) {
      if (!budget.bytes.take(budget.company, size)) {
        throw new ArchiveError(
          name,
          `${size} bytes would pass company ${budget.company}'s sync-out budget in flight: ${budget.bytes.held(budget.company)} of ${budget.bytes.keyLimit} bytes are being extracted by its other syncs (SYNC_OUT_COMPANY_BYTES); try again when they end`,
        );
      }
      this.inFlight += size;
    }
    let final: string;
    let mode: number;
    const file = this.opts.file;
    if (file) {
      if (this.fileDone || name !== file.entry) throw new ArchiveError(name, `a file mapping's archive holds only ${file.entry}`);
      await this.ensureRoot();
      final = file.target;
      mode = file.mode ?? (headerMode & 0o755) | 0o600;
    } else {
      if (name === "") throw new ArchiveError("(root)", "a regular file in place of the root");
      await this.parents(name);
      final = path.join(this.opts.root, name);
      mode = this.opts.mode ?? (headerMode & 0o755) | 0o600;
    }
    const existing = await lstat(final).catch(() => undefined);
    if (existing?.isDirectory()) throw new ArchiveError(name, "exists as a directory");
    const temp = path.join(path.dirname(final), `.${path.basename(final).slice(0, 64)}.kubeclip-${randomBytes(6).toString("hex")}`);
    // Created with its final mode (no wider window), never through a link (O_NOFOLLOW, O_EXCL).
    const fh = await open(temp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, mode);
    this.bytes += size;
    this.state = { kind: "data", left: size, padding: pad(size), fh, temp, final, mode, name };
  }

  private async fileDoneWriting(s: Extract<State, { kind: "data" }>): Promise<void> {
    this.state = { kind: "header" };
    const fh = s.fh;
    if (!fh) return;
    try {
      await fh.chmod(s.mode); // exact, whatever the umask took away
    } finally {
      await fh.close();
    }
    const existed = await lstat(s.final).then(() => true, () => false);
    await rename(s.temp, s.final);
    if (!existed) this.created.push({ path: s.final, dir: false });
    this.files++;
    if (this.opts.file) this.fileDone = true;
  }

  private symlinkEntry(name: string, target: string): void {
    if (this.opts.file) throw new ArchiveError(name, "a symlink in a file mapping's archive");
    if (name === "") throw new ArchiveError("(root)", "a symlink in place of the root");
    if (target === "" || target.includes("\0")) throw new ArchiveError(name, "a symlink with an empty or NUL target");
    if (Buffer.byteLength(target) > MAX_NAME_BYTES) throw new ArchiveError(name, `a symlink target over ${MAX_NAME_BYTES} bytes`);
    if (target.startsWith("/")) throw new ArchiveError(name, "a symlink to an absolute path: refused (it leads out of the target)");
    const resolved = path.posix.normalize(path.posix.join(path.posix.dirname(name), target));
    if (resolved === ".." || resolved.startsWith("../")) throw new ArchiveError(name, "a symlink that leads out of the target: refused");
    this.links.push({ name, target });
  }

  /**
   * Links last: no entry was written through one. Then each is resolved step by step through
   * every link now in the target (chains, links already there): one that leaves the root at any
   * step is refused, dangling or not (a missing step may exist tomorrow).
   */
  private async makeLinks(): Promise<void> {
    for (const l of this.links) {
      await this.parents(l.name);
      const full = path.join(this.opts.root, l.name);
      if (await lstat(full).then(() => true, () => false)) throw new ArchiveError(l.name, "a symlink over an existing entry: refused");
      await symlink(l.target, full);
      this.created.push({ path: full, dir: false });
    }
    for (const l of this.links) {
      const where = await resolveLink(this.opts.root, l.name, l.target);
      if (where === "loop") throw new ArchiveError(l.name, "a symlink loop: refused");
      if (where === "outside") throw new ArchiveError(l.name, "a symlink that leads out of the target through other links: refused");
    }
  }
}

/** One PAX header's records (`<len> <key>=<value>\n`), checked. */
function parsePax(data: Buffer, entry: string): Map<string, string> {
  const records = new Map<string, string>();
  let i = 0;
  while (i < data.byteLength) {
    if (data[i] === 0) break; // padding
    const sp = data.indexOf(0x20, i);
    if (sp < 0 || sp - i > 8) throw new ArchiveError(safeName(entry), "a malformed PAX record");
    const len = Number(data.subarray(i, sp).toString("latin1"));
    if (!Number.isSafeInteger(len) || len <= sp - i + 1 || i + len > data.byteLength || data[i + len - 1] !== 0x0a) {
      throw new ArchiveError(safeName(entry), "a malformed PAX record");
    }
    const rec = data.subarray(sp + 1, i + len - 1).toString("utf8");
    const eq = rec.indexOf("=");
    if (eq <= 0) throw new ArchiveError(safeName(entry), "a malformed PAX record");
    records.set(rec.slice(0, eq), rec.slice(eq + 1));
    i += len;
  }
  return records;
}

/**
 * Where the symlink `name` (relative to root) leads, resolved one step at a time as the kernel
 * would, through every link on the way (their targets read from the disk): "outside" as soon as
 * a step leaves root (an absolute target, `..` above it), "loop" past MAX_LINK_HOPS links. A step
 * that does not exist (or is not a directory) is taken lexically: it may exist later. The same
 * rule as sandboxd's (pkg/sandboxd/untar.go resolveLink).
 */
export async function resolveLink(root: string, name: string, target: string): Promise<"inside" | "outside" | "loop"> {
  const dir = name.split("/").slice(0, -1);
  const stack = dir.filter((p) => p !== "" && p !== ".");
  const queue = target.split("/");
  if (target.startsWith("/")) return "outside";
  let hops = 0;
  for (let c = queue.shift(); c !== undefined; c = queue.shift()) {
    if (c === "" || c === ".") continue;
    if (c === "..") {
      if (stack.length === 0) return "outside";
      stack.pop();
      continue;
    }
    const rel = [...stack, c].join("/");
    const st = await lstat(path.join(root, rel)).catch(() => undefined);
    if (st?.isSymbolicLink()) {
      if (++hops > MAX_LINK_HOPS) return "loop";
      const next = await readlink(path.join(root, rel));
      if (next.startsWith("/")) return "outside";
      queue.unshift(...next.split("/"));
      continue;
    }
    stack.push(c);
  }
  return "inside";
}

async function writeAll(fh: FileHandle, data: Buffer): Promise<void> {
  let off = 0;
  while (off < data.byteLength) {
    const { bytesWritten } = await fh.write(data, off, data.byteLength - off);
    off += bytesWritten;
  }
}

/** A NUL-terminated field. */
function cstr(b: Buffer, offset: number, width: number): string {
  const f = b.subarray(offset, offset + width);
  const nul = f.indexOf(0);
  return f.subarray(0, nul < 0 ? f.byteLength : nul).toString("utf8");
}

/** An octal field (or GNU base-256 for sizes); undefined when it is neither. */
function parseNumber(b: Buffer, offset: number, width: number): number | undefined {
  const f = b.subarray(offset, offset + width);
  if (((f[0] ?? 0) & 0x80) !== 0) {
    if ((f[0] ?? 0) !== 0x80) return undefined; // negative
    let v = 0;
    for (let i = 1; i < f.byteLength; i++) {
      v = v * 256 + (f[i] ?? 0);
      if (!Number.isSafeInteger(v)) return undefined;
    }
    return v;
  }
  const s = f.toString("latin1").replace(/\0.*$/s, "").trim();
  if (s === "") return 0;
  if (!/^[0-7]+$/.test(s)) return undefined;
  return parseInt(s, 8);
}

/** A name for messages: bounded and printable. */
function safeName(name: string): string {
  const s = JSON.stringify(name).slice(1, -1);
  return s.length > 200 ? `${s.slice(0, 200)}…` : s;
}

/**
 * An entry name made relative and checked: "" for the root itself (`.`, `./`). Refused: absolute,
 * `..`, NUL, over MAX_NAME_BYTES.
 */
export function checkName(raw: string): string {
  const shown = safeName(raw);
  if (Buffer.byteLength(raw) > MAX_NAME_BYTES) throw new ArchiveError(shown, `a name over ${MAX_NAME_BYTES} bytes`);
  if (raw.includes("\0")) throw new ArchiveError(shown, "a NUL in the name");
  if (raw.startsWith("/")) throw new ArchiveError(shown, "an absolute name: refused");
  const parts = raw.split("/").filter((p) => p !== "" && p !== ".");
  if (parts.includes("..")) throw new ArchiveError(shown, "a `..` in the name: refused");
  return parts.join("/");
}
