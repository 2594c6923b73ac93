// A second MQTT broker for the interop and chunked tests: aedes 2 (MQTT 5 and 3.1.1) on a
// TCP port and a WebSocket port of its own (aedes-server-factory), with the Maximum Packet
// Size given (0: none), which its CONNACK states to MQTT 5 clients. Prints "ready" once both
// listen. aedes 2 is an ES module, hence .mjs; its node_modules are tests/_aedes.py's cache
// (NODE_PATH), which `import` does not search, so the packages are resolved from there.
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const fromCache = createRequire(`${process.env.NODE_PATH}/`)
const load = (name) => import(pathToFileURL(fromCache.resolve(name)).href)
const { Aedes } = await load('aedes')
const { createServer } = await load('aedes-server-factory')

const [tcpPort, wsPort, maximumPacketSize] = process.argv.slice(2).map(Number)
const broker = await Aedes.createBroker({ maximumPacketSize: maximumPacketSize || 0 })
const tcp = createServer(broker)
const ws = createServer(broker, { ws: true })
await new Promise((resolve) => tcp.listen(tcpPort, '127.0.0.1', resolve))
await new Promise((resolve) => ws.listen(wsPort, '127.0.0.1', resolve))
console.log('ready')
process.on('SIGTERM', () => { tcp.close(); ws.close(); broker.close(() => process.exit(0)) })
