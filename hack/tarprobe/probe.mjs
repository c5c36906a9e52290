// What tar-stream and modern-tar read from kubeclip's archive corpus (testdata/archives): per
// case, kubeclip's outcome (manifest.json's want) and each library's: the entries it hands its
// caller (type, name, size, link target), its error, or that it neither ends nor fails.
// Run by run.sh, which installs the two libraries in a scratch directory; argv[2] is the corpus.
import { readFileSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import tarStream from "tar-stream";
import { unpackTar } from "modern-tar";

const dir = process.argv[2];
const manifest = JSON.parse(readFileSync(`${dir}/manifest.json`, "utf8"));
const STALL_MS = 3_000;

/** A ustar entry of a regular file: its header block and its data, padded to a block. */
function ustarFile(name, data) {
  const h = Buffer.alloc(512);
  h.write(name, 0, "utf8");
  h.write("0000644\0", 100);
  h.write("0000000\0", 108);
  h.write("0000000\0", 116);
  h.write(`${data.length.toString(8).padStart(11, "0")}\0`, 124);
  h.write("00000000000\0", 136);
  h.write("0", 156);
  h.write("ustar\0" + "00", 257, "latin1");
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, "latin1");
  return Buffer.concat([h, data, Buffer.alloc((512 - (data.length % 512)) % 512)]);
}

/** Two archives the corpus lacks, built here: what GNU tar and archive/tar read is a alone. */
const crafted = [
  {
    name: "lone-zero-block",
    want: "refused",
    about: "a, one zero block, b (GNU tar: 'A lone zero block', reads a alone)",
    tar: Buffer.concat([ustarFile("a", Buffer.from("A")), Buffer.alloc(512), ustarFile("b", Buffer.from("B")), Buffer.alloc(1024)]),
  },
  {
    name: "entry-after-end",
    want: "ok: a alone",
    about: "a, the end-of-archive blocks, then b (GNU tar, archive/tar and kubeclip read a alone)",
    tar: Buffer.concat([ustarFile("a", Buffer.from("A")), Buffer.alloc(1024), ustarFile("b", Buffer.from("B")), Buffer.alloc(1024)]),
  },
];

const cut = (s, n) => (s.length > n ? `${s.slice(0, n)}…` : s);
const show = (entries) =>
  entries.map((e) => `${e.type}:${cut(JSON.stringify(e.name), 24)}${e.size ? `(${e.size})` : ""}${e.linkname ? `->${e.linkname}` : ""}`).join(" ");

function viaTarStream(buf) {
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(`stalls: neither ends nor fails within ${STALL_MS} ms`), STALL_MS);
    const done = (s) => {
      clearTimeout(t);
      resolve(s);
    };
    const ex = tarStream.extract();
    const out = [];
    ex.on("entry", (h, stream, next) => {
      out.push({ type: h.type, name: h.name, size: h.size, linkname: h.linkname });
      stream.on("end", next);
      stream.resume();
    });
    ex.on("finish", () => done(`reads ${show(out)}`));
    ex.on("error", (err) => done(`fails: ${err.message}`));
    ex.end(buf);
  });
}

async function viaModernTar(buf, strict) {
  try {
    const r = await unpackTar(buf, { strict });
    return `reads ${show(r.map((x) => x.header))}`;
  } catch (err) {
    return `fails: ${err.message}`;
  }
}

for (const c of [...manifest.cases, ...crafted]) {
  const buf = c.tar ?? gunzipSync(readFileSync(`${dir}/${c.archive}`));
  console.log(`${c.name} (kubeclip: ${c.want}): ${c.about}`);
  console.log(`  tar-stream          ${cut(await viaTarStream(buf), 160)}`);
  console.log(`  modern-tar          ${cut(await viaModernTar(buf, false), 160)}`);
  console.log(`  modern-tar strict   ${cut(await viaModernTar(buf, true), 160)}`);
}
