import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { lstat, mkdir, mkdtemp, readFile, readdir, readlink, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { ByteBudget } from "./limiter.js";
import { ArchiveError, BLOCK, Extractor, checkName, entryHeader, excludeMatcher, pack, type ExtractOptions, type PackSource, type PackStats } from "./tar.js";

let tmp = "";
beforeEach(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "kubeclip-tar-"));
});
afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

async function collect(src: PackSource, stats?: PackStats): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const b of pack(src, stats)) parts.push(b);
  return Buffer.concat(parts);
}

function opts(root: string, extra: Partial<ExtractOptions> = {}): ExtractOptions {
  return { root, maxBytes: 1 << 30, maxEntries: 1000, bytesSetting: "settings.maxSyncOutBytes", entriesSetting: "settings.maxSyncOutFiles", ...extra };
}

/** Feeds data in uneven chunks, as exec output arrives. */
async function extract(data: Buffer, o: ExtractOptions, chunk = 777): Promise<{ files: number; bytes: number }> {
  const x = new Extractor(o);
  try {
    for (let i = 0; i < data.byteLength; i += chunk) await x.write(data.subarray(i, i + chunk));
    return await x.end();
  } catch (err) {
    await x.abort();
    throw err;
  }
}

/** A tree of every path under dir: "f:<name>:<mode>:<content>", "d:<name>", "l:<name>-><target>". */
async function tree(dir: string, rel = ""): Promise<string[]> {
  const out: string[] = [];
  for (const name of (await readdir(path.join(dir, rel))).sort()) {
    const r = rel ? `${rel}/${name}` : name;
    const full = path.join(dir, r);
    const st = await lstat(full);
    if (st.isSymbolicLink()) out.push(`l:${r}->${await readlink(full)}`);
    else if (st.isDirectory()) out.push(`d:${r}`, ...(await tree(dir, r)));
    else out.push(`f:${r}:${(st.mode & 0o777).toString(8)}:${(await readFile(full)).toString("base64").slice(0, 40)}:${st.size}`);
  }
  return out;
}

function entry(name: string, type: string, data: Buffer | string = "", extra: { linkname?: string; size?: number; mode?: number } = {}): Buffer {
  const body = Buffer.from(data);
  const size = extra.size ?? body.byteLength;
  const hdr = entryHeader({ name, mode: extra.mode ?? 0o644, size, mtime: 0, type, ...(extra.linkname !== undefined ? { linkname: extra.linkname } : {}) });
  return Buffer.concat([...hdr, body, Buffer.alloc((BLOCK - (body.byteLength % BLOCK)) % BLOCK)]);
}

function pax(records: Record<string, string>): Buffer {
  const text = Object.entries(records)
    .map(([k, v]) => {
      const body = ` ${k}=${v}\n`;
      let len = body.length + String(body.length).length;
      if (String(len).length !== String(body.length).length) len = body.length + String(len).length;
      return `${len}${body}`;
    })
    .join("");
  return entry("PaxHeaders/x", "x", text);
}

const END = Buffer.alloc(2 * BLOCK);

describe("excludeMatcher (tar --exclude)", () => {
  it("matches like GNU tar's default: unanchored wildcards, a directory with its contents", () => {
    const m = excludeMatcher(["node_modules", ".git/*", "*.log", "build/out?", "a\\*b", "[!x]y"]);
    for (const yes of ["node_modules", "a/node_modules", "a/node_modules/x/y", ".git/HEAD", "sub/.git/HEAD", "x.log", "d/x.log", "build/out1", "a*b", "ay"]) {
      assert.ok(m(yes), yes);
    }
    for (const no of ["node_modulesx", "xnode_modules/a", ".git", "x.logs", "build/out12x", "aab", "xy"]) assert.ok(!m(no), no);
  });
});

describe("tar round trip", () => {
  it("packs a tree and extracts it the same: modes, long and non-ASCII names, links, empty dirs", async () => {
    const src = path.join(tmp, "src");
    await mkdir(path.join(src, "sub/deeper"), { recursive: true });
    await mkdir(path.join(src, "empty"));
    await writeFile(path.join(src, "a.txt"), "hello\n");
    await writeFile(path.join(src, "sub/run.sh"), "#!/bin/sh\n", { mode: 0o755 });
    await writeFile(path.join(src, "sub/deeper/big.bin"), Buffer.alloc(3 * 1024 * 1024 + 17, 7));
    const long = `${"d".repeat(120)}/${"n".repeat(150)}.txt`;
    await mkdir(path.join(src, "d".repeat(120)));
    await writeFile(path.join(src, long), "long");
    await writeFile(path.join(src, "ünïcødé ☃.txt"), "snow");
    await writeFile(path.join(src, "zero"), "");
    await symlink("sub/run.sh", path.join(src, "link"));
    await symlink(`../${"d".repeat(120)}/${"n".repeat(150)}.txt`, path.join(src, "sub/longlink"));
    await writeFile(path.join(src, "._sidecar"), "mac");
    const stats = { files: 0, bytes: 0 };
    const data = await collect({ kind: "directory", path: src }, stats);
    assert.equal(stats.files, 6);
    assert.equal(data.byteLength % BLOCK, 0);
    const dst = path.join(tmp, "dst");
    const got = await extract(data, opts(dst));
    assert.deepEqual(got, { files: 6, bytes: stats.bytes });
    const want = (await tree(src)).filter((l) => !l.includes("._sidecar"));
    assert.deepEqual(await tree(dst), want);
  });

  it("writes archives GNU tar reads, and reads what GNU tar writes", async () => {
    const src = path.join(tmp, "src");
    await mkdir(path.join(src, "x"), { recursive: true });
    await writeFile(path.join(src, `x/${"q".repeat(200)}`), "pax name");
    await symlink("x", path.join(src, "lnk"));
    const data = await collect({ kind: "directory", path: src });
    await writeFile(path.join(tmp, "ours.tar"), data);
    const byGnu = path.join(tmp, "by-gnu");
    await mkdir(byGnu);
    execFileSync("tar", ["-xf", path.join(tmp, "ours.tar"), "-C", byGnu]);
    assert.deepEqual(await tree(byGnu), await tree(src));
    execFileSync("tar", ["--format=pax", "-cf", path.join(tmp, "gnu.tar"), "-C", src, "."]);
    const dst = path.join(tmp, "dst");
    await extract(await readFile(path.join(tmp, "gnu.tar")), opts(dst));
    assert.deepEqual(await tree(dst), await tree(src));
  });

  it("honours exclude and followSymlinks", async () => {
    const src = path.join(tmp, "src");
    await mkdir(path.join(src, "node_modules/x"), { recursive: true });
    await mkdir(path.join(src, "keep"));
    await writeFile(path.join(src, "node_modules/x/i.js"), "x");
    await writeFile(path.join(src, "keep/a"), "a");
    await writeFile(path.join(src, "keep/b.log"), "b");
    await symlink("keep", path.join(src, "alias"));
    const dst = path.join(tmp, "dst");
    await extract(await collect({ kind: "directory", path: src, exclude: ["node_modules", "*.log"], followSymlinks: true }), opts(dst));
    assert.deepEqual(await tree(dst), ["d:alias", "f:alias/a:644:YQ==:1", "d:keep", "f:keep/a:644:YQ==:1"]);
  });

  it("followSymlinks never follows a host link out of the source, whatever path it takes (issue 26 item 6)", async () => {
    await mkdir(path.join(tmp, "outside"));
    await writeFile(path.join(tmp, "outside/secret"), "host secret");
    for (const [name, links] of Object.entries({
      direct: [["out", "../outside"]],
      absolute: [["out", path.join(tmp, "outside")]],
      chain: [["c", "."], ["up", "c/.."], ["0steal", "up/outside/secret"]],
      throughDir: [["a/b", ".."], ["0steal", "a/b/../outside/secret"]],
    })) {
      const src = path.join(tmp, `src-${name}`);
      await mkdir(path.join(src, "a"), { recursive: true });
      for (const [l, to] of links) await symlink(to as string, path.join(src, l as string));
      await assert.rejects(collect({ kind: "directory", path: src, followSymlinks: true }), (err: unknown) => {
        assert.ok(err instanceof ArchiveError, String(err));
        assert.match(err.message, /leads out of the source \(followSymlinks\): refused/);
        return true;
      }, name);
    }
  });

  it("a company's sync-outs in flight share one disk budget; other companies have their own (issue 26 item 14)", async () => {
    const budget = new ByteBudget(Number.MAX_SAFE_INTEGER, 1 << 20);
    const file = (name: string, size: number): Buffer => entry(name, "0", Buffer.alloc(size, 0x61));
    const x = (dir: string, company: string): Extractor => new Extractor(opts(path.join(tmp, dir), { inFlight: { bytes: budget, company } }));
    // Company A's first sync-out is mid-file: its 800 KiB are taken before a byte is written.
    const first = x("a1", "A");
    const big = file("big", 800 << 10);
    await first.write(big.subarray(0, BLOCK + 1000));
    assert.equal(budget.held("A"), 800 << 10);
    const second = x("a2", "A");
    await assert.rejects(second.write(Buffer.concat([file("f", 400 << 10), END])), (err: unknown) => {
      assert.ok(err instanceof ArchiveError, String(err));
      assert.match(err.message, /company A's sync-out budget in flight: 819200 of 1048576 bytes .*SYNC_OUT_COMPANY_BYTES/);
      return true;
    });
    await second.abort();
    // Company B is not held back by A.
    await extract(Buffer.concat([file("f", 400 << 10), END]), opts(path.join(tmp, "b"), { inFlight: { bytes: budget, company: "B" } }));
    assert.equal(budget.held("B"), 0, "an ended extraction gives its bytes back");
    // Once A's first ends, A has room again.
    await first.write(Buffer.concat([big.subarray(BLOCK + 1000), END]));
    await first.end();
    assert.equal(budget.held("A"), 0);
    await extract(Buffer.concat([file("f", 400 << 10), END]), opts(path.join(tmp, "a3"), { inFlight: { bytes: budget, company: "A" } }));
    assert.equal(budget.held(), 0);
  });

  it("a file mapping: one entry, written to its target with the mapping's mode exactly", async () => {
    await writeFile(path.join(tmp, "secret"), "s3cret", { mode: 0o644 });
    const data = await collect({ kind: "file", path: path.join(tmp, "secret"), name: "creds.json", mode: 0o600 });
    const target = path.join(tmp, "out/deep/creds.json");
    const got = await extract(data, opts(path.join(tmp, "out"), { file: { entry: "creds.json", target, mode: 0o640 } }));
    assert.deepEqual(got, { files: 1, bytes: 6 });
    assert.equal((await stat(target)).mode & 0o777, 0o640);
    assert.equal(await readFile(target, "utf8"), "s3cret");
  });
});

describe("hostile archives", () => {
  const cases: { name: string; archive: () => Buffer; entry: string; reason: RegExp; file?: boolean }[] = [
    { name: "dot-dot", archive: () => Buffer.concat([entry("ok.txt", "0", "fine"), entry("../evil", "0", "x"), END]), entry: "../evil", reason: /`\.\.`/ },
    { name: "dot-dot inside", archive: () => Buffer.concat([entry("a/../../evil", "0", "x"), END]), entry: "a/../../evil", reason: /`\.\.`/ },
    { name: "absolute", archive: () => Buffer.concat([entry("/tmp/evil", "0", "x"), END]), entry: "/tmp/evil", reason: /absolute/ },
    { name: "PAX path dot-dot", archive: () => Buffer.concat([pax({ path: "../../pax-evil" }), entry("innocent", "0", "x"), END]), entry: "../../pax-evil", reason: /`\.\.`/ },
    { name: "symlink out", archive: () => Buffer.concat([entry("l", "2", "", { linkname: "../../outside" }), END]), entry: "l", reason: /leads out/ },
    { name: "symlink absolute", archive: () => Buffer.concat([entry("l", "2", "", { linkname: "/etc" }), END]), entry: "l", reason: /absolute/ },
    {
      name: "symlink chain out",
      archive: () => Buffer.concat([entry("d/", "5"), entry("d/self", "2", "", { linkname: "." }), entry("d/up", "2", "", { linkname: "self/../.." }), entry("x", "2", "", { linkname: "d/up/.." }), END]),
      entry: "d/up",
      reason: /through other links/,
    },
    { name: "write through a symlink", archive: () => Buffer.concat([entry("l", "2", "", { linkname: "sub" }), entry("l/f", "0", "x"), END]), entry: "l", reason: /existing entry/ },
    { name: "hardlink", archive: () => Buffer.concat([entry("h", "1", "", { linkname: "/etc/passwd" }), END]), entry: "h", reason: /hardlink/ },
    { name: "char device", archive: () => Buffer.concat([entry("dev", "3"), END]), entry: "dev", reason: /device/ },
    { name: "block device", archive: () => Buffer.concat([entry("blk", "4"), END]), entry: "blk", reason: /device/ },
    { name: "fifo", archive: () => Buffer.concat([entry("p", "6"), END]), entry: "p", reason: /fifo/ },
    { name: "sparse", archive: () => Buffer.concat([entry("s", "S"), END]), entry: "s", reason: /sparse/ },
    { name: "too many bytes (a bomb's header)", archive: () => Buffer.concat([pax({ size: String(50 * 2 ** 30) }), entry("bomb", "0", ""), END]), entry: "bomb", reason: /maxSyncOutBytes/ },
    { name: "too many entries", archive: () => Buffer.concat([...Array.from({ length: 12 }, (_, i) => entry(`f${i}`, "0", "x")), END]), entry: "f10", reason: /maxSyncOutFiles/ },
    { name: "name over 4096 bytes", archive: () => Buffer.concat([pax({ path: "n".repeat(5000) }), entry("x", "0", "x"), END]), entry: "n".repeat(200) + "…", reason: /over 4096/ },
    { name: "PAX header over 1 MiB", archive: () => Buffer.concat([entry("PaxHeaders/big", "x", "", { size: 2 << 20 }), END]), entry: "PaxHeaders/big", reason: /PAX header of/ },
    { name: "bad checksum", archive: () => { const b = Buffer.concat([entry("x", "0", "x"), END]); b[0] = 0x79; return b; }, entry: "y", reason: /checksum/ },
    { name: "truncated", archive: () => entry("x", "0", "x".repeat(2000)).subarray(0, 1200), entry: "x", reason: /middle of an entry/ },
    { name: "file mapping with a second entry", archive: () => Buffer.concat([entry("bundle", "0", "b"), entry("extra", "0", "e"), END]), entry: "extra", reason: /holds only bundle/, file: true },
    { name: "file mapping with a symlink", archive: () => Buffer.concat([entry("bundle", "2", "", { linkname: "x" }), END]), entry: "bundle", reason: /symlink in a file mapping/, file: true },
  ];
  for (const tc of cases) {
    it(`refuses ${tc.name}, naming the entry, with nothing written outside and nothing left behind`, async () => {
      const root = path.join(tmp, "a/b/root");
      await mkdir(root, { recursive: true });
      await writeFile(path.join(root, "kept"), "was here");
      const before = await tree(tmp);
      const o = opts(root, { maxEntries: 10, maxBytes: 1 << 20, ...(tc.file ? { file: { entry: "bundle", target: path.join(root, "bundle") } } : {}) });
      await assert.rejects(extract(tc.archive(), o), (err: unknown) => {
        assert.ok(err instanceof ArchiveError, String(err));
        assert.equal(err.entry, tc.entry);
        assert.match(err.message, tc.reason);
        assert.ok(err.message.startsWith(`${tc.entry}: `), err.message);
        return true;
      });
      assert.deepEqual(await tree(tmp), before);
    });
  }

  it("never writes through a symlink already in the target", async () => {
    const root = path.join(tmp, "root");
    const outside = path.join(tmp, "outside");
    await mkdir(root);
    await mkdir(outside);
    await symlink(outside, path.join(root, "pre"));
    await assert.rejects(extract(Buffer.concat([entry("pre/f", "0", "x"), END]), opts(root)), /pre\/f: its parent pre is a symlink/);
    assert.deepEqual(await readdir(outside), []);
  });

  it("keeps links that stay inside", async () => {
    const root = path.join(tmp, "root");
    await extract(Buffer.concat([entry("d/", "5"), entry("d/f", "0", "x"), entry("d/l", "2", "", { linkname: "../d/f" }), entry("top", "2", "", { linkname: "d" }), END]), opts(root));
    assert.deepEqual(await tree(root), ["d:d", "f:d/f:644:eA==:1", "l:d/l->../d/f", "l:top->d"]);
  });

  it("checkName normalises and refuses", () => {
    assert.equal(checkName("./a//b/./c"), "a/b/c");
    assert.equal(checkName("./"), "");
    assert.throws(() => checkName("a/../../b"), ArchiveError);
    assert.throws(() => checkName("a\0b"), /NUL/);
  });
});
