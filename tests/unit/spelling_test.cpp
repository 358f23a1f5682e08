// "Did you mean" for what users type: edit distance, prefixes and initials.
#include <gtest/gtest.h>

#include "meshtrain/core/spelling.h"

namespace mt {
namespace {

TEST(Spelling, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("n_layers", "n_layer"), 1u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
}

TEST(Spelling, NearestKnownName) {
  const std::vector<std::string> keys = {"n_embd", "n_layer", "n_head", "n_positions", "vocab_size"};
  EXPECT_EQ(nearest_spelling("n_layers", keys), "n_layer");
  EXPECT_EQ(nearest_spelling("vocab", keys), "vocab_size");  // a prefix
  EXPECT_EQ(nearest_spelling("temperature", keys), "");     // nothing close
  const std::vector<std::string> commands = {"generate", "tokenize", "pretrain", "glue"};
  EXPECT_EQ(nearest_spelling("generat", commands), "generate");
  EXPECT_EQ(nearest_spelling("pretrian", commands), "pretrain");
  const std::vector<std::string> flags = {"--steps", "--learning-rate", "--output-dir", "--seed"};
  EXPECT_EQ(nearest_spelling("--stepz", flags), "--steps");
  EXPECT_EQ(nearest_spelling("--learning_rat", flags), "--learning-rate");
  EXPECT_EQ(nearest_spelling("--lr", flags), "--learning-rate");  // initials
  EXPECT_EQ(nearest_spelling("--od", flags), "--output-dir");
}

}  // namespace
}  // namespace mt
