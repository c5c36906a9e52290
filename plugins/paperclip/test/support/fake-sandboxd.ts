// A stand-in for sandboxd's sync subcommands (docs/exec.md "Native sync"), for the plugin's hook
// tests where the fake exec service runs commands on this machine. It follows the interface the
// plugin codes to, built on the plugin's own tar module; the real sandboxd serves the plugin in
// tests/paperclip (and here, with KUBECLIP_SANDBOXD naming its binary).
//
//   untar --root DIR [--max-bytes N] [--max-files N]   tar on stdin → DIR; {"files":N,"bytes":N}
//   tar --root DIR [--exclude G]... [--follow-symlinks] [--max-bytes N] NAME   tar → stdout
// Refusals: exit 65 and one stderr line `<sub>: <entry>: <reason>`.

import { stat } from "node:fs/promises";
import path from "node:path";
import { Extractor, pack } from "../../src/tar.js";

async function main(argv: string[]): Promise<void> {
  const [sub, ...rest] = argv;
  let root = "";
  let maxBytes = 1 << 30;
  let maxFiles = 100_000;
  let follow = false;
  const exclude: string[] = [];
  const names: string[] = [];
  for (let i = 0; i < rest.length; i++) {
    const a = rest[i] ?? "";
    const value = (): string => rest[++i] ?? "";
    if (a === "--root") root = value();
    else if (a === "--max-bytes") maxBytes = Number(value());
    else if (a === "--max-files") maxFiles = Number(value());
    else if (a === "--exclude") exclude.push(value());
    else if (a === "--follow-symlinks") follow = true;
    else names.push(a);
  }
  if (sub === "untar") {
    const x = new Extractor({ root, maxBytes, maxEntries: maxFiles, bytesSetting: "--max-bytes", entriesSetting: "--max-files" });
    try {
      for await (const chunk of process.stdin) await x.write(chunk as Buffer);
      const r = await x.end();
      process.stdout.write(`${JSON.stringify(r)}\n`);
    } catch (err) {
      await x.abort();
      throw err;
    }
    return;
  }
  if (sub === "tar") {
    const name = names[0] ?? ".";
    const full = path.join(root, name);
    const st = await stat(full);
    const src = st.isDirectory() ? { kind: "directory" as const, path: full, exclude, followSymlinks: follow } : { kind: "file" as const, path: full, name };
    let sent = 0;
    for await (const b of pack(src)) {
      sent += b.byteLength;
      if (sent > maxBytes + (1 << 20)) throw new Error(`${name}: more than --max-bytes ${maxBytes}`);
      if (!process.stdout.write(b)) await new Promise((r) => process.stdout.once("drain", r));
    }
    return;
  }
  throw new Error(`unknown subcommand ${sub ?? ""}`);
}

main(process.argv.slice(2)).catch((err: unknown) => {
  process.stderr.write(`${process.argv[2] ?? "sandboxd"}: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(65);
});
