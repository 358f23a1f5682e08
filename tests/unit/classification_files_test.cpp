// A user's classification data as HF's run_glue reads --train_file/--validation_file: CSV or
// JSON lines, classes = the sorted distinct training labels (integers by value), fractional
// labels = regression, texts from sentence1/sentence2 or the first text columns; bad rows
// name file and line.
#include <gtest/gtest.h>

#include "meshtrain/data/classification_files.h"
#include "tests/support/op_check.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

class ClassificationFilesTest : public TempDir {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

TEST_F(ClassificationFilesTest, CsvPairsWithIntegerClassesSortedByValue) {
  write("train.csv", "idx,premise,sentence2,sentence1,label\n0,p,\"b, quoted\",a,10\n1,p,d,c,2\n2,p,f,e,2\n");
  write("dev.jsonl", "{\"idx\": 0, \"premise\": \"p\", \"sentence1\": \"x\", \"sentence2\": \"y\", \"label\": 10}\n");
  data::ClassificationFiles f = data::read_classification_files(path("train.csv"), path("dev.jsonl"));
  EXPECT_EQ(f.task.text_a, "sentence1");  // both sentence columns win over column order
  EXPECT_EQ(f.task.text_b, "sentence2");
  EXPECT_EQ(f.task.label_names, (std::vector<std::string>{"2", "10"}));  // 2 < 10 as numbers
  EXPECT_EQ(f.task.metric_task(), "sst2");                              // accuracy
  ASSERT_EQ(f.train.size(), 3u);
  EXPECT_EQ(f.train[0].str("text_a"), "a");
  EXPECT_EQ(f.train[0].str("text_b"), "b, quoted");
  EXPECT_EQ(f.train[0].as_int("label"), 1);
  EXPECT_EQ(f.train[1].as_int("label"), 0);
  ASSERT_EQ(f.validation.size(), 1u);
  EXPECT_EQ(f.validation[0].as_int("label"), 1);
}

TEST_F(ClassificationFilesTest, JsonStringLabelsSingleTextAndRegression) {
  write("t.jsonl", "{\"id\": 3, \"review\": \"good\", \"label\": \"pos\"}\n{\"id\": 4, \"review\": \"bad\", \"label\": \"neg\"}\n");
  data::ClassificationFiles f = data::read_classification_files(path("t.jsonl"), path("t.jsonl"));
  EXPECT_EQ(f.task.text_a, "review");  // the id column is not a text
  EXPECT_EQ(f.task.text_b, "");
  EXPECT_EQ(f.task.label_names, (std::vector<std::string>{"neg", "pos"}));
  EXPECT_FALSE(f.train[0].contains("text_b"));
  EXPECT_EQ(f.train[0].as_int("label"), 1);

  write("r.csv", "sentence1,sentence2,label\na,b,4.5\nc,d,1\n");
  data::ClassificationFiles r = data::read_classification_files(path("r.csv"), path("r.csv"));
  EXPECT_TRUE(r.task.is_regression());
  EXPECT_EQ(r.task.metric_task(), "stsb");  // Pearson and Spearman
  EXPECT_DOUBLE_EQ(r.train[0].as_float("label"), 4.5);
  EXPECT_DOUBLE_EQ(r.train[1].as_float("label"), 1.0);
}

TEST_F(ClassificationFilesTest, BadRowsNameFileAndLine) {
  write("train.csv", "sentence,label\na,yes\nb,no\n");
  write("dev.csv", "sentence,label\nc,yes\nd,maybe\n");
  expect_error([&] { data::read_classification_files(path("train.csv"), path("dev.csv")); },
               {"dev.csv:3", "label 'maybe' is not one of the classes no, yes"});
  write("nolabel.jsonl", "{\"sentence\": \"a\", \"label\": \"x\"}\n{\"sentence\": \"b\"}\n");
  expect_error([&] { data::read_classification_files(path("nolabel.jsonl"), path("dev.csv")); },
               {"nolabel.jsonl:2", "no 'label' column"});
  write("one.csv", "sentence,label\na,x\nb,x\n");
  expect_error([&] { data::read_classification_files(path("one.csv"), path("dev.csv")); }, {"one.csv", "two classes"});
  write("other.csv", "question,label\nc,yes\n");
  expect_error([&] { data::read_classification_files(path("train.csv"), path("other.csv")); },
               {"other.csv has text columns 'question'", "train.csv has 'sentence'"});
  write("r.csv", "sentence,label\na,0.5\nb,1\n");
  write("rdev.csv", "sentence,label\nc,high\n");
  expect_error([&] { data::read_classification_files(path("r.csv"), path("rdev.csv")); },
               {"rdev.csv:2", "'high'", "not a number"});
  write("data.txt", "a\n");
  expect_error([&] { data::read_classification_files(path("data.txt"), path("dev.csv")); }, {"data.txt", ".csv", ".jsonl"});
}

}  // namespace
}  // namespace mt::testing
