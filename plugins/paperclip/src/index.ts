export { default as manifest } from "./manifest.js";
export { default as plugin, createPlugin } from "./plugin.js";
