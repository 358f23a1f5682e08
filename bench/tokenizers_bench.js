#!/usr/bin/env node
// Hugging Face `tokenizers` (official Node bindings, installed in tests/node) on the same
// texts as bench/tokenizer_bench.cpp, for a side-by-side. Prints one JSON line:
//   {"inputs": N, "tokens": T, "seconds": S}
// usage: node tokenizers_bench.js TOKENIZER_JSON TEXTS_JSONL [REPEATS]
// Single-threaded when run with TOKENIZERS_PARALLELISM=false (the library's own switch).
'use strict'
const fs = require('fs')
const path = require('path')
const { Tokenizer } = require(path.join(__dirname, '..', 'tests', 'node', 'node_modules', 'tokenizers'))

const [tokPath, textsPath, repeatsArg] = process.argv.slice(2)
const repeats = Number(repeatsArg || 3)
const tok = Tokenizer.fromFile(tokPath)
const texts = fs.readFileSync(textsPath, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l))

async function pass() {
  const t0 = process.hrtime.bigint()
  let tokens = 0
  for (let s = 0; s < texts.length; s += 4096) {  // the batch size of tokenizer_bench.cpp
    const encs = await tok.encodeBatch(texts.slice(s, s + 4096))
    for (const e of encs) tokens += e.getIds().length
  }
  return { tokens, seconds: Number(process.hrtime.bigint() - t0) / 1e9 }
}

;(async () => {
  let best = null
  for (let r = 0; r < repeats; ++r) {
    const p = await pass()
    if (!best || p.seconds < best.seconds) best = p
  }
  console.log(JSON.stringify({ inputs: texts.length, tokens: best.tokens, seconds: best.seconds }))
})().catch((e) => { console.error(e); process.exit(1) })
