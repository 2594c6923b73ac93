// An unmodified mqtt.js client: `node peer.js pub URL TOPIC FILE VERSION QOS` publishes the
// file, `node peer.js sub URL TOPIC VERSION` prints "ready" once subscribed, then the
// first message's size and SHA-256 as JSON, and exits.
const mqtt = require("mqtt");
const crypto = require("crypto");
const fs = require("fs");

const [mode, url, topic, ...rest] = process.argv.slice(2);
const fail = (err) => { console.error(String(err)); process.exit(1); };

if (mode === "pub") {
  const [file, version, qos] = rest;
  const client = mqtt.connect(url, { protocolVersion: Number(version), reconnectPeriod: 0 });
  client.on("error", fail);
  client.on("connect", () => {
    client.publish(topic, fs.readFileSync(file), { qos: Number(qos) }, (err) => {
      if (err) fail(err);
      client.end(false, () => process.exit(0));
    });
  });
} else {
  const [version] = rest;
  const client = mqtt.connect(url, { protocolVersion: Number(version), reconnectPeriod: 0 });
  client.on("error", fail);
  client.on("connect", () => {
    client.subscribe(topic, { qos: 1 }, (err) => {
      if (err) fail(err);
      console.log("ready");
    });
  });
  client.on("message", (_topic, payload) => {
    const sha256 = crypto.createHash("sha256").update(payload).digest("hex");
    console.log(JSON.stringify({ size: payload.length, sha256 }));
    client.end(false, () => process.exit(0));
  });
}
