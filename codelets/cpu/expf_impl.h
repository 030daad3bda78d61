/* exp for the cross-entropy (loss.c), written out in C so that its bits depend neither on
 * the host's libm nor on the instruction set, and vectorized. Internal to codelets/cpu
 * and its tests.
 *
 * The algorithm is glibc's expf (sysdeps/ieee754/flt-32/e_expf.c: 2^(k/32) from a table
 * times a cubic in double), with the fused multiply-adds of its FMA build (__expf_fma,
 * which glibc picks on every CPU with FMA) as explicit fma calls. So on such a host it
 * returns glibc's expf bit for bit (checked on all 2^32 floats against Debian 12's glibc
 * 2.36, 2026-12-05), and the losses the apps printed before it are unchanged; elsewhere it
 * still returns these bits. Errors below 1 ulp (glibc's bound). errno is never set. */
#ifndef STARPIPE_CPU_EXPF_IMPL_H
#define STARPIPE_CPU_EXPF_IMPL_H

/* e^x for one float. */
float sp_expf(float x);

/* p[v] = sp_expf(x[v] - shift) for v in [0, n), the difference rounded to float first
 * (as `expf(x[v] - shift)` in C). AVX-512F or AVX2 + FMA where the CPU has them (the
 * sgemm's path choice, gemm_impl.h), the same bits on every path. */
void sp_expf_shifted(float *p, const float *x, float shift, int n);

/* The largest of x[0..n), NaNs skipped; -INFINITY when there is none. Which zero a max of
 * +0 and -0 returns is unspecified: the cross-entropy only subtracts it (x - (+0) and
 * x - (-0) are equal but for x = 0, whose exp is 1 either way) and adds it in double. */
float sp_max_skip_nan(const float *x, int n);

#endif
