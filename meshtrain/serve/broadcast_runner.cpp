#include "meshtrain/serve/broadcast_runner.h"

#include <iostream>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"

namespace mt::serve {

namespace {

// A call as rank 0 sends it: [kind, a, b, n, values...] of i64, preceded by its length.
enum class Call : int64_t { prefill = 1, fork = 2, decode = 3, drop = 4, shutdown = 5 };

void send(Call kind, int64_t a, int64_t b, const std::vector<int64_t>& values) {
  std::vector<int64_t> msg = {int64_t(kind), a, b, int64_t(values.size())};
  msg.insert(msg.end(), values.begin(), values.end());
  int64_t length = int64_t(msg.size());
  dist::world().broadcast(&length, 1, DType::i64, 0);
  dist::world().broadcast(msg.data(), length, DType::i64, 0);
}

std::vector<int64_t> receive() {
  int64_t length = 0;
  dist::world().broadcast(&length, 1, DType::i64, 0);
  MT_CHECK(length >= 4 && length < (int64_t(1) << 32), "[serve] a step message of ", length, " words from rank 0");
  std::vector<int64_t> msg(static_cast<size_t>(length));
  dist::world().broadcast(msg.data(), length, DType::i64, 0);
  return msg;
}

}  // namespace

std::vector<float> BroadcastRunner::prefill(const std::vector<int64_t>& seqs,
                                            const std::vector<std::vector<int64_t>>& prompts) {
  // [seq, length, tokens...] per prompt.
  MT_CHECK(seqs.size() == prompts.size(), "[serve] ", seqs.size(), " sequences for ", prompts.size(), " prompts");
  std::vector<int64_t> values;
  for (size_t i = 0; i < seqs.size(); ++i) {
    values.push_back(seqs[i]);
    values.push_back(int64_t(prompts[i].size()));
    values.insert(values.end(), prompts[i].begin(), prompts[i].end());
  }
  send(Call::prefill, int64_t(seqs.size()), 0, values);
  return local_.prefill(seqs, prompts);
}

void BroadcastRunner::fork(int64_t from, int64_t to) {
  send(Call::fork, from, to, {});
  local_.fork(from, to);
}

std::vector<float> BroadcastRunner::decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) {
  std::vector<int64_t> values = seqs;
  values.insert(values.end(), tokens.begin(), tokens.end());
  send(Call::decode, int64_t(seqs.size()), 0, values);
  return local_.decode(seqs, tokens);
}

void BroadcastRunner::drop(int64_t seq) {
  send(Call::drop, seq, 0, {});
  local_.drop(seq);
}

void BroadcastRunner::shutdown() { send(Call::shutdown, 0, 0, {}); }

void follow_steps(models::CausalLm lm, const KvCacheSize& size) {
  LocalRunner local(std::move(lm), size);
  for (;;) {
    const std::vector<int64_t> msg = receive();
    const auto kind = Call(msg[0]);
    const int64_t a = msg[1], b = msg[2], n = msg[3];
    const std::vector<int64_t> values(msg.begin() + 4, msg.end());
    MT_CHECK(int64_t(values.size()) == n, "[serve] a step message announcing ", n, " values carries ", values.size());
    // Rank 0 runs the same call on the same inputs: an error there is an error here too, and
    // both engines carry on.
    try {
      switch (kind) {
        case Call::prefill: {
          std::vector<int64_t> seqs;
          std::vector<std::vector<int64_t>> prompts;
          for (size_t at = 0; at + 2 <= values.size() && int64_t(seqs.size()) < a;) {
            const int64_t len = values[at + 1];
            MT_CHECK(len >= 0 && at + 2 + size_t(len) <= values.size(), "[serve] a prefill message from rank 0 "
                     "announces a prompt of ", len, " tokens past its end");
            seqs.push_back(values[at]);
            prompts.emplace_back(values.begin() + std::ptrdiff_t(at + 2), values.begin() + std::ptrdiff_t(at + 2 + len));
            at += 2 + size_t(len);
          }
          MT_CHECK(int64_t(seqs.size()) == a, "[serve] a prefill message from rank 0 announces ", a,
                   " prompts and carries ", seqs.size());
          local.prefill(seqs, prompts);
          break;
        }
        case Call::fork: local.fork(a, b); break;
        case Call::decode:
          local.decode(std::vector<int64_t>(values.begin(), values.begin() + a),
                       std::vector<int64_t>(values.begin() + a, values.end()));
          break;
        case Call::drop: local.drop(a); break;
        case Call::shutdown: return;
        default: MT_CHECK(false, "[serve] unknown step message kind ", msg[0], " from rank 0");
      }
    } catch (const Error& e) {
      if (kind != Call::prefill && kind != Call::fork && kind != Call::decode) throw;
    }
  }
}

}  // namespace mt::serve
