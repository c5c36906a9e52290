// The fake kubeclip of the follow load, in a process of its own so that the driver's RSS is the
// plugin's: node kubeclip.js <nats-url>. It answers the first acquire at once (the driver's warm
// one) and every other once a message on `load.open` arrives; prints "ready" when serving.

import { connect } from "@nats-io/transport-node";
import { FakeKubeclip } from "../support/fake-kubeclip.js";

const url = process.argv[2];
if (!url) throw new Error("usage: kubeclip.js <nats-url>");
const nc = await connect({ servers: url });
const kubeclip = await FakeKubeclip.start(nc);
let open!: () => void;
const gate = new Promise<void>((resolve) => (open = resolve));
nc.subscribe("load.open", {
  callback: () => {
    open();
  },
});
let first = true;
kubeclip.onAcquire = async () => {
  if (!first) await gate;
  first = false;
  return { kind: "created" };
};
await nc.flush();
console.log("ready");
