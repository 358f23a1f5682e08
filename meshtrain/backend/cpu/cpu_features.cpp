#include "meshtrain/backend/cpu/cpu_features.h"

#include <cpuid.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "meshtrain/backend/cpu/bf16_dot_rate.h"
#include "meshtrain/core/error.h"

namespace mt::cpu {

extern const int isa_floor_checked;  // isa_floor_check.cpp: referencing it keeps that check linked in

namespace {

using dnnl::cpu_isa;

const std::vector<std::pair<std::string, cpu_isa>>& isa_names() {
  static const std::vector<std::pair<std::string, cpu_isa>> names = {
      {"sse41", cpu_isa::sse41},
      {"avx", cpu_isa::avx},
      {"avx2", cpu_isa::avx2},
      {"avx2_vnni", cpu_isa::avx2_vnni},
      {"avx512_core", cpu_isa::avx512_core},
      {"avx512_core_vnni", cpu_isa::avx512_core_vnni},
      {"avx512_core_bf16", cpu_isa::avx512_core_bf16},
      {"avx512_core_amx", cpu_isa::avx512_core_amx},
      {"all", cpu_isa::all},
  };
  return names;
}

std::string isa_name(cpu_isa isa) {
  for (const auto& [name, value] : isa_names())
    if (value == isa) return name;
  return "isa " + std::to_string(unsigned(isa));  // one newer than this list knows
}

// oneDNN's ISA values are bit sets: a includes b when every bit of b is in a ("all" is 0
// and means no cap).
bool includes(cpu_isa a, cpu_isa b) {
  if (a == cpu_isa::all) return true;
  return (unsigned(a) & unsigned(b)) == unsigned(b);
}

// A cap from an environment variable, or nullopt-like {"", all} when unset.
std::pair<std::string, cpu_isa> read_cap(const char* variable) {
  const char* raw = std::getenv(variable);
  if (!raw || !*raw) return {"", cpu_isa::all};
  std::string value(raw);
  std::transform(value.begin(), value.end(), value.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const auto& [name, isa] : isa_names())
    if (name == value) return {name, isa};
  std::string known;
  for (const auto& entry : isa_names()) known += (known.empty() ? "" : ", ") + entry.first;
  throw Error(detail::concat("[cpu] ", variable, "='", raw, "' is not an instruction set; expected one of: ", known));
}

struct CpuidBits {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

CpuidBits cpuid(uint32_t leaf, uint32_t subleaf) {
  CpuidBits r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) return {};
  return r;
}

bool bit(uint32_t word, int n) { return (word >> n) & 1u; }

// The registers the OS saves on a context switch (XCR0): a feature whose registers it does
// not save cannot be used, whatever cpuid says.
uint64_t os_saved_state() {
  if (!bit(cpuid(1, 0).c, 27)) return 0;  // no OSXSAVE: no XGETBV
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

void detect_processor(CpuFeatures& f) {
  const uint64_t xcr0 = os_saved_state();
  const bool avx_state = (xcr0 & 0x6) == 0x6;                 // XMM + YMM
  const bool avx512_state = avx_state && (xcr0 & 0xe0) == 0xe0;  // opmask + ZMM
  const bool amx_state = (xcr0 & 0x60000) == 0x60000;         // tile config + tile data
  const CpuidBits l1 = cpuid(1, 0), l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);
  f.fma = avx_state && bit(l1.c, 12);
  f.f16c = avx_state && bit(l1.c, 29);
  f.avx2 = avx_state && bit(l7.b, 5);
  f.avx512f = avx512_state && bit(l7.b, 16);
  f.avx512dq = avx512_state && bit(l7.b, 17);
  f.avx512bw = avx512_state && bit(l7.b, 30);
  f.avx512vl = avx512_state && bit(l7.b, 31);
  f.avx512_fp16 = avx512_state && bit(l7.d, 23);
  f.avx512_bf16 = avx512_state && bit(l7s1.a, 5);
  f.amx_bf16 = amx_state && bit(l7.d, 22);
  f.amx_tile = amx_state && bit(l7.d, 24);
  const bool avx512_core = f.avx512f && f.avx512dq && f.avx512bw && f.avx512vl;
  f.cpu_isa = avx512_core && f.amx_tile && f.amx_bf16 ? "avx512_core_amx"
              : avx512_core && f.avx512_bf16          ? "avx512_core_bf16"
              : avx512_core                           ? "avx512_core"
              : f.avx2                                ? "avx2"
                                                      : "below avx2";
}

// Whether oneDNN creates a matmul for this dtype (the check is cheap: no JIT is run).
bool onednn_has_matmul(const dnnl::engine& engine, dnnl::memory::data_type dt) {
  try {
    const dnnl::memory::desc md({16, 16}, dt, dnnl::memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), engine);
    (void)pd;
    return true;
  } catch (const dnnl::error&) {
    return false;  // dnnl_unimplemented: no kernel for this dtype below the needed ISA
  }
}

// Below this ratio of the bf16 dot product's flop rate to the f32 FMA's, a bf16 GEMM is
// faster widened to f32. An Intel Xeon without AMX measured 0.48 (the best of six runs, so
// preemption cannot lower it much); a rate near 1 is what makes the native kernels pay.
constexpr double kSlowBf16DotRate = 0.75;

// Whether bf16 GEMMs take oneDNN's bf16 kernels: forced by MESHTRAIN_CPU_BF16_GEMM, else
// by what the cores do (AMX always; AVX512_BF16 when its dot product is not slow).
// MESHTRAIN_CPU_BF16_GEMM's value ("" when unset); checked before oneDNN is touched, so a
// bad value is the error reported, not a later "oneDNN was used before" on a retry.
std::string asked_bf16_gemm() {
  const char* raw = std::getenv("MESHTRAIN_CPU_BF16_GEMM");
  const std::string asked = raw ? raw : "";
  if (!asked.empty() && asked != "auto" && asked != "native" && asked != "widened")
    throw Error(detail::concat("[cpu] MESHTRAIN_CPU_BF16_GEMM='", asked, "': expected auto, native or widened"));
  return asked;
}

void choose_bf16_gemm(CpuFeatures& f, const std::string& asked) {
  f.bf16_gemm_native = f.bf16_gemm_onednn;
  if (asked == "native" || asked == "widened") {
    f.bf16_gemm_forced = asked;
    f.bf16_gemm_native = f.bf16_gemm_onednn && asked == "native";  // no kernel to force where oneDNN has none
    return;
  }
  const cpu_isa isa = dnnl::get_effective_cpu_isa();
  if (f.bf16_gemm_onednn && f.avx512_bf16 && includes(isa, cpu_isa::avx512_core_bf16) &&
      !includes(isa, cpu_isa::avx512_core_amx)) {
    f.bf16_dot_rate = measure_bf16_dot_rate();
    f.bf16_gemm_native = f.bf16_dot_rate >= kSlowBf16DotRate;
  }
}

CpuFeatures detect() {
  (void)isa_floor_checked;
  CpuFeatures f;
  const std::string asked = asked_bf16_gemm();
  detect_processor(f);
  // The cap must reach oneDNN before anything queries it, so it is applied here, first.
  const auto ours = read_cap("MESHTRAIN_MAX_CPU_ISA");
  const auto theirs = read_cap("ONEDNN_MAX_CPU_ISA");
  if (!ours.first.empty()) {
    const bool theirs_lower = !theirs.first.empty() && includes(ours.second, theirs.second);
    const auto& cap = theirs_lower ? theirs : ours;
    f.cap = cap.first;
    f.cap_source = theirs_lower ? "ONEDNN_MAX_CPU_ISA" : "MESHTRAIN_MAX_CPU_ISA";
    if (dnnl::set_max_cpu_isa(cap.second) != dnnl::status::success)
      throw Error(detail::concat("[cpu] could not cap oneDNN at ", f.cap, " (", f.cap_source,
                                 "): oneDNN was used before meshtrain read its CPU features"));
  } else if (!theirs.first.empty()) {
    f.cap = theirs.first;  // oneDNN applies its own variable
    f.cap_source = "ONEDNN_MAX_CPU_ISA";
  }
  f.isa = isa_name(dnnl::get_effective_cpu_isa());
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  f.bf16_gemm_onednn = onednn_has_matmul(engine, dnnl::memory::data_type::bf16);
  f.f16_gemm_native = onednn_has_matmul(engine, dnnl::memory::data_type::f16);
  choose_bf16_gemm(f, asked);
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string bf16_gemm_mode() {
  const CpuFeatures& f = cpu_features();
  // The measured rate itself varies run to run (0.45-0.50 on one machine), and this line
  // starts every command's output: it names the side of the threshold, which does not.
  char rate[96] = "";
  if (f.bf16_dot_rate > 0)
    std::snprintf(rate, sizeof rate, "AVX512_BF16's dot product %s %.2fx the f32 FMA's rate here",
                  f.bf16_dot_rate < kSlowBf16DotRate ? "under" : "at least", kSlowBf16DotRate);
  const std::string forced = f.bf16_gemm_forced.empty() ? "" : "MESHTRAIN_CPU_BF16_GEMM=" + f.bf16_gemm_forced;
  if (!f.bf16_gemm_onednn)
    return "emulated (widened to f32" +
           (f.bf16_gemm_forced == "native" ? "; " + forced + " has no oneDNN kernel to use" : std::string()) + ")";
  if (!f.bf16_gemm_native) return "widened to f32 (" + (forced.empty() ? std::string(rate) : forced) + ")";
  const cpu_isa isa = dnnl::get_effective_cpu_isa();
  const std::string why = !forced.empty() ? ", " + forced : *rate ? ", " + std::string(rate) : "";
  if (includes(isa, cpu_isa::avx512_core_amx)) return "native (AMX" + why + ")";
  if (includes(isa, cpu_isa::avx512_core_bf16)) return "native (AVX512_BF16" + why + ")";
  return "by oneDNN on " + f.isa + " (no AVX512_BF16" + why + ")";
}

std::string cpu_summary() {
  const CpuFeatures& f = cpu_features();
  std::string line = "cpu: " + f.isa;
  if (!f.cap.empty())
    line += " (capped by " + f.cap_source + "=" + f.cap + "; the processor has " + f.cpu_isa + ")";
  return line + ", bf16 " + bf16_gemm_mode();
}

}  // namespace mt::cpu
