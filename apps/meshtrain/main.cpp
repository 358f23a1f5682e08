// The meshtrain command line: one subcommand per workload.
#include <iostream>

#include "apps/meshtrain/commands.h"
#include "meshtrain/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: distributed training and inference of transformer language models"};
  app.require_subcommand(1);
  mt::cli::add_demo_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mt::Error& e) {
    std::cerr << "meshtrain: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
