import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { resolveConnection } from "./config.js";
import { UnreachableError } from "./errors.js";
import { ConnectionPool } from "./nats.js";
import { startNatsServer, type NatsServer } from "../test/support/nats-server.js";

describe("ConnectionPool", () => {
  let server: NatsServer;
  before(async () => {
    server = await startNatsServer();
  });
  after(async () => {
    await server.stop();
  });

  it("shares one connection per connection config and reopens a closed one", async () => {
    const pool = new ConnectionPool();
    const a = resolveConnection({ natsUrl: server.url });
    const b = resolveConnection({ natsUrl: server.url, subjectPrefix: "other", timeoutMs: 5 });
    const [c1, c2] = await Promise.all([pool.get(a), pool.get(b)]);
    assert.equal(c1, c2, "prefix and timeout do not make a new connection");
    await c1.close();
    const c3 = await pool.get(a);
    assert.notEqual(c3, c1);
    assert.equal(c3.isClosed(), false);
    await pool.close();
    assert.equal(c3.isClosed(), true);
    await assert.rejects(pool.get(a), /shutting down/);
  });

  it("reports an unreachable server without credentials", async () => {
    const pool = new ConnectionPool();
    const conn = resolveConnection({ natsUrl: "nats://127.0.0.1:1", natsToken: "tok-topsecret" });
    await assert.rejects(pool.get(conn), (err: unknown) => {
      assert.ok(err instanceof UnreachableError);
      assert.match(err.message, /^kubeclip unreachable at nats:\/\/127\.0\.0\.1:1: /);
      assert.ok(!err.message.includes("tok-topsecret"));
      return true;
    });
    await pool.close();
  });
});
