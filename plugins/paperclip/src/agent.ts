// Which execute call is the agent itself. kubeclip records that one exec's output in the run
// stream (`record: true`, docs/exec.md) so `kubeclip runs follow` shows the agent; the ~90 other
// calls of a run (probes, base64 uploads, bridge polls, log tails) are not recorded.
//
// The rule: the command is the adapter's CLI, or a `sh -c` / `bash -c` script that invokes it,
// and the invocation carries the CLI's non-interactive run flag (`claude --print`, `codex exec`,
// …). `command -v claude` and `claude --version` are probes, not the agent.

/** Adapter type → its CLI and the arguments that mark a non-interactive agent run. */
export const AGENT_CLIS: Readonly<Record<string, { cli: string; runArgs: readonly string[] }>> = {
  claude_local: { cli: "claude", runArgs: ["--print", "-p"] },
  codex_local: { cli: "codex", runArgs: ["exec", "e"] },
  gemini_local: { cli: "gemini", runArgs: ["--prompt", "-p", "--output-format"] },
  cursor_local: { cli: "cursor-agent", runArgs: ["--print", "-p"] },
  opencode_local: { cli: "opencode", runArgs: ["run"] },
  pi_local: { cli: "pi", runArgs: ["--print", "-p", "--mode"] },
  grok_local: { cli: "grok", runArgs: ["--print", "-p", "--prompt"] },
  acpx_local: { cli: "acpx", runArgs: ["exec", "--print"] },
};

const SHELLS = new Set(["sh", "bash", "dash", "zsh"]);

function basename(p: string): string {
  return p.slice(p.lastIndexOf("/") + 1);
}

function clisFor(adapterType: string | undefined): { cli: string; runArgs: readonly string[] }[] {
  const one = adapterType ? AGENT_CLIS[adapterType] : undefined;
  return one ? [one] : Object.values(AGENT_CLIS);
}

/** Whether command + args run the agent of adapterType (any known adapter when unknown). */
export function isAgentCommand(command: string, args: readonly string[], adapterType?: string): boolean {
  const name = basename(command);
  const clis = clisFor(adapterType);
  for (const { cli, runArgs } of clis) {
    if (name === cli) return args.some((a) => runArgs.includes(a));
  }
  if (SHELLS.has(name)) {
    const i = args.findIndex((a) => a === "-c" || a === "-lc");
    const script = i >= 0 ? args[i + 1] : undefined;
    if (script !== undefined) return scriptRunsAgent(script, clis);
  }
  return false;
}

function scriptRunsAgent(script: string, clis: { cli: string; runArgs: readonly string[] }[]): boolean {
  // Simple commands of the script (split at ; & | newlines and grouping), their words with shell
  // quotes removed: good enough to find `'claude' '--print'` in Paperclip's wrapper scripts.
  for (const segment of script.split(/[;&|\n(){}]+/)) {
    const words = segment.trim().split(/\s+/).map((w) => w.replace(/^['"]|['"]$/g, ""));
    for (const { cli, runArgs } of clis) {
      const i = words.findIndex((w) => basename(w) === cli);
      if (i < 0) continue;
      if (words[i - 1] === "-v" && words[i - 2] === "command") continue; // `command -v claude`
      if (words.slice(i + 1).some((a) => runArgs.includes(a))) return true;
    }
  }
  return false;
}
