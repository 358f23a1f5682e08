#!/usr/bin/env node
// Oracle for meshtrain's tokenizer conformance test: Hugging Face `tokenizers` (official
// Node bindings) encodes the inputs read from stdin and prints one JSON line per input.
//
//   node hf_encode.js --json tokenizer.json            [options] < inputs.jsonl
//   node hf_encode.js --wordpiece vocab.txt --lowercase 0|1 [options]
//   node hf_encode.js --bpe encoder.json vocab.bpe     [options]
// options: --max-length N --strategy longest_first|only_first|only_second
//          --truncate-left --pad-to N --pad-longest --pad-left --pad-id N --no-special --decode --chunk N
//          --no-mask (leave attention_mask out: it is all ones without padding)
//          --decode-every K (decode only inputs whose index is a multiple of K)
// Each input line is a JSON array: ["text"] or ["text a", "text b"] (JSON so that tabs,
// empty strings and any Unicode survive). Each output line is
//   {"ids": [...], "type_ids": [...], "attention_mask": [...], "decoded": "..."}
// or {"error": "..."} when the library rejects the input (e.g. truncation impossible).
'use strict'
const fs = require('fs')
const { Tokenizer } = require('tokenizers')

const argv = process.argv.slice(2)
const opt = { chunk: 2000 }
for (let i = 0; i < argv.length; ++i) {
  const a = argv[i]
  if (a === '--json') opt.json = argv[++i]
  else if (a === '--wordpiece') opt.wordpiece = argv[++i]
  else if (a === '--lowercase') opt.lowercase = argv[++i] === '1'
  else if (a === '--bpe') { opt.bpeVocab = argv[++i]; opt.bpeMerges = argv[++i] }
  else if (a === '--max-length') opt.maxLength = Number(argv[++i])
  else if (a === '--strategy') opt.strategy = argv[++i]
  else if (a === '--truncate-left') opt.truncateLeft = true
  else if (a === '--pad-to') opt.padTo = Number(argv[++i])
  else if (a === '--pad-longest') opt.padLongest = true
  else if (a === '--pad-left') opt.padLeft = true
  else if (a === '--pad-id') opt.padId = Number(argv[++i])
  else if (a === '--no-special') opt.noSpecial = true
  else if (a === '--decode') opt.decode = true
  else if (a === '--decode-every') { opt.decode = true; opt.decodeEvery = Number(argv[++i]) }
  else if (a === '--no-mask') opt.noMask = true
  else if (a === '--chunk') opt.chunk = Number(argv[++i])
  else { console.error(`hf_encode.js: unknown argument ${a}`); process.exit(2) }
}

// vocab.txt and encoder.json + vocab.bpe become the tokenizer.json Hugging Face's
// BertWordPieceTokenizer / GPT-2 tokenizer would save, so one loader covers all cases.
function wordpieceJson(path, lowercase) {
  const vocab = {}
  fs.readFileSync(path, 'utf8').split('\n').forEach((line, i, all) => {
    if (i === all.length - 1 && line === '') return
    vocab[line.trimEnd()] = i
  })
  const special = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'].filter((t) => t in vocab)
  return {
    version: '1.0',
    added_tokens: special.map((t) => ({ id: vocab[t], content: t, single_word: false, lstrip: false, rstrip: false,
                                       normalized: false, special: true })),
    normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase },
    pre_tokenizer: { type: 'BertPreTokenizer' },
    post_processor: { type: 'BertProcessing', sep: ['[SEP]', vocab['[SEP]']], cls: ['[CLS]', vocab['[CLS]']] },
    decoder: { type: 'WordPiece', prefix: '##', cleanup: true },
    model: { type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##', max_input_chars_per_word: 100, vocab },
  }
}

function bpeJson(vocabPath, mergesPath) {
  const vocab = JSON.parse(fs.readFileSync(vocabPath, 'utf8'))
  const merges = fs.readFileSync(mergesPath, 'utf8').split('\n')
    .filter((l, i, all) => !l.startsWith('#version') && !(i === all.length - 1 && l === ''))
  const added = '<|endoftext|>' in vocab
    ? [{ id: vocab['<|endoftext|>'], content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false,
         normalized: false, special: true }] : []
  return {
    version: '1.0',
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
             fuse_unk: false, byte_fallback: false, vocab, merges },
  }
}

let tok
if (opt.json) tok = Tokenizer.fromFile(opt.json)
else if (opt.wordpiece) tok = Tokenizer.fromString(JSON.stringify(wordpieceJson(opt.wordpiece, opt.lowercase !== false)))
else if (opt.bpeVocab) tok = Tokenizer.fromString(JSON.stringify(bpeJson(opt.bpeVocab, opt.bpeMerges)))
else { console.error('hf_encode.js: pass --json, --wordpiece or --bpe'); process.exit(2) }

const strategies = { longest_first: 'LongestFirst', only_first: 'OnlyFirst', only_second: 'OnlySecond' }
if (opt.maxLength !== undefined) {
  tok.setTruncation(opt.maxLength, { strategy: strategies[opt.strategy || 'longest_first'],
                                      direction: opt.truncateLeft ? 'left' : 'right' })
}
if (opt.padTo !== undefined || opt.padLongest) {
  const p = { direction: opt.padLeft ? 'left' : 'right' }
  if (opt.padTo !== undefined) p.maxLength = opt.padTo
  if (opt.padId !== undefined) p.padId = opt.padId
  tok.setPadding(p)
}
const encodeOptions = { addSpecialTokens: !opt.noSpecial }

function record(e, decoded) {
  const r = { ids: e.getIds(), type_ids: e.getTypeIds() }
  if (!opt.noMask) r.attention_mask = e.getAttentionMask()
  if (decoded !== undefined) r.decoded = decoded
  return JSON.stringify(r)
}

async function run() {
  const inputs = fs.readFileSync(0, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l))
  const out = []
  for (let s = 0; s < inputs.length; s += opt.chunk) {
    const chunk = inputs.slice(s, s + opt.chunk)
    const batch = chunk.map((x) => (x.length === 2 ? [x[0], x[1]] : x[0]))
    let encodings
    try {
      encodings = await tok.encodeBatch(batch, encodeOptions)
    } catch (err) {
      // This binding's encodeBatch takes no pairs, and one bad input fails a whole batch:
      // encode such chunks one input at a time (concurrently), keeping errors per input.
      encodings = await Promise.all(chunk.map((x) =>
        tok.encode(x[0], x.length === 2 ? x[1] : null, encodeOptions)
          .catch((e) => ({ error: String(e && e.message ? e.message : e) }))))
      if (opt.padLongest) {
        // Batch padding as encodeBatch does it: every encoding padded to the longest.
        const ok = encodings.filter((e) => !e.error)
        const longest = Math.max(0, ...ok.map((e) => e.getLength()))
        ok.forEach((e) => e.pad(longest, { direction: opt.padLeft ? 'left' : 'right', padId: opt.padId || 0 }))
      }
    }
    let decoded = []
    if (opt.decode) {
      const every = opt.decodeEvery || 1
      const want = encodings.map((e, i) => !e.error && (s + i) % every === 0)
      const texts = await tok.decodeBatch(encodings.filter((e, i) => want[i]).map((e) => e.getIds()), true)
      let k = 0
      decoded = encodings.map((e, i) => (want[i] ? texts[k++] : undefined))
    }
    encodings.forEach((e, i) => out.push(e.error ? JSON.stringify({ error: e.error }) : record(e, decoded[i])))
  }
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''))
}

run().catch((e) => { console.error(`hf_encode.js: ${e && e.stack ? e.stack : e}`); process.exit(1) })
