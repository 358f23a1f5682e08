// Batches padded to their longest row: the columns a right-padded batch needs
// (train/row_padding.h), and the rank agreement's checks (train/batch_shapes.h) on one rank.
#include <gtest/gtest.h>

#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/local_communicator.h"
#include "meshtrain/train/batch_shapes.h"
#include "meshtrain/train/row_padding.h"

namespace mt::train {
namespace {

TEST(RowPadding, ColumnsInUseReachTheLastRealColumnOfAnyRowRoundedUp) {
  // 3 rows of 10, padded with -100: the longest row's last real value is in column 6 (0-based 5).
  const std::vector<int64_t> rows = {1,    2,    -100, -100, -100, -100, -100, -100, -100, -100,  //
                                     -100, 3,    4,    5,    6,    7,    -100, -100, -100, -100,  //
                                     8,    -100, -100, -100, -100, -100, -100, -100, -100, -100};
  EXPECT_EQ(columns_in_use(rows, 3, 10, -100, 1), 6);
  EXPECT_EQ(columns_in_use(rows, 3, 10, -100, 4), 8);
  EXPECT_EQ(columns_in_use(rows, 3, 10, -100, 8), 8);
  EXPECT_EQ(columns_in_use(rows, 3, 10, -100, 16), 10);  // never past the rows' width
  // A padding value inside a row (a prompt's -100 before its response) does not end it.
  EXPECT_EQ(columns_in_use({-100, -100, 9, -100}, 1, 4, -100, 1), 3);
  // All padding: one multiple, so that no batch is empty.
  EXPECT_EQ(columns_in_use(std::vector<int64_t>(8, 0), 2, 4, 0, 2), 2);
  EXPECT_THROW(columns_in_use(rows, 3, 9, -100, 4), Error);
  EXPECT_THROW(columns_in_use(rows, 3, 10, -100, 0), Error);
}

TEST(RowPadding, KeepColumnsKeepsEachRowsLeadingValues) {
  std::vector<int64_t> rows = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  keep_columns(rows, 3, 4, 2);
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 2, 5, 6, 9, 10}));
  keep_columns(rows, 3, 2, 2);
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 2, 5, 6, 9, 10}));
  EXPECT_THROW(keep_columns(rows, 3, 2, 3), Error);
}

TEST(RowPadding, RankAgreementChecksTheFieldsItPads) {
  dist::LocalCommunicator comm("world");
  const Batch batch{{"ids", Array::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3})},
                    {"mask", Array::from_vector(std::vector<int64_t>{1, 1}, {2, 1})},
                    {"label", Array::from_vector(std::vector<int64_t>{0, 1}, {2})}};
  // One rank: nothing to pad, the batch comes back as it was.
  const Batch same = pad_to_ranks_longest(batch, {{{"ids", 0.0}}}, comm);
  EXPECT_EQ(same["ids"].shape(), batch["ids"].shape());
  EXPECT_EQ(same["ids"].to_doubles(), batch["ids"].to_doubles());
  try {
    pad_to_ranks_longest(batch, {{{"ids", 0.0}, {"mask", 0.0}}}, comm);
    ADD_FAILURE() << "two fields of one group with lengths 3 and 1 were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ids' and 'mask'"), std::string::npos) << e.what();
  }
  try {
    pad_to_ranks_longest(batch, {{{"label", 0.0}}}, comm);
    ADD_FAILURE() << "a one-dimensional field was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'label'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::train
