// kubeclip's users and accounts as shipped (deploy/kustomize/base/nats-auth.conf), for tests
// that run the plugin under them.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { repoRoot } from "./nats-server.js";

/**
 * The shipped nats-auth.conf, its passwords set (paperclip's: pcpw), and the test's kubeclip
 * (user admin, every permission) in the KUBECLIP account beside the workers' users.
 */
export function shippedConf(): string {
  const conf = readFileSync(join(repoRoot(), "deploy/kustomize/base/nats-auth.conf"), "utf8")
    .replace("$KUBECLIP_NATS_PASSWORD_PAPERCLIP", "pcpw")
    .replace(/\$KUBECLIP_NATS_PASSWORD_\w+/g, '"unused"');
  const at = conf.indexOf("  KUBECLIP {\n    jetstream: enabled\n    users: [\n");
  if (at < 0) throw new Error("nats-auth.conf has no KUBECLIP account with JetStream and users");
  const head = "  KUBECLIP {\n    jetstream: enabled\n    users: [\n";
  return `${conf.slice(0, at)}${head}      {user: admin, password: admin}\n${conf.slice(at + head.length)}`;
}
