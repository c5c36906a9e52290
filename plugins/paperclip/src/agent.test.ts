import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { isAgentCommand } from "./agent.js";

describe("isAgentCommand", () => {
  const wrapped = `out_log=/w/.paperclip-runtime/run-1-stdout.log; { { 'claude' '--print' '--output-format' 'stream-json' '--verbose' 3>&-; printf '%s' "$?" > "$status_file"; } 2>&1 1>&3 | tee -a "$err_log" >&2; } 3>&1 | tee -a "$out_log"`;
  const cases: { name: string; command: string; args: string[]; adapter?: string; want: boolean }[] = [
    { name: "claude --print (streamRunLogs false)", command: "claude", args: ["--print", "--output-format", "stream-json"], adapter: "claude_local", want: true },
    { name: "claude by path", command: "/usr/local/bin/claude", args: ["-p"], adapter: "claude_local", want: true },
    { name: "wrapped in sh -c (tail mode)", command: "sh", args: ["-c", wrapped], adapter: "claude_local", want: true },
    { name: "codex exec", command: "codex", args: ["exec", "--json"], adapter: "codex_local", want: true },
    { name: "adapter unknown: any known CLI", command: "codex", args: ["exec"], want: true },
    { name: "probe: command -v", command: "sh", args: ["-c", "command -v 'claude' >/dev/null 2>&1"], adapter: "claude_local", want: false },
    { name: "probe then mkdir -p", command: "sh", args: ["-c", "command -v claude; mkdir -p /w -p"], adapter: "claude_local", want: false },
    { name: "version probe", command: "claude", args: ["--version"], adapter: "claude_local", want: false },
    { name: "another adapter's CLI", command: "codex", args: ["exec"], adapter: "claude_local", want: false },
    { name: "upload", command: "sh", args: ["-c", "base64 -d >> /w/x.paperclip-upload.b64"], adapter: "claude_local", want: false },
    { name: "bridge poll", command: "sh", args: ["-c", "for file in /q/requests/*.json; do basename \"$file\"; done"], want: false },
  ];
  for (const tc of cases) {
    it(tc.name, () => {
      assert.equal(isAgentCommand(tc.command, tc.args, tc.adapter), tc.want);
    });
  }
});
