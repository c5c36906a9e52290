// Errors the plugin throws to Paperclip. Every message is safe to show and to log: it names the
// offending field and never carries a secret (NATS credentials, env, stdin). Paperclip surfaces a
// thrown hook error's message verbatim (HTTP 422 for validation, the run's error otherwise).

/** A config value the plugin itself cannot use (NATS settings, a backend that cannot exec). */
export class ConfigError extends Error {
  override name = "ConfigError";
  /** The config path, e.g. "config.natsUrl". */
  readonly field: string;
  constructor(field: string, message: string) {
    super(`${field}: ${message}`);
    this.field = field;
  }
}

/** kubeclip could not be reached: no NATS connection, or nobody answered a request. */
export class UnreachableError extends Error {
  override name = "UnreachableError";
  constructor(url: string, reason: string) {
    super(`kubeclip unreachable at ${url}: ${reason}`);
  }
}

/**
 * kubeclip answered with a failure: a `failed` run event, or an exec `error` message. The message
 * is `<code>: <message>`, where kubeclip's message names the field.
 */
export class KubeclipError extends Error {
  override name = "KubeclipError";
  readonly code: string;
  readonly field: string | undefined;
  constructor(code: string, message: string, field?: string) {
    super(`${code}: ${message}`);
    this.code = code;
    this.field = field;
  }
}

/** A bounded wait ran out. */
export class TimeoutError extends Error {
  override name = "TimeoutError";
}

/** Malformed data from the wire (a reply or event that does not match the contract). */
export class ProtocolError extends Error {
  override name = "ProtocolError";
}

/** The message of any thrown value, for logs and wrapped errors. */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return typeof err === "string" ? err : "unknown error";
}

/**
 * Removes every occurrence of each secret from text: errors from the NATS client or the server can
 * quote what the plugin sent, and nothing the plugin throws or logs may hold a credential.
 */
export function scrub(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const s of secrets) {
    if (s.length >= 4) out = out.split(s).join("[redacted]");
  }
  return out;
}

/** A NATS URL with any user:password@ removed, for messages. */
export function redactUrl(url: string): string {
  return url.replace(/^([a-z]+:\/\/)[^@/]*@/i, "$1");
}
