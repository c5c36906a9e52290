// NATS connections to kubeclip: one per distinct connection config, shared by every hook and
// every concurrent execute, closed on shutdown.

import {
  connect,
  credsAuthenticator,
  tokenAuthenticator,
  usernamePasswordAuthenticator,
  type NatsConnection,
  type ConnectionOptions,
} from "@nats-io/transport-node";
import type { Connection } from "./config.js";
import { UnreachableError, errorMessage, scrub } from "./errors.js";

/** How long a first connect may take before the hook reports kubeclip unreachable. */
export const CONNECT_TIMEOUT_MS = 5_000;

export class ConnectionPool {
  private readonly conns = new Map<string, Promise<NatsConnection>>();
  private closed = false;

  /** The connection for conn, connecting on first use or after the previous one closed. */
  async get(conn: Connection): Promise<NatsConnection> {
    if (this.closed) throw new UnreachableError(conn.display, "the plugin is shutting down");
    const existing = this.conns.get(conn.key);
    if (existing) {
      const nc = await existing.catch(() => undefined);
      if (nc && !nc.isClosed()) return nc;
      if (this.conns.get(conn.key) === existing) this.conns.delete(conn.key);
      return this.get(conn);
    }
    const p = open(conn);
    this.conns.set(conn.key, p);
    p.catch(() => {
      // A failed connect is not cached: the next hook tries again.
      if (this.conns.get(conn.key) === p) this.conns.delete(conn.key);
    });
    return p;
  }

  /** Drains and closes every connection (bounded: drain gives up after timeoutMs). */
  async close(timeoutMs = 5_000): Promise<void> {
    this.closed = true;
    const all = [...this.conns.values()];
    this.conns.clear();
    await Promise.all(
      all.map(async (p) => {
        const nc = await p.catch(() => undefined);
        if (!nc || nc.isClosed()) return;
        const t = setTimeout(() => void nc.close(), timeoutMs);
        try {
          await nc.drain();
        } catch {
          await nc.close();
        } finally {
          clearTimeout(t);
        }
      }),
    );
  }
}

async function open(conn: Connection): Promise<NatsConnection> {
  const opts: ConnectionOptions = {
    servers: conn.servers,
    name: "kubeclip-paperclip-plugin",
    // Replies (requests, JetStream's, the exec stream) come to the paperclip user's own inbox:
    // nats-auth.conf lets it subscribe nowhere else, and kubeclip answers nowhere else.
    inboxPrefix: conn.inboxPrefix,
    timeout: CONNECT_TIMEOUT_MS,
    // Keep the connection through kubeclip's NATS restarts; hooks bound their own waits.
    maxReconnectAttempts: -1,
    reconnectTimeWait: 1_000,
    waitOnFirstConnect: false,
  };
  switch (conn.auth.kind) {
    case "creds":
      opts.authenticator = credsAuthenticator(new TextEncoder().encode(conn.auth.creds));
      break;
    case "token":
      opts.authenticator = tokenAuthenticator(conn.auth.token);
      break;
    case "userpass":
      opts.authenticator = usernamePasswordAuthenticator(conn.auth.user, conn.auth.pass);
      break;
    case "none":
      break;
  }
  try {
    return await connect(opts);
  } catch (err) {
    throw new UnreachableError(conn.display, scrub(errorMessage(err), conn.secrets));
  }
}
