// The exclude globs both halves apply (testdata/excludes/cases.json at the repository's root):
// the plugin's pack (sync in) must match as sandboxd tar (sync out) does (pkg/sandboxd/excludes_test.go).

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";
import { excludeMatcher } from "./tar.js";

interface Table {
  cases: { glob: string; name: string; excluded: boolean }[];
}

function casesFile(): string {
  for (let dir = path.dirname(fileURLToPath(import.meta.url)); ; dir = path.dirname(dir)) {
    const candidate = path.join(dir, "testdata", "excludes", "cases.json");
    if (existsSync(candidate)) return candidate;
    if (path.dirname(dir) === dir) throw new Error("testdata/excludes/cases.json not found above this test");
  }
}

const table = JSON.parse(await readFile(casesFile(), "utf8")) as Table;

describe("exclude globs (testdata/excludes/cases.json)", () => {
  for (const c of table.cases) {
    it(`${JSON.stringify(c.glob)} ${c.excluded ? "excludes" : "keeps"} ${JSON.stringify(c.name)}`, () => {
      assert.equal(excludeMatcher([c.glob])(c.name), c.excluded);
    });
  }
});
