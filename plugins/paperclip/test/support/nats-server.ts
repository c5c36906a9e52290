// A real nats-server with JetStream for the tests: the version kubeclip pins in go.mod, built
// with the Go toolchain into $KUBECLIP_CACHE/bin on first use (or NATS_SERVER_BIN), started on a
// random loopback port with a temporary store dir.

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { dirname, join } from "node:path";

export interface NatsServer {
  url: string;
  port: number;
  stop(): Promise<void>;
}

export function repoRoot(): string {
  let dir = process.cwd();
  for (;;) {
    if (existsSync(join(dir, "go.mod")) && existsSync(join(dir, "plugins"))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error("nats-server: cannot find kubeclip's go.mod above " + process.cwd());
    dir = up;
  }
}

/** The nats-server binary: NATS_SERVER_BIN, or built from the version go.mod pins. */
export function natsServerBinary(): string {
  const fromEnv = process.env.NATS_SERVER_BIN;
  if (fromEnv) return fromEnv;
  const root = repoRoot();
  const m = /github\.com\/nats-io\/nats-server\/v2 (v\S+)/.exec(readFileSync(join(root, "go.mod"), "utf8"));
  if (!m?.[1]) throw new Error("nats-server: go.mod pins no github.com/nats-io/nats-server/v2");
  const cache = process.env.KUBECLIP_CACHE ?? join(homedir(), ".cache", "kubeclip");
  const bin = join(cache, "bin", `nats-server-${m[1]}`);
  if (!existsSync(bin)) {
    mkdirSync(dirname(bin), { recursive: true });
    const go = process.env.GO ?? (existsSync("/usr/local/go/bin/go") ? "/usr/local/go/bin/go" : "go");
    try {
      execFileSync(go, ["build", "-o", bin + ".tmp", "github.com/nats-io/nats-server/v2"], { cwd: root, stdio: "inherit" });
    } catch (err) {
      throw new Error(
        `nats-server: building it with '${go} build github.com/nats-io/nats-server/v2' in ${root} failed; install Go (see go.mod) or set NATS_SERVER_BIN`,
        { cause: err },
      );
    }
    execFileSync("mv", [bin + ".tmp", bin]);
  }
  return bin;
}

/** Starts a server; config is a nats-server config file's text (users and permissions). */
export async function startNatsServer(config?: string): Promise<NatsServer> {
  const bin = natsServerBinary();
  const dir = mkdtempSync(join(tmpdir(), "kubeclip-plugin-nats-"));
  const args = ["-js", "-a", "127.0.0.1", "-p", "-1", "-sd", dir, "-n", "plugin-test"];
  if (config !== undefined) {
    writeFileSync(join(dir, "nats.conf"), config);
    args.push("-c", join(dir, "nats.conf"));
  }
  const child: ChildProcess = spawn(bin, args, {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const port = await new Promise<number>((resolve, reject) => {
    let log = "";
    const t = setTimeout(() => {
      reject(new Error(`nats-server did not start in 15 s:\n${log}`));
    }, 15_000);
    child.stderr?.on("data", (b: Buffer) => {
      log += b.toString();
      const m = /Listening for client connections on [^:\s]+:(\d+)/.exec(log);
      if (m?.[1] && log.includes("Server is ready")) {
        clearTimeout(t);
        resolve(Number(m[1]));
      }
    });
    child.on("exit", (code) => {
      clearTimeout(t);
      reject(new Error(`nats-server exited (${code}):\n${log}`));
    });
  });
  child.removeAllListeners("exit");
  child.stderr?.resume();
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        const timedOut = await Promise.race([exited.then(() => false), new Promise((r) => setTimeout(r, 5_000, true))]);
        if (timedOut) child.kill("SIGKILL");
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
