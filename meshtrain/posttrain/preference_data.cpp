#include "meshtrain/posttrain/preference_data.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/train/row_padding.h"

namespace mt::posttrain {

data::Example preference_example(const PreferencePair& pair, int64_t seq_len, int64_t pad_id, bool* truncated) {
  MT_CHECK(!pair.chosen.empty() && !pair.rejected.empty(), "[dpo] a preference pair needs a chosen and a rejected response");
  MT_CHECK(seq_len >= 2, "[dpo] sequences of ", seq_len, " tokens cannot hold a prompt and a response");
  const int64_t room = seq_len + 1;
  const int64_t longest = int64_t(std::max(pair.chosen.size(), pair.rejected.size()));
  int64_t prompt_len = int64_t(pair.prompt.size());
  const bool fits = prompt_len + longest <= room;
  // The prompt's end says what is asked: keep it, up to half the sequence, when the pair
  // does not fit; the responses then keep their start.
  if (!fits) prompt_len = std::min(prompt_len, std::max(room - longest, room / 2));
  if (truncated) *truncated = !fits;
  data::Example e;
  for (const char* side : {"chosen", "rejected"}) {
    const std::vector<int64_t>& response = std::string(side) == "chosen" ? pair.chosen : pair.rejected;
    std::vector<int64_t> tokens(pair.prompt.end() - prompt_len, pair.prompt.end());
    std::vector<int64_t> targets(tokens.size(), -100);
    for (int64_t id : response) {
      if (int64_t(tokens.size()) == room) break;
      tokens.push_back(id);
      targets.push_back(id);
    }
    tokens.resize(size_t(room), pad_id);
    targets.resize(size_t(room), -100);
    e.set(std::string(side) + "_tokens", tokens);
    e.set(std::string(side) + "_targets", targets);
  }
  return e;
}

train::CollateFn preference_collate(int64_t pad_multiple) {
  MT_CHECK(pad_multiple >= 0, "[dpo] pad multiple ", pad_multiple, " is negative");
  return [pad_multiple](const std::vector<data::Example>& examples) {
    MT_CHECK(!examples.empty(), "[dpo] an empty batch");
    const int64_t n = int64_t(examples.size());
    const int64_t t = int64_t(examples[0].tokens("chosen_tokens").size()) - 1;
    train::Batch batch;
    std::vector<int64_t> side_ids[2], side_labels[2];
    for (int k = 0; k < 2; ++k) {
      const std::string s = k == 0 ? "chosen" : "rejected";
      std::vector<int64_t>& ids = side_ids[k];
      std::vector<int64_t>& labels = side_labels[k];
      ids.reserve(size_t(n * t));
      labels.reserve(size_t(n * t));
      for (const data::Example& e : examples) {
        const std::vector<int64_t>& tok = e.tokens(s + "_tokens");
        const std::vector<int64_t>& tgt = e.tokens(s + "_targets");
        MT_CHECK(int64_t(tok.size()) == t + 1 && tgt.size() == tok.size(), "[dpo] sequences of different lengths in a batch: ",
                 tok.size(), " and ", t + 1);
        ids.insert(ids.end(), tok.begin(), tok.end() - 1);
        labels.insert(labels.end(), tgt.begin() + 1, tgt.end());
      }
    }
    // Both sides cut to one width, the longer side's: a captured step replays one graph per
    // batch shape, and a width per side would square the shapes a run meets.
    int64_t width = t;
    if (pad_multiple > 0)
      width = std::max(train::columns_in_use(side_labels[0], n, t, -100, pad_multiple),
                       train::columns_in_use(side_labels[1], n, t, -100, pad_multiple));
    for (int k = 0; k < 2; ++k) {
      const std::string s = k == 0 ? "chosen" : "rejected";
      train::keep_columns(side_ids[k], n, t, width);
      train::keep_columns(side_labels[k], n, t, width);
      batch.set(s + "_input_ids", Array::from_vector(side_ids[k], {n, width}));
      batch.set(s + "_labels", Array::from_vector(side_labels[k], {n, width}));
    }
    if (examples[0].contains("ref_chosen_logp")) {
      for (const char* key : {"chosen_logp", "rejected_logp", "chosen_tokens", "rejected_tokens"}) {
        std::vector<float> v;
        for (const data::Example& e : examples) v.push_back(float(e.as_float(std::string("ref_") + key)));
        const std::string name = std::string("ref_") + key;
        batch.set(name.back() == 'p' ? name + "s" : name, Array::from_vector(v, {n}));
      }
    }
    return batch;
  };
}

std::vector<train::PaddedFields> preference_padded_fields() {
  return {{{"chosen_input_ids", 0.0}, {"chosen_labels", -100.0}, {"rejected_input_ids", 0.0}, {"rejected_labels", -100.0}}};
}

}  // namespace mt::posttrain
