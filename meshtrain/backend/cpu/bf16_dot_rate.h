#pragma once
// How fast this core's bf16 dot product (AVX512_BF16's VDPBF16PS) multiplies, against its
// f32 FMA: flops per second of one over the other. On the Intel Xeon without AMX measured here
// it is 0.48 (oneDNN's bf16 GEMM peaked at half the f32 GEMM's), so a bf16 GEMM is faster
// widened to f32; on AMD Zen 4 oneDNN's bf16 kernels made whole training steps faster than f32
// (README), so its rate is taken to be high. cpu_features decides by the measurement.
namespace mt::cpu {

// Measured on the calling thread: six interleaved runs of each instruction, 240k instructions
// a run on independent accumulators (about 1 ms in all at the rates above), keeping each
// one's best run (a preempted run only reads slower, so the best is the rate). Call only
// where the processor has AVX512_BF16.
double measure_bf16_dot_rate();

}  // namespace mt::cpu
