// The schedule and the choice of MT_ATTENTION_CUDNN=auto (backend/cuda/measured_route.h), run on
// the host: which calls each route gets, which are timed, and which route the times choose. The
// GPU test CudnnAutoRouteTimesBothRoutesAndKeepsItsChoice checks the route itself.
#include <gtest/gtest.h>

#include <stdexcept>

#include "meshtrain/backend/cuda/measured_route.h"

using mt::cuda::MeasuredRoute;

namespace {

// Runs the whole trial: each timed call of route r takes ms[r] (plus its index, so the times
// differ), reported in issue order once every trial is issued, as the caller collects them.
MeasuredRoute::Route decide(MeasuredRoute& m, double first_ms, double second_ms) {
  std::vector<MeasuredRoute::Call> timed;
  while (!m.awaiting_times()) {
    const MeasuredRoute::Call c = m.next();
    if (c.timed) timed.push_back(c);
  }
  EXPECT_FALSE(m.decided());
  for (size_t i = 0; i < timed.size(); ++i)
    m.report(timed[i].route, (timed[i].route == MeasuredRoute::first ? first_ms : second_ms) + 0.001 * double(i));
  EXPECT_TRUE(m.decided());
  return m.choice();
}

}  // namespace

TEST(MeasuredRoute, AlternatesRoutesWarmsEachUpThenTimesEach) {
  MeasuredRoute m(/*warmups=*/1, /*samples=*/3);
  int untimed[2] = {0, 0}, timed[2] = {0, 0};
  MeasuredRoute::Route last = MeasuredRoute::second;
  bool seen_timed = false;
  while (!m.awaiting_times()) {
    const MeasuredRoute::Call c = m.next();
    EXPECT_NE(c.route, last) << "the routes alternate";
    last = c.route;
    if (c.timed) {
      ++timed[c.route];
      seen_timed = true;
    } else {
      EXPECT_FALSE(seen_timed) << "warm-ups come first";
      ++untimed[c.route];
    }
  }
  EXPECT_EQ(untimed[0], 1);
  EXPECT_EQ(untimed[1], 1);
  EXPECT_EQ(timed[0], 3);
  EXPECT_EQ(timed[1], 3);
  EXPECT_EQ(m.timed_calls(), 6);
  EXPECT_THROW(m.next(), std::logic_error) << "no call is issued while the trial's times are out";
}

TEST(MeasuredRoute, TheSecondRouteMustBeFasterByTheMargin) {
  MeasuredRoute faster(1, 3, 0.05);
  EXPECT_EQ(decide(faster, 1.0, 0.5), MeasuredRoute::second);
  MeasuredRoute tie(1, 3, 0.05);
  EXPECT_EQ(decide(tie, 1.0, 0.97), MeasuredRoute::first) << "within the margin the first route stays";
  MeasuredRoute slower(1, 3, 0.05);
  EXPECT_EQ(decide(slower, 0.5, 1.0), MeasuredRoute::first);
}

TEST(MeasuredRoute, TheMedianIgnoresOneSlowCall) {
  MeasuredRoute m(0, 3, 0.05);
  while (!m.awaiting_times()) m.next();
  for (double t : {1.0, 1.0, 1.0}) m.report(MeasuredRoute::first, t);
  // One 50 ms call (a stall) among cuDNN's three 0.5 ms ones.
  for (double t : {0.5, 50.0, 0.5}) m.report(MeasuredRoute::second, t);
  ASSERT_TRUE(m.decided());
  EXPECT_EQ(m.choice(), MeasuredRoute::second);
  EXPECT_DOUBLE_EQ(m.median_ms(MeasuredRoute::second), 0.5);
}

TEST(MeasuredRoute, OnceDecidedEveryCallTakesTheChoiceUntimed) {
  MeasuredRoute m(1, 2);
  ASSERT_EQ(decide(m, 2.0, 1.0), MeasuredRoute::second);
  for (int i = 0; i < 5; ++i) {
    const MeasuredRoute::Call c = m.next();
    EXPECT_EQ(c.route, MeasuredRoute::second);
    EXPECT_FALSE(c.timed);
  }
  m.report(MeasuredRoute::first, 0.001);  // a late report changes nothing
  EXPECT_EQ(m.choice(), MeasuredRoute::second);
}

// A trial whose calls were not all timed (one failed before its time was taken) starts over.
TEST(MeasuredRoute, RestartMeasuresAgain) {
  MeasuredRoute m(1, 2);
  std::vector<MeasuredRoute::Call> timed;
  while (!m.awaiting_times()) {
    const MeasuredRoute::Call c = m.next();
    if (c.timed) timed.push_back(c);
  }
  m.report(timed[0].route, 1.0);  // the other three calls' times never came
  EXPECT_FALSE(m.decided());
  m.restart();
  EXPECT_FALSE(m.awaiting_times());
  EXPECT_FALSE(m.next().timed) << "a restarted trial warms up again";
  m.restart();
  EXPECT_EQ(decide(m, 1.0, 2.0), MeasuredRoute::first);
}

TEST(MeasuredRoute, RefusesAScheduleWithoutSamples) {
  EXPECT_THROW(MeasuredRoute(1, 0), std::invalid_argument);
  EXPECT_THROW(MeasuredRoute(-1, 3), std::invalid_argument);
}
