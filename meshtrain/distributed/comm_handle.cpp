#include "meshtrain/distributed/comm_handle.h"

#include <optional>

#include "meshtrain/core/error.h"
#include "meshtrain/core/trace.h"

namespace mt::dist {

namespace internal {

void CommState::finish(std::string error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

const std::string& CommState::wait() {
  if (!done()) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done(); });
  }
  return error_;  // written before done_ was released, never again
}

}  // namespace internal

CommHandle::CommHandle(std::shared_ptr<internal::CommState> state) : owner_(std::make_shared<Owner>()) {
  owner_->state = std::move(state);  // assigned, not copied from a temporary Owner that would wait
}

CommHandle CommHandle::completed() {
  auto state = std::make_shared<internal::CommState>();
  state->finish("");
  return CommHandle(std::move(state));
}

CommHandle CommHandle::stream_ordered(std::function<std::string()> join, std::function<bool()> poll) {
  CommHandle h(std::make_shared<internal::CommState>());
  h.owner_->join = std::move(join);
  h.owner_->poll = std::move(poll);
  return h;
}

void CommHandle::Owner::join_once() {
  std::call_once(joined, [&] {
    std::string error;
    try {
      error = join();
    } catch (const std::exception& e) {
      error = e.what();
    }
    state->finish(std::move(error));
  });
}

void CommHandle::wait() const {
  MT_CHECK(owner_, "[comm] wait() on an empty CommHandle (default-constructed, not returned by a collective)");
  if (owner_->join) owner_->join_once();
  std::optional<trace::Span> span;  // time the caller waits: communication not overlapped
  if (trace::enabled() && !owner_->state->done()) span.emplace("comm_wait", "comm_wait");
  const std::string& error = owner_->state->wait();
  span.reset();
  if (!error.empty()) throw Error(error);
}

bool CommHandle::done() const {
  MT_CHECK(owner_, "[comm] done() on an empty CommHandle (default-constructed, not returned by a collective)");
  if (owner_->state->done()) return true;
  if (!owner_->poll || !owner_->poll()) return false;
  owner_->join_once();  // the join's cast or copy into the caller's buffer comes before "done"
  return true;
}

CommHandle::Owner::~Owner() {
  if (state && !state->done()) {
    if (join) join_once();  // errors are dropped, as for host collectives
    state->wait();
  }
}

}  // namespace mt::dist
