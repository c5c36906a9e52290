// The corpus of hostile archives both extractors are tested with (testdata/archives at the
// repository's root, written by pkg/sandboxd/corpus_test.go): the plugin's Extractor must give
// the outcome manifest.json names for each, as sandboxd's Untar does.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { lstat, mkdtemp, readFile, readdir, readlink, realpath, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { gunzipSync } from "node:zlib";
import { describe, it } from "node:test";
import { ArchiveError, Extractor } from "./tar.js";

interface CorpusFile {
  path: string;
  type: "file" | "dir" | "symlink";
  content?: string;
  target?: string;
}

interface CorpusCase {
  name: string;
  archive: string;
  about: string;
  want: "ok" | "refused";
  reason?: string;
  files?: CorpusFile[];
}

interface Manifest {
  setup: { root: string; outside: string[] };
  maxBytes: number;
  maxEntries: number;
  reasons: string[];
  cases: CorpusCase[];
}

/** Each refusal class, as the plugin's refusals word it (corpus_test.go has sandboxd's). */
const REASONS: Record<string, RegExp> = {
  name: /an absolute name|a `\.\.` in the name|a name over \d+ bytes|a long name of \d+ bytes|a NUL in the name/,
  link: /symlink (loop|that leads out)|a symlink to an absolute path/,
  parent: /a symlink over an existing entry|its parent .* is|exists (as a directory|and is)/,
  hardlink: /hardlinks are refused/,
  sparse: /a sparse file/,
  device: /a device node/,
  fifo: /a fifo/,
  type: /entry type .* is refused/,
  data: /carries \d+ bytes of data/,
  headers: /headers before one entry pass|more than \d+ records|with no entry after it/,
  malformed: /bad checksum|malformed PAX record|bad PAX size|bad size field/,
  truncated: /ended in the middle of an entry/,
  bytes: /would pass the bound of \d+ bytes/,
  entries: /more than \d+ entries/,
};

function corpusDir(): string {
  for (let dir = path.dirname(fileURLToPath(import.meta.url)); ; dir = path.dirname(dir)) {
    const candidate = path.join(dir, "testdata", "archives");
    if (existsSync(path.join(candidate, "manifest.json"))) return candidate;
    if (path.dirname(dir) === dir) throw new Error("testdata/archives/manifest.json not found above this test");
  }
}

async function treeOf(root: string, rel = ""): Promise<CorpusFile[]> {
  const out: CorpusFile[] = [];
  const names = (await readdir(path.join(root, rel))).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
  for (const name of names) {
    const p = rel ? `${rel}/${name}` : name;
    const full = path.join(root, p);
    const st = await lstat(full);
    if (st.isSymbolicLink()) out.push({ path: p, type: "symlink", target: await readlink(full) });
    else if (st.isDirectory()) out.push({ path: p, type: "dir" }, ...(await treeOf(root, p)));
    else out.push({ path: p, type: "file", content: (await readFile(full)).toString("utf8") });
  }
  return out;
}

/** Every link left under root resolves inside it (or dangles). */
async function assertNoLinkOut(root: string): Promise<void> {
  if (!existsSync(root)) return;
  const realRoot = await realpath(root);
  for (const f of await treeOf(root)) {
    if (f.type !== "symlink") continue;
    const real = await realpath(path.join(root, f.path)).catch(() => undefined);
    if (real !== undefined) assert.ok(real === realRoot || real.startsWith(`${realRoot}/`), `${f.path} is left, a link to ${real} outside the root`);
  }
}

const dir = corpusDir();
const manifest = JSON.parse(await readFile(path.join(dir, "manifest.json"), "utf8")) as Manifest;

describe("the archive corpus (testdata/archives)", () => {
  it("names a pattern for every reason the manifest uses", () => {
    assert.deepEqual(Object.keys(REASONS).sort(), [...manifest.reasons].sort());
  });
  for (const c of manifest.cases) {
    it(`${c.name}: ${c.want}${c.reason ? ` (${c.reason})` : ""}`, async () => {
      const data = gunzipSync(await readFile(path.join(dir, c.archive)));
      const base = await mkdtemp(path.join(tmpdir(), "kubeclip-corpus-"));
      try {
        for (const o of manifest.setup.outside) await writeFile(path.join(base, o), "outside");
        const root = path.join(base, manifest.setup.root);
        const x = new Extractor({ root, maxBytes: manifest.maxBytes, maxEntries: manifest.maxEntries, bytesSetting: "maxBytes", entriesSetting: "maxEntries" });
        let err: unknown;
        try {
          // Uneven chunks, as exec output arrives.
          for (let i = 0; i < data.byteLength; i += 7_777) await x.write(data.subarray(i, i + 7_777));
          await x.end();
        } catch (e) {
          err = e;
          await x.abort();
        }
        if (c.want === "ok") {
          assert.equal(err, undefined, `refused: ${String(err)}`);
          assert.deepEqual(await treeOf(root), c.files ?? []);
        } else {
          assert.ok(err instanceof ArchiveError, `got ${String(err)}, want it refused (${c.reason})`);
          const re = REASONS[c.reason ?? ""];
          assert.ok(re, `no pattern for reason ${c.reason}`);
          assert.match(err.message, re, `refused as ${JSON.stringify(err.message)}, want a refusal of class ${c.reason}`);
        }
        await assertNoLinkOut(root);
      } finally {
        await rm(base, { recursive: true, force: true });
      }
    });
  }
});
