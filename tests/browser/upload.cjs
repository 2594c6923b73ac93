// tus-js-client in Node against the gateway: node upload.cjs NODE_MODULES ENDPOINT FILE TOPIC MODE
// MODE "with-upload": the first chunk rides in the POST (creation-with-upload), the rest PATCHed;
// MODE "parallel": parallelUploads: 3 (tus concatenation). Prints what the final answer said.
'use strict'
const path = require('path')
const fs = require('fs')
const [modules, endpoint, file, topic, mode] = process.argv.slice(2)
const tus = require(path.join(modules, 'tus-js-client'))

const data = fs.readFileSync(file)
const seen = { requests: [] }
const options = {
  endpoint,
  chunkSize: 64 * 1024,
  retryDelays: [],
  metadata: { topic, filename: path.basename(file), filetype: 'application/x-node' },
  onAfterResponse (req, res) {
    seen.requests.push(`${req.getMethod()} ${res.getStatus()}`)
    const url = res.getHeader('X-Offload-Url')
    if (url) {
      seen.url = url
      seen.id = res.getHeader('X-Offload-Id')
      seen.sha256 = res.getHeader('X-Offload-Sha256')
    }
  },
  onError (err) {
    console.error(String(err))
    process.exit(1)
  },
  onSuccess () {
    console.log(JSON.stringify(seen))
  }
}
if (mode === 'with-upload') {
  options.uploadDataDuringCreation = true
} else if (mode === 'parallel') {
  options.parallelUploads = 3
  options.metadataForPartialUploads = { topic }
} else {
  throw new Error(`unknown mode ${mode}`)
}
new tus.Upload(data, options).start()
