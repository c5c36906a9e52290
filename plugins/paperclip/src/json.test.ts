import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Fields, findCaseVariantKey, parseObject } from "./json.js";
import { ProtocolError } from "./errors.js";

describe("json", () => {
  it("parses one object, refusing other values, bad UTF-8 and oversize", () => {
    assert.deepEqual(parseObject(new TextEncoder().encode('{"a":1}'), "x"), { a: 1 });
    assert.throws(() => parseObject(new TextEncoder().encode("[1]"), "reply"), { message: "reply: not a JSON object" });
    assert.throws(() => parseObject(new Uint8Array([0x7b, 0xff, 0x7d]), "reply"), ProtocolError);
    assert.throws(() => parseObject(new Uint8Array((1 << 20) + 1), "reply"), /more than/);
  });

  it("reads typed fields and names the wrong one", () => {
    const f = new Fields({ s: "x", n: 3, b: true, o: {}, bad: 1 }, "ev");
    assert.equal(f.str("s"), "x");
    assert.equal(f.optInt("n"), 3);
    assert.equal(f.bool("b"), true);
    assert.equal(f.optStr("missing"), undefined);
    assert.throws(() => f.str("bad"), { message: "ev: field bad must be a non-empty string" });
    assert.throws(() => f.optObject("s"), /field s must be an object/);
  });

  it("finds case-variant keys at any depth", () => {
    assert.equal(findCaseVariantKey({ a: 1, b: { c: [{ d: 1 }] } }, "config"), undefined);
    assert.equal(findCaseVariantKey({ a: { x: [{ k: 1, K: 2 }] } }, "config"), "config.a.x[0].K (and config.a.x[0].k)");
  });
});
