// The worker entrypoint Paperclip forks: JSON-RPC over stdio (the SDK's host loop).
import { runWorker } from "@paperclipai/plugin-sdk";
import plugin from "./plugin.js";

runWorker(plugin, import.meta.url);
