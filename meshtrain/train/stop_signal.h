#pragma once
// Ctrl-C (SIGINT) and SIGTERM. One watcher thread receives them (start_signal_watcher blocks
// both in every thread, so no compute thread is ever interrupted mid-kernel). Until a command
// arms a stop request they end the process at once, as by default; once armed (training,
// serving), the first asks the Trainer to stop after the step in flight, write a checkpoint
// and return (Trainer::fit then throws Interrupted), and a second exits at once (status 130),
// leaving the newest complete checkpoint: checkpoints are written atomically.
#include <stdexcept>
#include <string>

namespace mt::train {

// Call first thing in main(), before any other thread starts (threads inherit the blocked
// signals). Without it the handlers are not installed and signals keep their defaults.
void start_signal_watcher();
// From now on the first SIGINT/SIGTERM sets stop_requested() (and prints `notice`) instead of
// ending the process.
void arm_stop_request(const char* notice = "stopping after this step (a checkpoint follows)");
// Whether a command armed the stop (every rank does, before training), and whether a signal
// asked for it on this process.
bool stop_armed();
bool stop_requested();
// What a first signal does once armed, for front ends that receive Ctrl-C themselves (Python's
// KeyboardInterrupt): prints the notice and asks the Trainer to stop after the step in flight.
void request_stop();
// Forgets a request already served, before the next fit.
void clear_stop_request();
// Back to the unarmed default once a front end's fit is over: a later signal is not taken for a
// stop request nobody will serve.
void disarm_stop_request();

// Thrown by Trainer::fit after it stopped on request and wrote its checkpoint; what() is the
// line to print ("interrupted at step N; checkpoint step_N written ...; continue with --resume").
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace mt::train
