// `meshtrain prepare-data`: tokenizes a corpus once into memory-mapped token shards
// (data/token_shards.h) that `pretrain --data DIR` reads without holding the corpus in
// memory. Under mpirun each process tokenizes a contiguous block of the documents into its
// own shards (a long document is cut into pieces that encode to its ids, so it is shared
// too); rank 0 then writes index.json listing every shard in document order.
#include <filesystem>
#include <iostream>
#include <algorithm>
#include <regex>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/flag_checks.h"
#include "apps/meshtrain/lm_setup.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/documents.h"
#include "meshtrain/data/token_shards.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/io/mapped_file.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;

struct PrepareFlags {
  std::string data, tokenizer = "bytes", output;
  int64_t shard_tokens = int64_t(1) << 26;  // 64 Mi ids: 128 MiB of uint16
  bool overwrite = false;
};

const std::regex kShardName("shard_r(\\d+)_(\\d+)\\.bin");
// What --overwrite removes: shards and the temp file of one a killed run left half-written.
const std::regex kShardOrTemp("shard_r\\d+_\\d+\\.bin(\\.tmp\\..+)?");

void run(const PrepareFlags& f) {
  dist::Communicator& world = dist::world();
  const int rank = world.rank(), ranks = world.size();
  if (rank == 0) {
    const bool taken = fs::exists(fs::path(f.output) / "index.json");
    MT_CHECK(!taken || f.overwrite, "[prepare-data] ", f.output,
             " already holds token shards (index.json): pass --overwrite to replace them");
    fs::create_directories(f.output);
    fs::remove(fs::path(f.output) / "index.json");  // readers never see an index of half-written shards
    for (const auto& e : fs::directory_iterator(f.output))
      if (std::regex_match(e.path().filename().string(), kShardOrTemp)) fs::remove(e.path());
  }
  world.barrier();
  auto tok = tokenizer_into(f.tokenizer, (fs::path(f.output) / "tokenizer").string());
  // A corpus is encoded whole: no truncation or padding a tokenizer.json may configure.
  tok->set_truncation(std::nullopt);
  tok->set_padding(std::nullopt);
  const std::optional<int64_t> separator = end_of_text_id(*tok);
  // Views into the memory-mapped files: no copy of the corpus is held, and each unit's pages
  // are given back once it is encoded, so a corpus larger than memory streams through.
  const data::MappedCorpus corpus(f.data);
  const std::vector<std::string_view>& docs = corpus.documents();
  MT_CHECK(!docs.empty(), "[prepare-data] ", f.data, " holds no documents");
  // The units of work: the documents, long ones cut into pieces of about 1 MiB where the
  // tokenizer encodes the pieces to the whole document's ids. So processes share a long
  // document too, and none holds a whole long document's encoding (tokens, offsets: some 70
  // bytes per token).
  struct Unit {
    size_t doc;
    std::string_view text;
    bool starts_doc;
  };
  std::vector<Unit> units;
  constexpr size_t kPieceBytes = size_t(1) << 20;
  for (size_t d = 0; d < docs.size(); ++d) {
    if (!tok->newline_cuts_are_exact()) {
      units.push_back({d, docs[d], true});
      continue;
    }
    bool first = true;
    for (std::string_view piece : data::cut_at_lines(docs[d], kPieceBytes)) {
      units.push_back({d, piece, first});
      first = false;
    }
  }
  // A contiguous block per process, so that the shards in rank order are the corpus in order.
  const size_t begin = units.size() * size_t(rank) / size_t(ranks);
  const size_t end = units.size() * size_t(rank + 1) / size_t(ranks);
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "shard_r%05d", rank);
  data::TokenShardWriter writer(f.output, prefix, tok->vocab_size(), f.shard_tokens);
  for (size_t u = begin; u < end; ++u) {
    tokenizers::Encoding e = tok->encode(units[u].text, false);
    corpus.release(units[u].text);
    if (e.ids.empty()) continue;
    // Documents are separated as PackedDataset separates them: before every one but the first.
    // (read_documents drops blank documents, so every earlier document, in any process's
    // block, put tokens in the stream: d > 0 is "not the first".)
    if (separator && units[u].starts_doc && units[u].doc > 0) writer.add({*separator});
    writer.add(std::vector<int64_t>(e.ids.begin(), e.ids.end()));
  }
  writer.finish();
  world.barrier();
  if (rank != 0) return;
  // Every process's shards, in (rank, index) order, counted from their sizes.
  std::vector<std::pair<std::string, int64_t>> shards;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(f.output))
    if (std::regex_match(e.path().filename().string(), kShardName)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  const int bytes = data::TokenShardWriter::id_bytes(tok->vocab_size());
  int64_t total = 0;
  for (const std::string& n : names) {
    const int64_t size = int64_t(fs::file_size(fs::path(f.output) / n));
    shards.emplace_back(n, size / bytes);
    total += size / bytes;
  }
  data::write_token_shard_index(f.output, tok->vocab_size(), separator, shards, f.data);
  std::cout << "prepare-data: " << docs.size() << " documents, " << total << " tokens in " << shards.size() << " shards ("
            << (bytes == 2 ? "uint16" : "uint32") << ", " << ranks << " process(es)) in " << f.output << "\n";
}

}  // namespace

void add_prepare_data_command(CLI::App& app) {
  auto f = std::make_shared<PrepareFlags>();
  CLI::App* cmd = app.add_subcommand(
      "prepare-data", "tokenize a corpus once into memory-mapped token shards for pretrain --data DIR (parallel under mpirun)");
  cmd->add_option("--data", f->data, "text file or directory (documents split as pretrain splits them)")->required();
  cmd->add_option("--tokenizer", f->tokenizer, "'bytes', or a tokenizer.json / vocab.json / vocab.txt / .model / directory")
      ->capture_default_str();
  cmd->add_option("--output", f->output, "directory for shard_*.bin, index.json and tokenizer/")->required();
  cmd->add_option("--shard-tokens", f->shard_tokens, "token ids per shard file at most")->capture_default_str()->check(positive());
  cmd->add_flag("--overwrite", f->overwrite, "replace the shards of an earlier run in --output");
  cmd->callback([f] { run(*f); });
}

}  // namespace mt::cli
