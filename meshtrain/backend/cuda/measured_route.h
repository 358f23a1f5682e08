#pragma once
// Choosing between two routes of one primitive and shape by timing both on the run's own calls
// (MT_ATTENTION_CUDNN=auto: this build's tensor-core attention kernels or cuDNN's fused engine,
// issue 44's "chosen per shape by measurement"). The two routes compute the same function, so
// the calls that measure them are the run's real calls, not extra work: no scratch arrays of
// the shape's layout, and nothing a captured step would miss (the eager warm-up steps before a
// capture make the calls). Bookkeeping only, without CUDA, so the host tests pin it: the
// caller times each call it is told to (CUDA events) and reports the times.
//
// Each route gets `warmups` untimed calls (first-call costs: lazily loaded code, caches), then
// `samples` timed calls, the routes alternating so that neither is favoured by what ran just
// before it. The choice is the route with the lower median time, the second route (cuDNN) only
// where it is faster by more than `margin`: the first (the kernels) gives the same bits run
// after run, which cuDNN's atomically summed dQ does not, so a tie keeps it. The times are the
// stream's: where the GPU waits for the host (an idle GPU, a first step), a route's host-side
// work per call counts too, as it does in an eager run (a captured step replays without it).
#include <algorithm>
#include <array>
#include <stdexcept>
#include <vector>

namespace mt::cuda {

class MeasuredRoute {
 public:
  enum Route { first = 0, second = 1 };
  struct Call {
    Route route;
    bool timed;
  };

  explicit MeasuredRoute(int warmups = 1, int samples = 3, double margin = 0.05)
      : warmups_(warmups), samples_(samples), margin_(margin) {
    if (warmups < 0 || samples < 1 || margin < 0) throw std::invalid_argument("MeasuredRoute: bad schedule");
  }

  bool decided() const { return decided_; }
  Route choice() const { return choice_; }
  // Every timed call issued, not every time reported: the caller collects them (waits).
  bool awaiting_times() const { return !decided_ && issued_ == 2 * (warmups_ + samples_); }
  int timed_calls() const { return 2 * samples_; }

  // The route of the next call, and whether the caller times it (once decided: the choice).
  Call next() {
    if (decided_) return {choice_, false};
    if (awaiting_times()) throw std::logic_error("MeasuredRoute: every trial issued; report their times first");
    const int n = issued_++;
    return {Route(n % 2), n >= 2 * warmups_};
  }

  // One timed call's time in ms; decides once every timed call of both routes is in.
  void report(Route r, double ms) {
    if (decided_) return;
    times_[r].push_back(ms);
    if (int(times_[first].size()) >= samples_ && int(times_[second].size()) >= samples_) {
      choice_ = median_ms(second) < (1.0 - margin_) * median_ms(first) ? second : first;
      decided_ = true;
    }
  }

  // Starts the trial over: for a caller whose trial ended without every timed call's time (a
  // call that failed before it was timed), so that the shape is measured again, not stuck.
  void restart() {
    issued_ = 0;
    decided_ = false;
    times_[first].clear();
    times_[second].clear();
  }

  double median_ms(Route r) const {
    std::vector<double> t = times_[r];
    if (t.empty()) return 0;
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    return t[t.size() / 2];
  }

 private:
  int warmups_, samples_;
  double margin_;
  int issued_ = 0;
  bool decided_ = false;
  Route choice_ = first;
  std::array<std::vector<double>, 2> times_;
};

}  // namespace mt::cuda
