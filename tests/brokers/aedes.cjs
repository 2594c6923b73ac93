// A second MQTT broker for the interop tests: aedes (MQTT 3.1.1) on a TCP port and a
// WebSocket port of its own (aedes-server-factory). Prints "ready" once both listen.
const { Aedes } = require('aedes')
const { createServer } = require('aedes-server-factory')

async function main () {
  const [tcpPort, wsPort] = process.argv.slice(2).map(Number)
  const broker = await Aedes.createBroker()
  const tcp = createServer(broker)
  const ws = createServer(broker, { ws: true })
  await new Promise((resolve) => tcp.listen(tcpPort, '127.0.0.1', resolve))
  await new Promise((resolve) => ws.listen(wsPort, '127.0.0.1', resolve))
  console.log('ready')
  process.on('SIGTERM', () => { tcp.close(); ws.close(); broker.close(() => process.exit(0)) })
}

main().catch((err) => { console.error(err); process.exit(1) })
