// `meshtrain distill` end to end on Tiny Shakespeare (bytes): a 0.84M-parameter GPT-2
// teacher distilled into a new 25k-parameter student ends with a lower held-out
// cross-entropy than the same student trained on the hard labels alone for the same steps;
// a LoRA student started from the teacher itself has KL 0 before training and resumes
// exactly; a teacher of another vocabulary and bad options are clear errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/run_metrics.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kShakespeare = std::string(MT_DATA_DIR) + "/text/tinyshakespeare.txt";

class DistillE2E : public TempDir {
 protected:
  static void SetUpTestSuite() {
    shared() = fs::temp_directory_path() / ("mt_distill_teacher_" + std::to_string(getpid()));
    fs::create_directories(shared());
  }
  static void TearDownTestSuite() { fs::remove_all(shared()); }
  static fs::path& shared() {
    static fs::path dir;
    return dir;
  }
  // The teacher, pretrained once for the suite (~12 s).
  static fs::path teacher() {
    static const fs::path model = [] {
      const fs::path t = shared() / "teacher";
      EXPECT_EQ(run_cli("pretrain --model gpt2 --data " + kShakespeare + " --tokenizer bytes --seq-len 64 --steps 400 "
                        "--output-dir " + t.string()).code,
                0);
      return t / "model";
    }();
    return model;
  }
};

TEST_F(DistillE2E, DistilledStudentBeatsHardLabelsAlone) {
  const fs::path t = teacher();
  const std::string student = write("student.json", R"({"n_layer": 1, "n_embd": 32, "n_head": 2})");
  const std::string args = "distill --teacher " + t.string() + " --config " + student + " --data " + kShakespeare +
                           " --seq-len 64 --steps 300 --temperature 1 --eval-fraction 0.02 --output-dir ";
  CliRun soft = run_cli(args + (dir_ / "soft").string() + " --alpha 0.9");
  ASSERT_EQ(soft.code, 0) << soft.out;
  CliRun hard = run_cli(args + (dir_ / "hard").string() + " --alpha 0");
  ASSERT_EQ(hard.code, 0) << hard.out;
  const double teacher_ce = number_after(soft.out, R"(teacher eval: ce_loss ([0-9.]+))");
  const double soft_ce = number_after(soft.out, R"(student eval after: ce_loss ([0-9.]+))");
  const double hard_ce = number_after(hard.out, R"(student eval after: ce_loss ([0-9.]+))");
  std::cout << "  held-out cross-entropy: teacher " << teacher_ce << ", distilled student " << soft_ce
            << ", hard-label student " << hard_ce << " (300 steps each)\n";
  EXPECT_LT(soft_ce, hard_ce - 0.03);
  EXPECT_LT(teacher_ce, soft_ce);
  EXPECT_TRUE(fs::exists(dir_ / "soft" / "model" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "soft" / "model" / "tokenizer.json") || fs::exists(dir_ / "soft" / "model" / "vocab.json") ||
              fs::exists(dir_ / "soft" / "model" / "tokenizer_config.json"));
}

TEST_F(DistillE2E, SelfDistilledLoraStartsAtKlZeroAndResumesExactly) {
  const fs::path t = teacher();
  const std::string args = "distill --teacher " + t.string() + " --student " + t.string() + " --data " + kShakespeare +
                           " --lora-rank 4 --seq-len 64 --per-device-batch-size 4 --steps 8 --save-steps 4 "
                           "--eval-fraction 0.01 --output-dir ";
  CliRun r = run_cli(args + (dir_ / "self").string());
  ASSERT_EQ(r.code, 0) << r.out;
  // Evaluated before training (no dropout), the student is its teacher: KL 0, the same CE.
  const double kl = number_after(r.out, R"(student eval before: ce_loss [0-9.]+, kl ([-0-9.e]+))");
  const double ce = number_after(r.out, R"(student eval before: ce_loss ([0-9.]+))");
  const double teacher_ce = number_after(r.out, R"(teacher eval: ce_loss ([0-9.]+))");
  std::cout << "  self-distillation before training: kl " << kl << ", ce_loss " << ce << " (teacher " << teacher_ce << ")\n";
  EXPECT_NEAR(kl, 0.0, 1e-6);
  EXPECT_DOUBLE_EQ(ce, teacher_ce);
  EXPECT_TRUE(fs::exists(dir_ / "self" / "adapter" / "adapter_model.safetensors"));
  const auto all = train_losses(dir_ / "self");
  ASSERT_EQ(all.size(), 8u);
  const fs::path resumed = dir_ / "resumed";
  stopped_copy(dir_ / "self", resumed, 4, 8);
  ASSERT_EQ(run_cli(args + resumed.string() + " --resume").code, 0);
  EXPECT_EQ(train_losses(resumed), all) << "the resumed run trained differently";
}

TEST_F(DistillE2E, MismatchedTeacherAndBadOptionsAreClearErrors) {
  const std::string tiny = std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2";
  const std::string student = write("student.json", R"({"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 320})");
  auto fails = [&](const std::string& args, const std::vector<std::string>& needles) {
    CliRun r = run_cli("distill " + args + " --data " + kShakespeare + " --steps 1 --output-dir " + (dir_ / "bad").string());
    EXPECT_NE(r.code, 0);
    for (const std::string& n : needles) EXPECT_NE(r.out.find(n), std::string::npos) << n << " not in:\n" << r.out;
    EXPECT_FALSE(fs::exists(dir_ / "bad" / "checkpoints"));
  };
  // hf-tiny-gpt2 and a student over another vocabulary (a run over bytes).
  const fs::path bytes_model = dir_ / "bytes";
  ASSERT_EQ(run_cli("pretrain --model gpt2 --data " + kShakespeare + " --tokenizer bytes --seq-len 32 --steps 1 --output-dir " +
                    bytes_model.string()).code,
            0);
  fails("--teacher " + tiny + " --student " + (bytes_model / "model").string(),
        {"[distill] the teacher", "has a vocabulary of", "line up token for token"});
  fails("--teacher " + tiny + " --config " + student + " --alpha 2", {"[distill] alpha must be in [0, 1], got 2"});
  fails("--teacher " + tiny + " --config " + student + " --temperature 0", {"[distill] the temperature must be positive"});
  fails("--teacher " + tiny, {"[distill] name the student: --student DIR or --config JSON"});
}

}  // namespace
}  // namespace mt::testing
