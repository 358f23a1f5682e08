#pragma once
#include <CLI/CLI.hpp>

namespace mt::cli {

// Each command registers its subcommand and options on the app; the returned callback
// runs it after parsing.
void add_generate_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_pretrain_command(CLI::App& app);
void add_finetune_command(CLI::App& app);
void add_glue_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_plot_command(CLI::App& app);
void add_seq2seq_command(CLI::App& app);
void add_caption_command(CLI::App& app);
void add_image_classify_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_prepare_data_command(CLI::App& app);
void add_dpo_command(CLI::App& app);
void add_distill_command(CLI::App& app);
void add_grpo_command(CLI::App& app);

}  // namespace mt::cli
