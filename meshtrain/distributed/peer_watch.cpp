#include "meshtrain/distributed/peer_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace mt::dist::internal {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x4d545057;  // "MTPW"
constexpr double kStepSeconds = 3.0;     // one connect, or one handshake reply, may take this long
constexpr int kRecordBytes = 1024;       // rank 0's "port addr addr ..." broadcast

// The first bytes on every connection, both ways: who is talking, for which job (a stray
// connection to the wrong address, or an unrelated service on that port, fails the check).
struct Hello {
  uint32_t magic;
  int32_t rank;
  uint64_t nonce;
};

// Messages after the hello: one byte each, except a failure report ('F', whether to linger
// as a byte, a u32 length, text).
constexpr char kHeartbeat = 'H', kGoodbye = 'B', kFailure = 'F';

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// This host's IPv4 addresses that are up: the others first, loopback last (for ranks in the
// same network stack).
std::vector<std::string> local_addresses() {
  std::vector<std::string> out, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {"127.0.0.1"};
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    ((a->ifa_flags & IFF_LOOPBACK) ? loopback : out).push_back(text);
  }
  freeifaddrs(list);
  out.insert(out.end(), loopback.begin(), loopback.end());
  return out;
}

// Waits until `fd` is ready for `events` or `deadline` passes.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, int(left * 1000) + 1);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

bool send_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_for(fd, POLLOUT, deadline)) return false;
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_for(fd, POLLIN, deadline)) return false;
    const ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

int nonblocking_socket() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

// A connection to rank 0 at `address`:`port` that answered this job's hello, or -1.
int connect_to_root(const std::string& address, int port, const Hello& hello) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, address.c_str(), &to.sin_addr) != 1) return -1;
  const int fd = nonblocking_socket();
  if (fd < 0) return -1;
  const auto deadline = after(kStepSeconds);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 || errno == EINPROGRESS;
  if (ok && errno == EINPROGRESS) {
    int err = 0;
    socklen_t len = sizeof err;
    ok = wait_for(fd, POLLOUT, deadline) && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
  }
  Hello reply{};
  ok = ok && send_all(fd, &hello, sizeof hello, deadline) && recv_all(fd, &reply, sizeof reply, deadline) &&
       reply.magic == kMagic && reply.nonce == hello.nonce && reply.rank == 0;
  if (!ok) close(fd);
  return ok ? fd : -1;
}

}  // namespace

struct PeerWatch::State {
  // A connection's fd stays open until the process ends (never closed and reused while another
  // thread may send on it); `open` says whether it is still watched.
  struct Peer {
    Peer(int r, int f) : rank(r), fd(f) {}
    const int rank;
    const int fd;
    std::string inbox;
    Clock::time_point last_heard;  // guarded by State::mu
    std::atomic<bool> open{true};
    std::atomic<bool> goodbye{false};
  };
  // A peer found failed, and why.
  struct Failure {
    int rank;
    enum Kind { closed, silent, garbled } kind;
    std::string detail;    // closed: the socket error, if any
    double quiet_s = 0;    // silent: seconds since last heard
  };

  int rank = 0;
  std::vector<std::string> hosts;
  double silence_s = 0;
  std::deque<Peer> peers;   // rank 0: every other rank; others: rank 0
  mutable std::mutex mu;    // guards peers' last_heard
  std::mutex send_mu;       // one message at a time on a connection
  std::atomic<bool> stop{false};
  std::atomic<bool> goodbye_sent{false};
  bool peer_left = false;  // a peer said goodbye while this process runs on
  int wake[2] = {-1, -1};
  std::thread thread;

  std::string who(int r) const { return "rank " + std::to_string(r) + " (host " + hosts[size_t(r)] + ")"; }
  double quiet_for(const Peer& p) const {
    std::lock_guard<std::mutex> lock(mu);
    return seconds_since(p.last_heard);
  }
  void send_to_all(const std::string& bytes) {
    std::lock_guard<std::mutex> lock(send_mu);
    for (Peer& p : peers)
      if (p.open.load()) (void)send(p.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  void run();
  void read_from(Peer& p, std::vector<Failure>& failures);
  void gather_host_mates(std::vector<Failure>& failures);  // adds the failed ranks' host mates that close too
  [[noreturn]] void report(std::vector<Failure> failures);
  // Prints `message` and exits, at once or, with `linger`, silence_s later (see report()).
  [[noreturn]] void end_job(const std::string& message, bool linger);
  void announce(const std::string& message, bool linger) const;  // end_job's printing
  [[noreturn]] void exit_job(bool linger) const;                  // and its exit
};

void PeerWatch::State::read_from(Peer& p, std::vector<Failure>& failures) {
  char buf[4096];
  while (p.open.load()) {
    const ssize_t n = recv(p.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      {
        std::lock_guard<std::mutex> lock(mu);
        p.last_heard = Clock::now();
      }
      p.inbox.append(buf, size_t(n));
      size_t at = 0;
      while (at < p.inbox.size()) {
        const char kind = p.inbox[at];
        if (kind == kHeartbeat) {
          ++at;
        } else if (kind == kGoodbye) {
          p.goodbye.store(true);
          peer_left = true;
          ++at;
        } else if (kind == kFailure) {
          uint32_t len = 0;
          constexpr size_t head = 2 + sizeof len;
          if (p.inbox.size() - at < head) break;
          std::memcpy(&len, p.inbox.data() + at + 2, sizeof len);
          if (p.inbox.size() - at < head + len) break;
          if (goodbye_sent.load()) return;  // this process is ending on its own already
          end_job(p.inbox.substr(at + head, len) + " (seen by rank 0)", p.inbox[at + 1] != 0);
        } else {
          failures.push_back({p.rank, Failure::garbled, "", 0});
          p.open.store(false);
          return;
        }
      }
      p.inbox.erase(0, at);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    const std::string why = n == 0 ? "" : std::string(" (") + std::strerror(errno) + ")";
    p.open.store(false);
    // After a goodbye the end is expected; after another rank's, a launcher stopping the job
    // ends the rest abruptly: that rank printed the cause.
    if (!p.goodbye.load() && !peer_left) failures.push_back({p.rank, Failure::closed, why, 0});
  }
}

void PeerWatch::State::run() {
  const double period = silence_s > 0 ? std::min(1.0, silence_s / 4) : 1.0;
  auto next_beat = Clock::now();
  std::vector<pollfd> fds;
  std::vector<Peer*> polled;
  while (!stop.load()) {
    fds.assign(1, pollfd{wake[0], POLLIN, 0});
    polled.clear();
    for (Peer& p : peers) {
      if (!p.open.load()) continue;
      fds.push_back(pollfd{p.fd, POLLIN, 0});
      polled.push_back(&p);
    }
    const double until_beat = std::max(0.0, std::chrono::duration<double>(next_beat - Clock::now()).count());
    const int rc = poll(fds.data(), nfds_t(fds.size()), int(until_beat * 1000) + 1);
    if (stop.load()) break;
    std::vector<Failure> failures;
    if (rc > 0) {
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) read_from(*polled[i - 1], failures);
    }
    if (silence_s > 0) {
      // The hosts with a peer silent past the limit: lost.
      std::vector<std::string> lost_hosts;
      for (Peer& p : peers)
        if (p.open.load() && !p.goodbye.load() && quiet_for(p) > silence_s) lost_hosts.push_back(hosts[size_t(p.rank)]);
      // The ranks of a lost host fall silent together, but their heartbeats drift apart over a
      // run: on a lost host, name every peer silent for half the limit (a live one is heard each
      // period). A peer on another host is named only past the full limit itself.
      auto on_lost_host = [&](const Peer& p) {
        return std::find(lost_hosts.begin(), lost_hosts.end(), hosts[size_t(p.rank)]) != lost_hosts.end();
      };
      for (Peer& p : peers) {
        if (!p.open.load() || p.goodbye.load() || !on_lost_host(p)) continue;
        const double quiet = quiet_for(p);
        if (quiet <= silence_s / 2) continue;
        failures.push_back({p.rank, Failure::silent, "", quiet});
        p.open.store(false);
      }
    }
    if (!failures.empty() && !goodbye_sent.load()) {
      gather_host_mates(failures);
      report(failures);
    }
    if (Clock::now() >= next_beat) {
      send_to_all(std::string(1, kHeartbeat));
      next_beat = after(period);
    }
  }
}

void PeerWatch::State::gather_host_mates(std::vector<Failure>& failures) {
  // Ranks of one host usually die together, so the report waits for the failed ranks' host
  // mates to close too, and names them all. It waits no longer than that: a killed host's
  // launcher daemon dies with its ranks, and mpirun then ends this process within tens of
  // milliseconds, so a fixed pause could lose the report (it did, once in a few runs).
  const auto deadline = after(0.03);
  for (;;) {
    for (Peer& p : peers) read_from(p, failures);
    std::vector<pollfd> mates;
    for (const Peer& p : peers) {
      if (!p.open.load() || p.goodbye.load()) continue;
      const bool same_host = std::any_of(failures.begin(), failures.end(), [&](const Failure& f) {
        return hosts[size_t(f.rank)] == hosts[size_t(p.rank)];
      });
      if (same_host) mates.push_back(pollfd{p.fd, POLLIN, 0});
    }
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (mates.empty() || left <= 0) return;
    if (poll(mates.data(), nfds_t(mates.size()), int(left * 1000) + 1) < 0 && errno != EINTR) return;
  }
}

void PeerWatch::State::report(std::vector<Failure> failures) {
  std::sort(failures.begin(), failures.end(), [](const Failure& a, const Failure& b) { return a.rank < b.rank; });
  failures.erase(std::unique(failures.begin(), failures.end(), [](const Failure& a, const Failure& b) { return a.rank == b.rank; }),
                 failures.end());
  std::vector<std::string> closed, silent, garbled;
  std::string socket_error;
  double longest_silence = 0;
  for (const Failure& f : failures) {
    if (f.kind == Failure::silent) {
      silent.push_back(who(f.rank));
      longest_silence = std::max(longest_silence, f.quiet_s);
    } else if (f.kind == Failure::garbled) {
      garbled.push_back(who(f.rank));
    } else {
      closed.push_back(who(f.rank));
      if (!f.detail.empty()) socket_error = f.detail;
    }
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " and " : ", ") + v[i];
    return s;
  };
  std::vector<std::string> parts;
  const bool many_closed = closed.size() > 1;
  if (!closed.empty())
    parts.push_back(join(closed) + " ended without finishing: " + (many_closed ? "their connections" : "its connection") +
                    " closed with no goodbye" + socket_error +
                    (many_closed ? ": their processes were killed or crashed, or their host went down"
                                 : ": its process was killed or crashed, or its host went down"));
  if (!silent.empty()) {
    std::ostringstream seconds;
    seconds.precision(1);
    seconds << std::fixed << longest_silence;
    parts.push_back(join(silent) + (silent.size() > 1 ? " have" : " has") + " sent nothing for " + seconds.str() +
                    " s: the host is down or the network to it is cut");
  }
  if (!garbled.empty()) parts.push_back(join(garbled) + " sent bytes that are not meshtrain's peer protocol");
  std::string message;
  for (size_t i = 0; i < parts.size(); ++i) message += (i ? "; " : "") + parts[i];
  // A lost host (silence) keeps its launcher daemon unreachable: once a rank exits, mpirun
  // sends the daemon the order to stop and waits for TCP to give up on it (minutes). Open
  // MPI's daemon keepalive (oob_tcp_keepalive_*) ends the job cleanly, but only while that
  // connection is idle, i.e. before any rank exits: so after a silence every rank lingers
  // silence_s more, the window the README's keepalive recipe fires in. A closed connection
  // (a killed process) is seen by the launcher at once: exit at once.
  const bool linger = !silent.empty();
  // Name the cause first: once a peer has read the report and exited, the launcher may end
  // this process at any moment.
  announce(message, linger);
  if (rank == 0) {
    // Tell every rank still connected, so each names the same cause before it exits.
    std::string packet{kFailure, char(linger)};
    const uint32_t len = uint32_t(message.size());
    packet.append(reinterpret_cast<const char*>(&len), sizeof len);
    packet += message;
    {
      std::lock_guard<std::mutex> lock(send_mu);
      const auto deadline = after(1.0);
      for (Peer& p : peers)
        if (p.open.load() && send_all(p.fd, packet.data(), packet.size(), deadline)) shutdown(p.fd, SHUT_WR);
    }
    // Unread bytes at exit would make the kernel reset the connections, and a reset can drop
    // the report before a peer reads it: read what has arrived first.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    char sink[4096];
    for (Peer& p : peers)
      while (p.open.load() && recv(p.fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
      }
  }
  exit_job(linger);
}

void PeerWatch::State::announce(const std::string& message, bool linger) const {
  std::fprintf(stderr, "[rank %d] [comm] %s. Ending the job%s.\n", rank, message.c_str(),
               linger ? " (leaving the launcher time to stop it first)" : "");
  std::fflush(stdout);
}

void PeerWatch::State::exit_job(bool linger) const {
  if (linger) std::this_thread::sleep_for(std::chrono::duration<double>(silence_s));
  std::_Exit(1);  // mpirun ends the ranks still running when one exits with an error
}

void PeerWatch::State::end_job(const std::string& message, bool linger) {
  announce(message, linger);
  exit_job(linger);
}

PeerWatch::PeerWatch(std::unique_ptr<State> state) : state_(std::move(state)) {}

PeerWatch::~PeerWatch() {
  state_->stop.store(true);
  if (state_->wake[1] >= 0) (void)!write(state_->wake[1], "x", 1);
  if (state_->thread.joinable()) state_->thread.join();
  for (auto& p : state_->peers) close(p.fd);
  for (int fd : state_->wake)
    if (fd >= 0) close(fd);
}

void PeerWatch::say_goodbye() {
  if (state_->goodbye_sent.exchange(true)) return;
  state_->send_to_all(std::string(1, kGoodbye));
}

std::string PeerWatch::silent_peers(double seconds) const {
  std::ostringstream out;
  out.precision(1);
  for (const auto& p : state_->peers) {
    const double quiet = state_->quiet_for(p);
    if (p.goodbye.load() || quiet <= seconds) continue;
    out << (out.tellp() > 0 ? "; " : "") << state_->who(p.rank) << ": last heard " << std::fixed << quiet << " s ago";
  }
  return out.str();
}

std::unique_ptr<PeerWatch> PeerWatch::start(int rank, int size, std::vector<std::string> hosts, double silence_s,
                                            std::string* warning) {
  auto state = std::make_unique<State>();
  state->rank = rank;
  state->hosts = std::move(hosts);
  state->silence_s = silence_s;
  std::string problem;

  // Rank 0 listens on every address and broadcasts "nonce port addr addr ...".
  int listener = -1;
  char record[kRecordBytes] = {};
  if (rank == 0) {
    listener = nonblocking_socket();
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof any;
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 ||
        listen(listener, SOMAXCONN) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&any), &len) != 0) {
      problem = std::string("rank 0 cannot listen on a TCP port: ") + std::strerror(errno);
    } else {
      std::ostringstream text;
      text << std::random_device{}() << "." << std::random_device{}() << " " << ntohs(any.sin_port);
      for (const std::string& a : local_addresses())
        if (text.tellp() + std::streamoff(a.size() + 2) < kRecordBytes) text << " " << a;
      std::snprintf(record, sizeof record, "%s", text.str().c_str());
    }
  }
  MPI_Bcast(record, kRecordBytes, MPI_CHAR, 0, MPI_COMM_WORLD);
  std::istringstream parse(record);
  std::string nonce_text;
  int port = 0;
  std::vector<std::string> addresses;
  parse >> nonce_text >> port;
  for (std::string a; parse >> a;) addresses.push_back(a);
  const uint64_t nonce = std::hash<std::string>{}(nonce_text);

  if (port > 0 && rank != 0) {
    const Hello hello{kMagic, rank, nonce};
    int fd = -1;
    for (size_t i = 0; i < addresses.size() && fd < 0; ++i) fd = connect_to_root(addresses[i], port, hello);
    if (fd >= 0) state->peers.emplace_back(0, fd);
  } else if (port > 0) {
    // Accept until every rank has said hello, or every rank has had time to try every address.
    const auto deadline = after(2 * kStepSeconds * double(addresses.size()) + 10);
    std::vector<int> fd_of(size_t(size), -1);
    int joined = 0;
    while (joined < size - 1 && wait_for(listener, POLLIN, deadline)) {
      const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {  // e.g. out of file descriptors: do not spin until the deadline
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      Hello hello{};
      const auto step = after(kStepSeconds);
      const Hello reply{kMagic, 0, nonce};
      if (recv_all(fd, &hello, sizeof hello, step) && hello.magic == kMagic && hello.nonce == nonce && hello.rank > 0 &&
          hello.rank < size && fd_of[size_t(hello.rank)] < 0 && send_all(fd, &reply, sizeof reply, step)) {
        fd_of[size_t(hello.rank)] = fd;
        ++joined;
      } else {
        close(fd);
      }
    }
    for (int r = 1; r < size; ++r)
      if (fd_of[size_t(r)] >= 0) state->peers.emplace_back(r, fd_of[size_t(r)]);
  }
  if (listener >= 0) close(listener);
  if (problem.empty() && pipe2(state->wake, O_CLOEXEC) != 0) problem = std::string("pipe2: ") + std::strerror(errno);

  // All ranks, or none, watch: a rank left out would be reported as failed.
  int connected = problem.empty() && port > 0 &&
                  (rank == 0 ? int(state->peers.size()) == size - 1 : state->peers.size() == 1);
  std::vector<int> all(size_t(size), 0);
  MPI_Allgather(&connected, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> missing;
  for (int r = 0; r < size; ++r)
    if (!all[size_t(r)]) missing.push_back(r);
  if (!missing.empty()) {
    for (auto& p : state->peers) close(p.fd);
    for (int fd : state->wake)
      if (fd >= 0) close(fd);
    if (warning && rank == 0) {
      std::ostringstream w;
      w << "[comm] peer watch off: ";
      if (!problem.empty()) {  // rank 0's own
        w << problem;
      } else {
        w << "rank(s)";
        for (int r : missing) w << " " << r;
        w << " could not reach rank 0 over TCP (tried port " << port << " on " << addresses.size()
          << " address(es)); a failed rank will be found only by the MT_COMM_TIMEOUT_S watchdog";
      }
      *warning = w.str();
    }
    return nullptr;
  }
  for (auto& p : state->peers) p.last_heard = Clock::now();
  State* s = state.get();
  s->thread = std::thread([s] { s->run(); });
  return std::unique_ptr<PeerWatch>(new PeerWatch(std::move(state)));
}

}  // namespace mt::dist::internal
