// kubeclip's request/reply services on core NATS: `<prefix>.api.validate` (pkg/policy's verdict on
// a provider config) and `<prefix>.api.ping` (which worker kinds are up).

import { errors, type NatsConnection } from "@nats-io/transport-node";
import { ProtocolError, UnreachableError, errorMessage } from "./errors.js";
import { Fields, encode, isObject, parseObject, type JsonObject } from "./json.js";

export interface ValidateVerdict {
  ok: boolean;
  /** `config.x: message`, as Paperclip shows them. */
  errors: string[];
  warnings: string[];
  normalizedConfig: JsonObject | undefined;
}

/** Asks kubeclip to validate a provider config. No responder or no answer → UnreachableError. */
export async function validateConfig(
  nc: NatsConnection,
  prefix: string,
  config: JsonObject,
  opts: { timeoutMs: number; display: string },
): Promise<ValidateVerdict> {
  const subject = `${prefix}.api.validate`;
  let data: Uint8Array;
  try {
    const msg = await nc.request(subject, encode({ config }), { timeout: opts.timeoutMs });
    data = msg.data;
  } catch (err) {
    throw new UnreachableError(opts.display, requestFailure(err, subject));
  }
  const reply = parseObject(data, `${subject} reply`);
  const f = new Fields(reply, `${subject} reply`);
  const verdict: ValidateVerdict = {
    ok: f.bool("ok"),
    errors: f.array("errors").map((e, i) => fieldError(e, i, subject)),
    warnings: f.array("warnings").map((w, i) => {
      if (typeof w !== "string") throw new ProtocolError(`${subject} reply: warnings[${i}] must be a string`);
      return w;
    }),
    normalizedConfig: f.optObject("normalizedConfig"),
  };
  if (!verdict.ok && verdict.errors.length === 0) verdict.errors.push("config: kubeclip refused the config without a reason");
  return verdict;
}

function fieldError(e: unknown, i: number, subject: string): string {
  if (!isObject(e)) throw new ProtocolError(`${subject} reply: errors[${i}] must be an object`);
  const f = new Fields(e, `${subject} reply errors[${i}]`);
  const message = f.str("message");
  const field = f.optStr("field");
  return field ? `${field}: ${message}` : message;
}

export interface PingReply {
  worker: string;
  replica: string;
  version: string;
}

/** Worker kinds kubeclip runs; a healthy installation has every one answering. */
export const WORKER_KINDS = ["tenant-worker", "dispatcher", "run-watcher", "exec-worker"] as const;

/** Collects ping replies for windowMs. Malformed replies are skipped (reported in `invalid`). */
export async function ping(
  nc: NatsConnection,
  prefix: string,
  windowMs: number,
): Promise<{ replies: PingReply[]; invalid: number }> {
  const subject = `${prefix}.api.ping`;
  const replies: PingReply[] = [];
  let invalid = 0;
  let it: AsyncIterable<{ data: Uint8Array }>;
  try {
    it = await nc.requestMany(subject, encode({}), { maxWait: windowMs, strategy: "timer" });
  } catch (err) {
    if (err instanceof errors.NoRespondersError) return { replies, invalid };
    throw err;
  }
  try {
    for await (const m of it) {
      try {
        const f = new Fields(parseObject(m.data, `${subject} reply`), `${subject} reply`);
        replies.push({ worker: f.str("worker"), replica: f.optStr("replica") ?? "", version: f.optStr("version") ?? "" });
      } catch {
        invalid++;
      }
    }
  } catch (err) {
    // requestMany ends its iterator with NoResponders when nobody is subscribed.
    if (!(err instanceof errors.NoRespondersError) && !(err instanceof errors.RequestError)) throw err;
  }
  return { replies, invalid };
}

function requestFailure(err: unknown, subject: string): string {
  if (err instanceof errors.NoRespondersError) return `no kubeclip worker answers ${subject}`;
  if (err instanceof errors.TimeoutError) return `no answer on ${subject} in time`;
  if (err instanceof errors.RequestError && err.isNoResponders()) return `no kubeclip worker answers ${subject}`;
  return errorMessage(err);
}
