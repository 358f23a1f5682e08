#pragma once
// PeerWatch: which rank failed, named within seconds. MPI reports a dead peer late or not at
// all: a rank killed mid-collective leaves the others blocked until mpirun tears the job down,
// and a host whose link went down leaves them blocked until MT_COMM_TIMEOUT_S, both without
// saying who. So every rank keeps one TCP connection to rank 0 beside MPI (a star: rank 0
// holds size - 1 sockets, the others one) and a thread that sends a heartbeat byte each second
// and listens:
//   - a connection that closes without a goodbye is a process that ended abruptly (killed,
//     crashed, its host gone): the kernel closes its sockets at once;
//   - a connection silent for `silence_s` is a host that is down or cut off.
// Rank 0 names the failed ranks and their hosts to every rank still connected, and each
// surviving rank prints that and exits with status 1, so the job ends with the cause instead
// of a hang or a bare "exited on signal". A rank exiting on its own (exit(), abort_all) says
// goodbye first: it prints its own reason, and is not reported as failed.
#include <memory>
#include <string>
#include <vector>

namespace mt::dist::internal {

class PeerWatch {
 public:
  // Collective over MPI_COMM_WORLD, called on the thread that owns MPI right after MPI_Init
  // (world size > 1). `hosts[r]` names rank r's host. Returns null, with `*warning` set on
  // rank 0, when some rank cannot reach rank 0 over TCP (a firewall): the job then runs
  // without the watch and a dead peer is found by the MT_COMM_TIMEOUT_S watchdog alone.
  // silence_s <= 0 disables the silence check (closed connections are still reported).
  static std::unique_ptr<PeerWatch> start(int rank, int size, std::vector<std::string> hosts, double silence_s,
                                          std::string* warning);
  ~PeerWatch();

  // This process is exiting on its own: peers must not report it as failed. Idempotent.
  void say_goodbye();

  // "rank 3 (host b): last heard 12.0 s ago" for each peer silent more than `seconds`: for
  // the collective watchdog's message. Empty when all were heard from recently.
  std::string silent_peers(double seconds) const;

  struct State;

 private:
  explicit PeerWatch(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace mt::dist::internal
