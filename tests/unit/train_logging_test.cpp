// Training logs: metrics.jsonl (per-line flush, append and resume), the console progress
// line on a non-TTY stream, and the background metric writer that keeps the step from
// waiting on slow sinks.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "meshtrain/meshtrain.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mt_log_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

using mt::testing::error_of;

// ---------------------------------------------------------------- metrics.jsonl

TEST(JsonlLogger, OneObjectPerLineFlushedImmediately) {
  fs::path dir = temp_dir("jsonl");
  fs::path path = dir / "run" / "metrics.jsonl";
  JsonlLogger log(path.string());
  log.log(1, "train", {{"loss", 2.5}, {"lr", 1e-4}});
  // Readable before the logger is closed or flushed: every line is flushed.
  ASSERT_EQ(read_lines(path).size(), 1u);
  EXPECT_EQ(read_lines(path)[0], R"({"step":1,"split":"train","loss":2.5,"lr":0.0001})");
  log.write(ScalarRecord{2, "eval", {{"accuracy", 0.75}, {"nan_metric", NAN}}});
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], R"({"step":2,"split":"eval","accuracy":0.75,"nan_metric":null})");
  // Values round-trip exactly.
  log.log(3, "train", {{"loss", 0.1 + 0.2}});
  EXPECT_EQ(nlohmann::json::parse(read_lines(path)[2])["loss"].get<double>(), 0.1 + 0.2);
  EXPECT_EQ(error_of([&] { log.log(4, "train", {{"step", 1.0}}); }),
            "[JsonlLogger] metric name 'step' clashes with a reserved key");
  fs::remove_all(dir);
}

TEST(JsonlLogger, AppendsOnResumeAndDropsWhatComesAfterTheCheckpoint) {
  fs::path dir = temp_dir("resume");
  fs::path path = dir / "metrics.jsonl";
  {
    JsonlLogger log(path.string());
    for (int s = 1; s <= 5; ++s) log.log(s, "train", {{"loss", double(s)}});
  }
  {
    JsonlLogger log(path.string());  // append is the default
    log.log(6, "train", {{"loss", 6.0}});
  }
  EXPECT_EQ(read_lines(path).size(), 6u);
  // A killed writer left half a line; a resume from the checkpoint at step 3 drops steps
  // 4..6 and the fragment, then continues.
  {
    std::ofstream out(path, std::ios::app);
    out << R"({"step":7,"split":"tr)";
  }
  {
    JsonlLogger log(path.string(), {.resume_step = 3});
    log.log(4, "train", {{"loss", 40.0}});
  }
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[2], R"({"step":3,"split":"train","loss":3.0})");
  EXPECT_EQ(lines[3], R"({"step":4,"split":"train","loss":40.0})");
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  // Without resume_step only the fragment goes.
  {
    std::ofstream out(path, std::ios::app);
    out << R"({"step":9,)";
  }
  JsonlLogger(path.string()).log(5, "eval", {});
  lines = read_lines(path);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[4], R"({"step":5,"split":"eval"})");
  // append = false starts over.
  JsonlLogger(path.string(), {.append = false}).log(1, "train", {{"loss", 1.0}});
  EXPECT_EQ(read_lines(path).size(), 1u);
  fs::remove_all(dir);
}

TEST(JsonlLogger, ResumeRefusesLinesWithoutAStep) {
  fs::path dir = temp_dir("badline");
  fs::path path = dir / "metrics.jsonl";
  {
    std::ofstream out(path);
    out << R"({"step":1,"split":"train"})" << "\n" << "not json\n";
  }
  EXPECT_EQ(error_of([&] { JsonlLogger log(path.string(), {.resume_step = 1}); }),
            "[JsonlLogger] " + path.string() + ":2: not a metrics line with an integer \"step\": not json");
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- progress line

// A clock the test moves by hand.
struct FakeClock {
  double now = 0;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

TEST(ProgressBar, PlainModePrintsEveryTenPercent) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar(100, {.out = &out, .clock = clock.fn()});
  EXPECT_FALSE(bar.tty());  // an ostringstream is never a terminal
  for (int64_t s = 1; s <= 100; ++s) {
    clock.now = 0.5 * double(s);
    bar.update(s, {.loss = 3.0 - 0.01 * double(s), .lr = 3e-4, .tokens_per_s = 12345, .mfu = 0.4123});
  }
  bar.finish();
  std::string text = out.str();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  auto lines = [&] {
    std::vector<std::string> v;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
  }();
  ASSERT_EQ(lines.size(), 11u) << text;  // step 1, then 10, 20, ..., 100
  EXPECT_EQ(lines[0].rfind("train 1/100 [", 0), 0u) << lines[0];
  EXPECT_EQ(lines[5],
            "train 50/100 [##########----------]  50% | loss 2.5000 | lr 3.00e-04 | 12.3k tok/s | MFU 41.2% | 25s "
            "ETA 25s");
  EXPECT_EQ(lines[10],
            "train 100/100 [####################] 100% | loss 2.0000 | lr 3.00e-04 | 12.3k tok/s | MFU 41.2% | 50s "
            "ETA 0s");
}

TEST(ProgressBar, EveryNStepsOptionalFieldsAndLongEta) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar(10000, {.out = &out, .print_every = 3, .description = "", .start_step = 100, .clock = clock.fn()});
  clock.now = 9;
  bar.update(103, {.loss = 1.5, .extra = {{"grad_norm", 0.25}}});  // 3 steps took 9 s
  clock.now = 12;
  bar.update(104, {.loss = 1.4});  // prints at multiples of 3 (and the first update)
  bar.update(105, {.lr = 1e-3});
  bar.update(106, {});
  std::string text = out.str();
  EXPECT_EQ(text,
            "103/10000 [--------------------]   1% | loss 1.5000 | grad_norm 0.2500 | 9s ETA 8h14m51s\n"
            "105/10000 [--------------------]   1% | lr 1.00e-03 | 12s ETA 6h35m48s\n");
  // The skipped last update is printed by finish(), once.
  out.str("");
  bar.update(107, {.loss = 1.0});
  bar.finish();
  bar.finish();
  std::string tail = out.str();
  EXPECT_EQ(tail.rfind("107/10000", 0), 0u) << tail;
  EXPECT_EQ(std::count(tail.begin(), tail.end(), '\n'), 1);
}

TEST(ProgressBar, UnknownTotalAndMessages) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar(0, {.out = &out, .print_every = 1, .description = "pretrain", .clock = clock.fn()});
  clock.now = 75;
  bar.update(7, {.loss = 0.5, .tokens_per_s = 2.5e6});
  bar.write(ScalarRecord{7, "eval", {{"accuracy", 0.8125}, {"loss", 1e-5}}});
  bar.write(ScalarRecord{8, "train", {{"loss", 0.25}, {"learning_rate", 2e-5}, {"tokens_per_s", 900}, {"mfu", 0.5},
                                      {"rss_gb", 1.0}, {"peak_rss_gb", 1.25}}});
  // Whole numbers as they are (an f16 run's loss scale, beyond %.4f's and up to e notation's
  // range); the host read and upload counters stay in metrics.jsonl.
  bar.write(ScalarRecord{9, "train", {{"loss", 0.125}, {"loss_scale", 131072}, {"host_reads", 1},
                                      {"host_uploads", 0}, {"kl", 2.0}}});
  EXPECT_EQ(out.str(),
            "pretrain step 7 | loss 0.5000 | 2.50M tok/s | 1m15s\n"
            "eval step 7: accuracy 0.8125 | loss 1.000e-05\n"
            "pretrain step 8 | loss 0.2500 | lr 2.00e-05 | 900 tok/s | MFU 50.0% | mem 1.25 GB | 1m15s\n"
            "pretrain step 9 | loss 0.1250 | kl 2 | loss_scale 131072 | 1m15s\n");
}

TEST(ProgressBar, TtyModeRedrawsInPlaceAndThrottles) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar(4, {.out = &out, .mode = ProgressOptions::Mode::tty, .bar_width = 4, .clock = clock.fn()});
  ASSERT_TRUE(bar.tty());
  bar.update(1, {.loss = 1});
  bar.update(2, {.loss = 2});  // within 0.1 s of the last redraw: skipped
  clock.now = 1;
  bar.update(3, {.loss = 3});
  bar.message("saved checkpoint");
  bar.update(4, {.loss = 4});  // the last step always draws
  bar.finish();
  EXPECT_EQ(out.str(),
            "\rtrain 1/4 [#---]  25% | loss 1.0000 | 0s ETA 0s\x1b[K"
            "\rtrain 3/4 [###-]  75% | loss 3.0000 | 1s ETA 0s\x1b[K"
            "\r\x1b[Ksaved checkpoint\n"
            "\rtrain 3/4 [###-]  75% | loss 3.0000 | 1s ETA 0s\x1b[K"
            "\rtrain 4/4 [####] 100% | loss 4.0000 | 1s ETA 0s\x1b[K\n");
}

// On a terminal, lines after the last step (the final eval, the fit summary) go below the
// finished bar, which stays on screen once (it was drawn again after every message).
TEST(ProgressBar, TtyFinishedBarIsShownOnceAboveTheFinalMessages) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar(2, {.out = &out, .mode = ProgressOptions::Mode::tty, .bar_width = 2, .clock = clock.fn()});
  bar.update(1, {.loss = 1});
  clock.now = 1;
  bar.update(2, {.loss = 2});
  bar.message("eval step 2: eval_loss 1.5");
  bar.message("fit: 2 steps");
  bar.finish();
  EXPECT_EQ(out.str(),
            "\rtrain 1/2 [#-]  50% | loss 1.0000 | 0s ETA 0s\x1b[K"
            "\rtrain 2/2 [##] 100% | loss 2.0000 | 1s ETA 0s\x1b[K"
            "\neval step 2: eval_loss 1.5\n"
            "fit: 2 steps\n");
}

// ---------------------------------------------------------------- async writer

// Records everything it is given; optionally waits on a gate or sleeps per record.
struct RecordingSink : MetricSink {
  std::mutex mu;
  std::condition_variable cv;
  bool gate_open = true;
  bool gate_timed_out = false;
  std::chrono::milliseconds sleep{0};
  std::vector<ScalarRecord> records;
  int flushes = 0;

  void write(const ScalarRecord& r) override {
    std::unique_lock<std::mutex> lock(mu);
    // Five seconds bound the wait so a writer that blocks pushes fails instead of hanging.
    if (!cv.wait_for(lock, std::chrono::seconds(5), [&] { return gate_open; })) gate_timed_out = true, gate_open = true;
    lock.unlock();
    std::this_thread::sleep_for(sleep);
    lock.lock();
    records.push_back(r);
  }
  void flush() override {
    std::lock_guard<std::mutex> lock(mu);
    ++flushes;
  }
  void open_gate() {
    std::lock_guard<std::mutex> lock(mu);
    gate_open = true;
    cv.notify_all();
  }
};

TEST(AsyncMetricWriter, PushesReturnWhileTheSinkIsBlocked) {
  auto sink = std::make_shared<RecordingSink>();
  sink->gate_open = false;
  AsyncMetricWriter writer({sink});
  for (int64_t s = 0; s < 10; ++s)
    writer.push(s, "train", {{"loss", Array::scalar(double(s) + 0.5)}, {"lr", 1e-3 * double(s)}});
  // All ten were accepted while the sink had not finished even the first one.
  EXPECT_EQ(writer.pending(), 10u);
  sink->open_gate();
  writer.flush();
  EXPECT_EQ(writer.pending(), 0u);
  EXPECT_FALSE(sink->gate_timed_out);
  ASSERT_EQ(sink->records.size(), 10u);
  for (int64_t s = 0; s < 10; ++s) {
    const auto& r = sink->records[size_t(s)];
    EXPECT_EQ(r.step, s);
    EXPECT_EQ(r.split, "train");
    EXPECT_EQ(r.values.at("loss"), double(s) + 0.5);
    EXPECT_EQ(r.values.at("lr"), 1e-3 * double(s));
  }
  EXPECT_EQ(sink->flushes, 1);
}

TEST(AsyncMetricWriter, SlowSinkKeepsOrderAndCompleteness) {
  auto slow = std::make_shared<RecordingSink>();
  slow->sleep = std::chrono::milliseconds(50);
  auto fast = std::make_shared<RecordingSink>();
  AsyncMetricWriter writer({slow, fast});
  // Losses as the training step leaves them: computed arrays, bf16 and f32.
  Array x = Array::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < 10; ++s) {
    Array loss = s % 2 ? mean(x) : cast(sum(x), DType::bf16);
    writer.push(MetricRecord{s, s == 9 ? "eval" : "train", {{"loss", loss}, {"tokens", double(100 * s)}}});
  }
  double push_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  writer.close();
  double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("10 pushes took %.3f ms with a 50 ms/record sink (drain: %.0f ms)\n", push_ms, total_ms);
  for (auto* sink : {slow.get(), fast.get()}) {
    ASSERT_EQ(sink->records.size(), 10u);
    for (int64_t s = 0; s < 10; ++s) {
      const auto& r = sink->records[size_t(s)];
      EXPECT_EQ(r.step, s);
      EXPECT_EQ(r.split, s == 9 ? "eval" : "train");
      EXPECT_EQ(r.values.at("loss"), s % 2 ? 2.5 : 10.0);
      EXPECT_EQ(r.values.at("tokens"), 100.0 * double(s));
    }
    EXPECT_EQ(sink->flushes, 1);  // close() flushes once
  }
  EXPECT_EQ(error_of([&] { writer.push(10, "train", {}); }), "[AsyncMetricWriter] push of step 10 after close()");
}

TEST(AsyncMetricWriter, FlushCoversEveryEarlierPushUnderConcurrentFlushes) {
  auto sink = std::make_shared<RecordingSink>();
  AsyncMetricWriter writer({sink});
  std::atomic<bool> done{false};
  std::thread other([&] {
    while (!done) writer.flush();  // a second thread flushing all the time
  });
  for (int64_t s = 0; s < 2000; ++s) {
    writer.push(s, "train", {{"loss", Array::scalar(double(s))}});
    if (s % 100 == 99) {
      writer.flush();
      std::lock_guard<std::mutex> lock(sink->mu);
      ASSERT_EQ(sink->records.size(), size_t(s + 1));
    }
  }
  done = true;
  other.join();
  writer.close();
  ASSERT_EQ(sink->records.size(), 2000u);
  for (int64_t s = 0; s < 2000; ++s) EXPECT_EQ(sink->records[size_t(s)].values.at("loss"), double(s));
}

TEST(AsyncMetricWriter, ErrorsReachTheTrainingThread) {
  EXPECT_EQ(error_of([] { AsyncMetricWriter w({nullptr}); }), "[AsyncMetricWriter] sink 0 is null");
  auto sink = std::make_shared<RecordingSink>();
  AsyncMetricWriter writer({sink});
  EXPECT_EQ(error_of([&] { writer.push(3, "train", {{"loss", Array::zeros({2})}}); }),
            "[AsyncMetricWriter] metric 'loss' at step 3 must be a one-element Array, got f32(2,)");

  struct ThrowingSink : MetricSink {
    void write(const ScalarRecord& r) override {
      if (r.step == 1) throw Error("[ThrowingSink] disk full");
    }
  };
  AsyncMetricWriter failing({std::make_shared<ThrowingSink>()});
  failing.push(1, "train", {{"loss", 1.0}});
  EXPECT_EQ(error_of([&] { failing.flush(); }), "[ThrowingSink] disk full");
  failing.push(2, "train", {{"loss", 1.0}});  // reported once; later records still go
  EXPECT_EQ(error_of([&] { failing.close(); }), "no error");
}

TEST(AsyncMetricWriter, DestructorDrainsIntoRealSinks) {
  fs::path dir = temp_dir("sinks");
  std::ostringstream console;
  auto jsonl = std::make_shared<JsonlLogger>((dir / "metrics.jsonl").string());
  auto tb = std::make_shared<TensorBoardWriter>((dir / "tb").string());
  auto bar = std::make_shared<ProgressBar>(5, ProgressOptions{.out = &console, .print_every = 1});
  {
    AsyncMetricWriter writer({jsonl, tb, bar});
    for (int64_t s = 1; s <= 5; ++s) writer.push(s, "train", {{"loss", Array::scalar(1.0 / double(s))}});
    writer.push(5, "eval", {{"accuracy", 0.5}});
  }
  auto lines = read_lines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[1], R"({"step":2,"split":"train","loss":0.5})");
  EXPECT_EQ(lines[5], R"({"step":5,"split":"eval","accuracy":0.5})");
  auto events = read_tensorboard_events(tb->path());
  ASSERT_EQ(events.size(), 7u);
  EXPECT_EQ(events[4].scalars.at(0), (std::pair<std::string, float>("train/loss", 0.25f)));
  EXPECT_EQ(events[6].scalars.at(0), (std::pair<std::string, float>("eval/accuracy", 0.5f)));
  EXPECT_NE(console.str().find("train 4/5"), std::string::npos) << console.str();
  EXPECT_NE(console.str().find("eval step 5: accuracy 0.5000\n"), std::string::npos) << console.str();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt::train
