// kubeclip's exec protocol JSON Schemas (docs/schemas/exec-*.json, checked against the Go types
// by pkg/execproto's tests), compiled with Ajv's draft 2020-12 validator: the plugin's requests
// and the fake exec-worker's answers are checked against the same files the Go side is.

import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import { repoRoot } from "./nats-server.js";

export type ExecSchema =
  | "exec-start"
  | "exec-attach"
  | "exec-signal"
  | "exec-started"
  | "exec-exit"
  | "exec-error"
  | "exec-signaled"
  | "exec-notice"
  | "exec-stdin-reply"
  | "exec-resize-reply";

let compiled: Map<string, ValidateFunction> | undefined;

function schemaDir(): string {
  return join(repoRoot(), "docs", "schemas");
}

function validators(): Map<string, ValidateFunction> {
  if (compiled) return compiled;
  // strict: an unknown keyword in a schema is an error, so no check passes by being ignored.
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  const out = new Map<string, ValidateFunction>();
  for (const file of readdirSync(schemaDir())) {
    if (!file.startsWith("exec-") || !file.endsWith(".json")) continue;
    const schema = JSON.parse(readFileSync(join(schemaDir(), file), "utf8")) as object;
    out.set(file.slice(0, -".json".length), ajv.compile(schema));
  }
  compiled = out;
  return out;
}

/** The names of every exec schema in docs/schemas. */
export function execSchemaNames(): string[] {
  return [...validators().keys()].sort();
}

/** Why value does not match the schema, or undefined when it does. */
export function schemaErrors(name: ExecSchema, value: unknown): string | undefined {
  const v = validators().get(name);
  if (!v) throw new Error(`no schema ${name}.json in ${schemaDir()}`);
  if (v(value)) return undefined;
  return (v.errors ?? [])
    .map((e) => `${e.instancePath || "/"} ${e.message ?? "is invalid"}${"additionalProperty" in e.params ? ` (${String(e.params.additionalProperty)})` : ""}`)
    .join("; ");
}

/** The field a schema error is about (the first path segment), for invalid_request answers. */
export function schemaField(name: ExecSchema, value: unknown): string {
  const v = validators().get(name);
  if (!v || v(value)) return "";
  const e = v.errors?.[0];
  if (!e) return "";
  if ("additionalProperty" in e.params) return String(e.params.additionalProperty);
  if ("missingProperty" in e.params) return String(e.params.missingProperty);
  return e.instancePath.split("/")[1] ?? "";
}
