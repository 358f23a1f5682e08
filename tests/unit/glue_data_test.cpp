// The GLUE files as distributed: every shipped task reads with Hugging Face's row counts and
// label numbering (CoLA without header, MRPC behind a BOM, STS-B scores, RTE/QNLI label
// names); MNLI and QQP, too large to ship, read from files in their published layout;
// malformed rows name file and line.
#include <gtest/gtest.h>

#include "meshtrain/data/glue.h"
#include "tests/support/op_check.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

const std::string kGlue = std::string(MT_DATA_DIR) + "/glue";

TEST(GlueData, ShippedTasksHaveHuggingFaceRowCountsAndLabels) {
  // (task, split, rows, first text_a prefix, first label) — rows as HF's `glue` dataset has them.
  struct Case {
    const char* task;
    const char* split;
    size_t rows;
    const char* text_a;
    double label;
  };
  const Case cases[] = {
      {"cola", "train", 8551, "Our friends won't buy this analysis", 1},
      {"cola", "dev", 1043, "The sailors rode the breeze clear of the rocks.", 1},
      {"sst2", "dev", 872, "it 's a charming and often affecting journey . ", 1},
      {"mrpc", "train", 3667, "Amrozi accused his brother", 1},  // this copy lacks one of HF's 3668 (SOURCES.md)
      {"mrpc", "dev", 408, "He said the foodservice pie business", 1},
      {"stsb", "dev", 1500, "A man with a hard hat is dancing.", 5.0},
      {"rte", "train", 2490, "No Weapons of Mass Destruction Found in Iraq Yet.", 1},
      {"rte", "dev", 277, "Dana Reeve, the widow of the actor Christopher Reeve", 1},
      {"wnli", "dev", 71, "The drain is clogged with hair.", 0},
      {"qnli", "dev", 5463, "What came into force after the new constitution was herald?", 0},
  };
  for (const Case& c : cases) {
    const data::GlueTask& task = data::glue_task(c.task);
    std::vector<data::Example> rows = data::read_glue_split(kGlue, task, c.split);
    EXPECT_EQ(rows.size(), c.rows) << c.task << " " << c.split;
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(rows[0].str("text_a").rfind(c.text_a, 0), 0u) << c.task << ": " << rows[0].str("text_a");
    EXPECT_EQ(rows[0].contains("text_b"), !task.text_b.empty());
    if (task.is_regression()) EXPECT_DOUBLE_EQ(rows[0].as_float("label"), c.label);
    else EXPECT_EQ(rows[0].as_int("label"), int64_t(c.label)) << c.task;
  }
  // "SST-2", "sst2" and "STS-B" all name tasks; the task's own directory also works as data_dir.
  EXPECT_EQ(data::glue_task("SST-2").name, "sst2");
  EXPECT_EQ(data::glue_task("STS-B").name, "stsb");
  EXPECT_EQ(data::read_glue_split(kGlue + "/RTE", data::glue_task("rte"), "dev").size(), 277u);
  expect_error([] { data::glue_task("squad"); }, {"unknown task 'squad'", "cola", "wnli"});
}

class GlueFiles : public TempDir {};

TEST_F(GlueFiles, MnliAndQqpLayoutsAndErrors) {
  std::filesystem::create_directories(dir_ / "MNLI");
  std::filesystem::create_directories(dir_ / "QQP");
  write("MNLI/dev_matched.tsv",
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\t"
        "sentence1\tsentence2\tlabel1\tgold_label\n"
        "0\t1\t1e\tslate\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tA premise.\tA hypothesis.\tneutral\tneutral\n"
        "1\t2\t2c\tslate\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tP2\tH2\tcontradiction\tcontradiction\n");
  write("QQP/train.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n7\t1\t2\tHow?\tWhy?\t1\n");
  std::vector<data::Example> mnli = data::read_glue_split(dir_.string(), data::glue_task("mnli"), "dev_matched");
  ASSERT_EQ(mnli.size(), 2u);
  EXPECT_EQ(mnli[0].str("text_b"), "A hypothesis.");
  EXPECT_EQ(mnli[0].as_int("label"), 1);  // entailment 0, neutral 1, contradiction 2
  EXPECT_EQ(mnli[1].as_int("label"), 2);
  EXPECT_EQ(data::glue_task("mnli").dev_split, "dev_matched");
  // HF's names for MNLI on either dev set.
  EXPECT_EQ(data::glue_task("mnli_matched").dev_split, "dev_matched");
  EXPECT_EQ(data::glue_task("MNLI-mismatched").dev_split, "dev_mismatched");
  EXPECT_EQ(data::glue_task("mnli_mismatched").name, "mnli_mismatched");
  write("MNLI/dev_mismatched.tsv",
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\t"
        "sentence1\tsentence2\tlabel1\tgold_label\n"
        "0\t1\t1e\tletters\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tOther genre.\tIts hypothesis.\tentailment\tentailment\n");
  const data::GlueTask& mm = data::glue_task("mnli_mismatched");
  std::vector<data::Example> mism = data::read_glue_split(dir_.string(), mm, mm.dev_split);
  ASSERT_EQ(mism.size(), 1u);
  EXPECT_EQ(mism[0].str("text_a"), "Other genre.");
  EXPECT_EQ(mism[0].as_int("label"), 0);
  std::vector<data::Example> qqp = data::read_glue_split(dir_.string(), data::glue_task("qqp"), "train");
  ASSERT_EQ(qqp.size(), 1u);
  EXPECT_EQ(qqp[0].str("text_a"), "How?");
  EXPECT_EQ(qqp[0].as_int("label"), 1);

  write("QQP/dev.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n7\t1\t2\tHow?\tWhy?\tyes\n");
  expect_error([&] { data::read_glue_split(dir_.string(), data::glue_task("qqp"), "dev"); },
               {"QQP/dev.tsv:2", "label 'yes' is not one of 0, 1"});
  write("QQP/test.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\n7\t1\t2\tHow?\tWhy?\n");
  expect_error([&] { data::read_glue_split(dir_.string(), data::glue_task("qqp"), "test"); },
               {"QQP/test.tsv", "is_duplicate"});
  std::filesystem::create_directories(dir_ / "STS-B");
  write("STS-B/dev.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
                         "0\tg\tf\ty\t0\tn\tn\ta\tb\tfive\n");
  expect_error([&] { data::read_glue_split(dir_.string(), data::glue_task("stsb"), "dev"); },
               {"STS-B/dev.tsv:2", "'five', not a number"});
  expect_error([&] { data::read_glue_split(dir_.string(), data::glue_task("rte"), "train"); }, {"RTE"});
}

}  // namespace
}  // namespace mt::testing
