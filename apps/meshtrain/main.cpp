// The meshtrain command line: one subcommand per workload.
#include <iostream>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/run_flags.h"
#include "apps/meshtrain/typo_hints.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/train/stop_signal.h"
#include "meshtrain/train/trainer.h"

int main(int argc, char** argv) {
  mt::train::start_signal_watcher();  // before any thread starts: Ctrl-C is received by one thread
  // Guarded: under mpirun an error on one rank ends the whole job instead of a hang.
  return mt::dist::run_guarded([&] {
    CLI::App app{"meshtrain: distributed training and inference of transformer language models"};
    app.require_subcommand(1);
    mt::cli::add_generate_command(app);
    mt::cli::add_tokenize_command(app);
    mt::cli::add_pretrain_command(app);
    mt::cli::add_finetune_command(app);
    mt::cli::add_glue_command(app);
    mt::cli::add_eval_command(app);
    mt::cli::add_plot_command(app);
    mt::cli::add_seq2seq_command(app);
    mt::cli::add_caption_command(app);
    mt::cli::add_image_classify_command(app);
    mt::cli::add_serve_command(app);
    mt::cli::add_prepare_data_command(app);
    mt::cli::add_dpo_command(app);
    mt::cli::add_distill_command(app);
    mt::cli::add_grpo_command(app);
    if (auto message = mt::cli::unknown_command_message(app, argc, argv)) {
      std::cerr << "meshtrain: " << *message << "\n";
      return 2;
    }
    // Both spellings of every flag (--learning_rate for --learning-rate and the reverse).
    std::vector<std::string> args(argv + 1, argv + argc);
    mt::cli::normalize_flag_spellings(app, args);
    std::vector<char*> normalized = {argv[0]};
    for (std::string& a : args) normalized.push_back(a.data());
    try {
      app.parse(int(normalized.size()), normalized.data());
    } catch (const CLI::ExtrasError&) {
      std::cerr << "meshtrain: " << mt::cli::unknown_flags_message(app, int(normalized.size()), normalized.data()) << "\n";
      return 2;
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    } catch (const mt::train::DryRunDone&) {
      return 0;
    } catch (const mt::train::Interrupted& e) {
      // Every rank stopped after the same step and the checkpoint is written: a clean exit.
      if (mt::dist::world().rank() == 0) std::cerr << "meshtrain: " << e.what() << "\n";
      return 130;
    } catch (const mt::Error& e) {
      // Under mpirun the guard must see it: it ends the ranks that wait in a collective.
      if (mt::dist::world().size() > 1) throw;
      std::cerr << "meshtrain: " << e.what() << "\n";
      return 1;
    }
    return 0;
  });
}
