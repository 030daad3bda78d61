/* Attributes for the CPU kernels' hot loops (internal to codelets/cpu).
 * SP_NOFMA: no FMA contraction, so a * b + c rounds twice whatever the target, and an
 * explicit fmaf once; the bits then depend on the C source alone, not on the instruction
 * set.
 * SP_VEC_FN: also compiled for AVX-512F and x86-64-v3 (AVX2 with FMA, so an fmaf is an
 * instruction) beside the baseline (GCC target_clones, picked once from the CPU's
 * features at load time, x86-64 only). Use it only on loops whose every
 * operation rounds as in scalar C (no reductions the vectorizer may reorder: write those
 * with fixed partial sums), so all clones give the same bits. */
#ifndef STARPIPE_CPU_VEC_IMPL_H
#define STARPIPE_CPU_VEC_IMPL_H

#if defined(__clang__)
#pragma clang fp contract(off) /* the rest of the including file */
#define SP_NOFMA
#elif defined(__GNUC__)
#define SP_NOFMA __attribute__((optimize("fp-contract=off")))
#else
#define SP_NOFMA
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(SP_NO_TARGET_CLONES)
#define SP_VEC_FN SP_NOFMA __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define SP_VEC_FN SP_NOFMA
#endif

#endif
