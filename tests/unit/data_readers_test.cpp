// Data readers: TSV/CSV/JSONL on the real GLUE files and on hand-written malformed files,
// whose errors must name the file, the line and the column.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"
#include "tests/support/temp_dir.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "meshtrain/meshtrain.h"

namespace mt::data {
namespace {

using mt::testing::expect_error;
using mt::testing::TempDir;

namespace fs = std::filesystem;
const std::string kGlue = std::string(MT_DATA_DIR) + "/glue/";



TEST(Example, TypedAccessAndErrors) {
  Example ex{{"text", "hello"}, {"label", "1"}, {"score", " 4.750"}, {"n", int64_t(3)}, {"x", 2.0},
             {"ids", std::vector<int64_t>{5, 6}}};
  EXPECT_EQ(ex.names(), (std::vector<std::string>{"text", "label", "score", "n", "x", "ids"}));
  EXPECT_EQ(ex.str("text"), "hello");
  EXPECT_EQ(ex.as_int("label"), 1);
  EXPECT_EQ(ex.as_float("score"), 4.75);
  EXPECT_EQ(ex.as_int("n"), 3);
  EXPECT_EQ(ex.as_float("n"), 3.0);
  EXPECT_EQ(ex.as_int("x"), 2);
  EXPECT_EQ(ex.tokens("ids"), (std::vector<int64_t>{5, 6}));
  ex.set("label", int64_t(0));  // replaces in place
  EXPECT_EQ(ex.names()[1], "label");
  EXPECT_EQ(ex.as_int("label"), 0);
  expect_error([&] { ex.at("lable"); }, {"[Example] field 'lable' is missing", "text, label, score"});
  expect_error([&] { ex.as_int("text"); }, {"field 'text' is a string 'hello', not an integer"});
  expect_error([&] { ex.as_int("score"); }, {"not an integer"});
  expect_error([&] { ex.str("n"); }, {"field 'n' is an integer 3, not a string"});
  expect_error([&] { ex.tokens("text"); }, {"not a token list"});
}

TEST(ReadTsv, MrpcTrainHasBomHeaderAndBareQuotes) {
  const auto rows = read_tsv(kGlue + "MRPC/train.tsv");
  ASSERT_EQ(rows.size(), 3667u);
  // The BOM is gone from the first column name.
  EXPECT_EQ(rows[0].names(), (std::vector<std::string>{"Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"}));
  EXPECT_EQ(rows[0].str("#1 ID"), "702876");
  // Quotes inside GLUE TSV fields are ordinary characters.
  EXPECT_EQ(rows[0].str("#1 String"),
            "Amrozi accused his brother , whom he called \" the witness \" , of deliberately distorting his evidence .");
  int64_t positives = 0;
  for (const auto& r : rows) positives += r.as_int("Quality");
  EXPECT_EQ(positives, 2473);

  // Selection by name and by index, with a typed label.
  const auto sel = read_tsv(kGlue + "MRPC/train.tsv",
                            {.columns = {"#1 String", 4, "Quality"}, .types = {{"Quality", FieldType::int64}}});
  ASSERT_EQ(sel.size(), 3667u);
  EXPECT_EQ(sel[0].names(), (std::vector<std::string>{"#1 String", "#2 String", "Quality"}));
  EXPECT_EQ(std::get<int64_t>(sel[0].at("Quality")), 1);
  EXPECT_EQ(sel[0].str("#1 String"), rows[0].str("#1 String"));

  // Treating those quotes as CSV quoting would be wrong: the file then fails to parse.
  EXPECT_THROW(read_tsv(kGlue + "MRPC/train.tsv", {.quoting = true}), Error);
  EXPECT_EQ(read_tsv(kGlue + "MRPC/train.tsv", {.limit = 10}).size(), 10u);
}

TEST(ReadTsv, ColaHasNoHeader) {
  const auto rows = read_tsv(kGlue + "CoLA/train.tsv",
                             {.header = false,
                              .column_names = {"source", "label", "annotation", "sentence"},
                              .columns = {"sentence", "label"},
                              .types = {{"label", FieldType::int64}}});
  ASSERT_EQ(rows.size(), 8551u);
  EXPECT_EQ(rows[0].str("sentence"), "Our friends won't buy this analysis, let alone the next one we propose.");
  EXPECT_EQ(rows.back().str("sentence"), "What all did you get for Christmas?");
  int64_t acceptable = 0;
  for (const auto& r : rows) acceptable += std::get<int64_t>(r.at("label"));
  EXPECT_EQ(acceptable, 6023);

  // By index without names: fields are named by position.
  const auto raw = read_tsv(kGlue + "CoLA/train.tsv", {.header = false, .columns = {3, 1}});
  ASSERT_EQ(raw.size(), 8551u);
  EXPECT_EQ(raw[0].names(), (std::vector<std::string>{"3", "1"}));
  EXPECT_EQ(raw[0].str("1"), "1");
  // An empty field (CoLA's annotation column) is an empty string.
  EXPECT_EQ(read_tsv(kGlue + "CoLA/train.tsv", {.header = false})[0].str("2"), "");
  expect_error([&] { read_tsv(kGlue + "CoLA/train.tsv", {.header = false, .columns = {"sentence"}}); },
               {"CoLA/train.tsv", "column 'sentence' not found", "no header: give column_names"});
}

TEST(ReadTsv, StsbFloatScoresAndRteLabels) {
  const auto stsb = read_tsv(kGlue + "STS-B/train.tsv", {.columns = {"sentence1", "sentence2", "score"},
                                                         .types = {{"score", FieldType::float64}}});
  ASSERT_EQ(stsb.size(), 5749u);
  EXPECT_EQ(std::get<double>(stsb[1].at("score")), 3.8);
  double total = 0;
  for (const auto& r : stsb) total += std::get<double>(r.at("score"));
  EXPECT_NEAR(total, 15528.043396825336, 1e-6);
  // Unconverted, the score is a string that as_float parses.
  EXPECT_EQ(read_tsv(kGlue + "STS-B/dev.tsv")[0].as_float("score"), 5.0);

  const auto rte = read_tsv(kGlue + "RTE/train.tsv", {.columns = {"sentence1", "sentence2", "label"}});
  ASSERT_EQ(rte.size(), 2490u);
  std::set<std::string> labels;
  int64_t entailment = 0;
  for (const auto& r : rte) {
    labels.insert(r.str("label"));
    entailment += r.str("label") == "entailment";
  }
  EXPECT_EQ(labels, (std::set<std::string>{"entailment", "not_entailment"}));
  EXPECT_EQ(entailment, 1249);

  // SST-2 keeps the sentence's trailing space; test files have no label column.
  const auto sst = read_tsv(kGlue + "SST-2/dev.tsv");
  ASSERT_EQ(sst.size(), 872u);
  EXPECT_EQ(sst[0].str("sentence"), "it 's a charming and often affecting journey . ");
  expect_error([&] { read_tsv(kGlue + "SST-2/test.tsv", {.columns = {"sentence", "label"}}); },
               {"SST-2/test.tsv:1: column 'label' not found", "'index', 'sentence'"});
}

TEST_F(TempDir, TsvMalformedRowsNameFileLineAndColumn) {
  const auto path = write("bad.tsv", "a\tb\tc\n1\t2\t3\n\n4\t5\n");
  expect_error([&] { read_tsv(path); }, {"[read_tsv] " + path + ":4: row has 2 fields, expected 3",
                                         "column 3 ('c') is missing"});
  const auto extra = write("extra.tsv", "a\tb\n1\t2\n3\t4\tfive\n");
  expect_error([&] { read_tsv(extra); }, {extra + ":3:5: row has 3 fields, expected 2", "unexpected field 3 'five'"});
  const auto typed = write("typed.tsv", "a\tb\r\n1\t2\r\n3\tx\r\n");
  EXPECT_EQ(read_tsv(typed)[0].str("b"), "2");  // CRLF accepted
  expect_error([&] { read_tsv(typed, {.types = {{"b", FieldType::int64}}}); },
               {typed + ":3:3: column 'b' (field 2): 'x' is not an integer"});
  expect_error([&] { read_tsv(typed, {.types = {{"c", FieldType::int64}}}); },
               {typed + ":1: types names column 'c'", "'a', 'b'"});
  expect_error([&] { read_tsv(typed, {.columns = {"a", 2}}); }, {typed + ":1: column index 2 is out of range for 2 columns"});
  expect_error([&] { read_tsv(typed, {.column_names = {"x"}}); }, {"column_names has 1 names but the header has 2"});
  expect_error([&] { read_tsv(typed, {.columns = {"a", 0}}); }, {"column 'a' is selected twice"});
  expect_error([&] { read_tsv((dir_ / "missing.tsv").string()); }, {"[read_tsv]", "missing.tsv: no such file"});
  // Headerless rows must all match the first row's width.
  const auto ragged = write("ragged.tsv", "x\t1\ny\n");
  expect_error([&] { read_tsv(ragged, {.header = false}); }, {ragged + ":2: row has 1 fields, expected 2"});
  // An empty file has no rows; a header-only file neither.
  EXPECT_TRUE(read_tsv(write("empty.tsv", "")).empty());
  EXPECT_TRUE(read_tsv(write("header.tsv", "a\tb\n")).empty());
}

TEST_F(TempDir, CsvQuotedFields) {
  const std::string text =
      "\xEF\xBB\xBFid,text,label\r\n"
      "1,\"comma, inside\",pos\r\n"
      "2,\"say \"\"hi\"\"\",neg\r\n"
      "3,\"two\nlines\",pos\n"
      "4,plain \"quote\" mid,neg\n"
      "5,,\"\"\n"
      "6,last,no newline";
  const auto path = write("ok.csv", text);
  const auto rows = read_csv(path, {.types = {{"id", FieldType::int64}}});
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0].names(), (std::vector<std::string>{"id", "text", "label"}));
  EXPECT_EQ(rows[0].str("text"), "comma, inside");
  EXPECT_EQ(rows[1].str("text"), "say \"hi\"");
  EXPECT_EQ(rows[2].str("text"), "two\nlines");
  EXPECT_EQ(rows[3].str("text"), "plain \"quote\" mid");  // a quote inside an unquoted field is literal
  EXPECT_EQ(rows[4].str("text"), "");
  EXPECT_EQ(rows[4].str("label"), "");
  EXPECT_EQ(rows[5].str("label"), "no newline");
  EXPECT_EQ(std::get<int64_t>(rows[5].at("id")), 6);

  // Line numbers count the physical lines of multi-line fields.
  const auto bad = write("bad.csv", "a,b\n1,\"x\ny\nz\"\n2\n");
  expect_error([&] { read_csv(bad); }, {bad + ":5: row has 1 fields, expected 2", "column 2 ('b') is missing"});
  const auto open = write("open.csv", "a,b\n1,2\n3,\"never closed\n4,5\n");
  expect_error([&] { read_csv(open); }, {open + ":3:3: the quoted field 2 opened here is never closed"});
  const auto junk = write("junk.csv", "a,b\n1,\"x\"y\n");
  expect_error([&] { read_csv(junk); }, {junk + ":2:6: unexpected character 'y' after the closing quote of field 2"});
  // Quoting can be turned off for CSV and on for TSV; the delimiter can change.
  EXPECT_EQ(read_csv(write("q.csv", "a\n\"x\"\n"), {.quoting = false})[0].str("a"), "\"x\"");
  EXPECT_EQ(read_tsv(write("q.tsv", "a\tb\n\"x\ty\"\tz\n"), {.quoting = true})[0].str("a"), "x\ty");
  EXPECT_EQ(read_csv(write("semi.csv", "a;b\n1;2\n"), {.delimiter = ';'})[0].str("b"), "2");
}

TEST_F(TempDir, Jsonl) {
  const auto path = write("ok.jsonl",
                          "\xEF\xBB\xBF{\"text\": \"hi\", \"label\": 1, \"score\": 0.5, \"ok\": true, \"ids\": [1, 2, 3], "
                          "\"meta\": {\"a\": 1}, \"none\": null}\n"
                          "\n"
                          "{\"label\": 0, \"text\": \"yo\", \"ids\": [], \"tags\": [\"x\"]}\r\n");
  const auto rows = read_jsonl(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].names(), (std::vector<std::string>{"text", "label", "score", "ok", "ids", "meta", "none"}));
  EXPECT_EQ(rows[0].str("text"), "hi");
  EXPECT_EQ(std::get<int64_t>(rows[0].at("label")), 1);
  EXPECT_EQ(std::get<double>(rows[0].at("score")), 0.5);
  EXPECT_EQ(std::get<int64_t>(rows[0].at("ok")), 1);
  EXPECT_EQ(rows[0].tokens("ids"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(rows[0].str("meta"), "{\"a\":1}");
  EXPECT_EQ(rows[0].str("none"), "null");
  EXPECT_EQ(rows[1].names(), (std::vector<std::string>{"label", "text", "ids", "tags"}));  // file order
  EXPECT_EQ(rows[1].tokens("ids"), std::vector<int64_t>{});
  EXPECT_EQ(rows[1].str("tags"), "[\"x\"]");

  const auto sel = read_jsonl(path, {.columns = {"label", "text"}});
  EXPECT_EQ(sel[1].names(), (std::vector<std::string>{"label", "text"}));
  EXPECT_EQ(read_jsonl(path, {.limit = 1}).size(), 1u);
  expect_error([&] { read_jsonl(path, {.columns = {"label", "score"}}); },
               {"[read_jsonl] " + path + ":3: missing column 'score'", "'label', 'text', 'ids', 'tags'"});
  const auto bad = write("bad.jsonl", "{\"a\": 1}\n{\"a\": 2,, }\n");
  expect_error([&] { read_jsonl(bad); }, {"[read_jsonl] " + bad + ":2:9: bad JSON"});
  const auto arr = write("arr.jsonl", "[1, 2]\n");
  expect_error([&] { read_jsonl(arr); }, {arr + ":1: expected a JSON object, found array"});
}

}  // namespace
}  // namespace mt::data
