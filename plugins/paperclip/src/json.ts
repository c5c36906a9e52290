// Decoding JSON from the wire. Nothing kubeclip or a peer sends is trusted to have the contract's
// shape: each reader checks the types it uses and names the field it found wrong.

import { ProtocolError } from "./errors.js";

export type JsonObject = Record<string, unknown>;

/** Largest message kubeclip sends or accepts (the streams' MaxMsgSize). */
export const MAX_MESSAGE_BYTES = 1 << 20;

const decoder = new TextDecoder("utf-8", { fatal: true });

export function isObject(v: unknown): v is JsonObject {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Parses a message body that must be one JSON object. `what` names it in errors. */
export function parseObject(data: Uint8Array, what: string): JsonObject {
  if (data.byteLength > MAX_MESSAGE_BYTES) {
    throw new ProtocolError(`${what}: ${data.byteLength} bytes, more than ${MAX_MESSAGE_BYTES}`);
  }
  let v: unknown;
  try {
    v = JSON.parse(decoder.decode(data));
  } catch {
    throw new ProtocolError(`${what}: not valid UTF-8 JSON`);
  }
  if (!isObject(v)) throw new ProtocolError(`${what}: not a JSON object`);
  return v;
}

export function encode(v: unknown): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(v));
}

/** Typed field readers: a missing optional field is undefined; a wrong type is a ProtocolError. */
export class Fields {
  private readonly obj: JsonObject;
  private readonly what: string;
  constructor(obj: JsonObject, what: string) {
    this.obj = obj;
    this.what = what;
  }

  private bad(key: string, want: string): never {
    throw new ProtocolError(`${this.what}: field ${key} must be ${want}`);
  }

  str(key: string): string {
    const v = this.obj[key];
    if (typeof v !== "string" || v === "") this.bad(key, "a non-empty string");
    return v;
  }

  optStr(key: string): string | undefined {
    const v = this.obj[key];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "string") this.bad(key, "a string");
    return v;
  }

  bool(key: string): boolean {
    const v = this.obj[key];
    if (v === undefined || v === null) return false;
    if (typeof v !== "boolean") this.bad(key, "a boolean");
    return v;
  }

  optInt(key: string): number | undefined {
    const v = this.obj[key];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isSafeInteger(v)) this.bad(key, "an integer");
    return v;
  }

  optObject(key: string): JsonObject | undefined {
    const v = this.obj[key];
    if (v === undefined || v === null) return undefined;
    if (!isObject(v)) this.bad(key, "an object");
    return v;
  }

  array(key: string): unknown[] {
    const v = this.obj[key];
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) this.bad(key, "an array");
    return v;
  }
}

/**
 * Finds the first object key that differs from another key of the same object only in case
 * (`backend` and `Backend`). kubeclip's Go decoder matches keys case-insensitively and so refuses
 * such payloads; the plugin reports them first, naming the path.
 */
export function findCaseVariantKey(v: unknown, path: string): string | undefined {
  if (Array.isArray(v)) {
    for (const [i, item] of v.entries()) {
      const found = findCaseVariantKey(item, `${path}[${i}]`);
      if (found) return found;
    }
    return undefined;
  }
  if (!isObject(v)) return undefined;
  const seen = new Map<string, string>();
  for (const key of Object.keys(v)) {
    const folded = key.toLowerCase();
    const other = seen.get(folded);
    if (other !== undefined) return `${path}.${key} (and ${path}.${other})`;
    seen.set(folded, key);
  }
  for (const [key, item] of Object.entries(v)) {
    const found = findCaseVariantKey(item, `${path}.${key}`);
    if (found) return found;
  }
  return undefined;
}
