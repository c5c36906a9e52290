// The follow load driver: node build/test/load/follow-load.js [leases...] (default 1000 5000).
// Each size runs in its own process (VmHWM is per process): it re-runs itself with one size.
// Prints one line of raw columns per size (docs/architecture.md, Following thousands of leases).

import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { followLoad, formatLoad } from "../support/follow-load.js";

const sizes = process.argv.slice(2).map(Number);
if (sizes.some((n) => !Number.isSafeInteger(n) || n < 1)) throw new Error(`usage: follow-load.js [leases...]: ${process.argv.slice(2).join(" ")}`);
if (sizes.length === 1 && process.env.KUBECLIP_FOLLOW_LOAD_CHILD === "1") {
  console.log(formatLoad(await followLoad(sizes[0] ?? 0)));
} else {
  for (const n of sizes.length > 0 ? sizes : [1000, 5000]) {
    execFileSync(process.execPath, ["--expose-gc", fileURLToPath(import.meta.url), String(n)], { stdio: "inherit", env: { ...process.env, KUBECLIP_FOLLOW_LOAD_CHILD: "1" } });
  }
}
