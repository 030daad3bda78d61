#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU, the CUDA 13 toolkit and
# driver, CMake, a C compiler and Python, but no network and none of starpipe's Debian
# packages. It brings them from .gpu-deps/ (made beforehand by scripts/fetch-gpu-deps on
# a CPU machine): unpacks the .debs into a local prefix, builds starpipe with
# STARPIPE_CUDA=ON against .gpu-deps/starpu, then runs
#   (a) the CUDA kernel checks (tests/backend/test_backend_ops: every entry of the CUDA
#       table against the CPU's; tests/gpu/test_cuda_kernels: the rest, and the rates),
#   (b) starpipe-gpt --check with 1 actor, and with 2 ranks sharing the GPU (MPI;
#       with --eval-every 2: the forward-only evaluation checked too), bf16, and
#       starpipe-llama (grouped-query attention) on 2 ranks,
#   (c) a larger GPT: step times and the TFLOP/s of the largest stage task,
#   (d) host memory per rank (buffers in device memory only), step time with the
#       policy's prefetch off and on, and a 2-rank NCCL run where there are 2 GPUs.
# Every phase has a banner and a time limit; the whole run stays under CHECK_BUDGET_S
# (470 s). Log: $OUT/gpu-check.log when OUT is set, else BUILD/check-logs/. Exit 0 only
# when every phase passed. See tests/gpu/README.md.
#   env: GPU_DEPS (.gpu-deps), CHECK_BUILD (build-gpu), CUDA_HOME, CHECK_BUDGET_S,
#        CHECK_GPT_ARGS (model of (c)), CHECK_CUDA_ARCH (90), CHECK_NO_GPU=1 (a dry run
#        of the script itself on a CPU machine: CUDA workers off, small model in (c))
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
deps=$(cd "${GPU_DEPS:-$root/.gpu-deps}" 2>/dev/null && pwd || echo "${GPU_DEPS:-$root/.gpu-deps}")
B=${CHECK_BUILD:-$root/build-gpu}
mkdir -p "$B"
B=$(cd "$B" && pwd)
logdir=${OUT:-$B/check-logs}
mkdir -p "$logdir"
log=$logdir/gpu-check.log
: >"$log"
exec > >(tee -a "$log") 2>&1
budget=${CHECK_BUDGET_S:-470}
deadline=$((SECONDS + budget))
nogpu=${CHECK_NO_GPU:-0}
ncuda=1
perf_default="--layers 4 --heads 16 --channels 1024 --context 256 --batch 8 --microbatches 4 --steps 6"
if [ "$nogpu" = 1 ]; then ncuda=0; perf_default="--steps 4"; fi
perf_args=${CHECK_GPT_ARGS:-$perf_default}
R=$B/deps-root   # the unpacked .debs
results=()
nfail=0

banner() { printf '\n======== %s ========\n' "$*"; }
note() { printf '%s\n' "$*"; }
record() { results+=("$(printf '%-8s %-34s %s' "$1" "$2" "$3")"); [ "$1" != FAIL ] || nfail=$((nfail + 1)); }

# run_phase NAME LIMIT_S LOGNAME CMD...: the command under `timeout`, its output shown
# and kept in LOGNAME.log; sets $prc (124/137: timed out).
run_phase() {
  local name=$1 limit=$2 lname=$3
  shift 3
  local left=$((deadline - SECONDS))
  if ((left < 10)); then
    banner "$name: skipped, the ${budget}s budget is spent"
    prc=124
    return 0
  fi
  ((limit <= left)) || limit=$left
  banner "$name (limit ${limit}s)"
  local t0=$SECONDS
  set +e
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$logdir/$lname.log"
  prc=${PIPESTATUS[0]}
  set -e
  ptime=$((SECONDS - t0))
  if ((prc == 124 || prc == 137)); then note "TIMEOUT after ${ptime}s: $name"; fi
}

# ---------------------------------------------------------------- 0. environment
banner "0. environment"
fatal() { note "FAIL: $*"; record FAIL "environment" "$*"; exit 1; }
[ "$(uname -m)" = x86_64 ] || fatal "this check ships x86_64 (amd64) packages; machine is $(uname -m)"
cuda=${CUDA_HOME:-}
if [ -z "$cuda" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then cuda=/usr/local/cuda
  elif command -v nvcc >/dev/null; then cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  fi
fi
[ -n "$cuda" ] && [ -x "$cuda/bin/nvcc" ] || fatal "no CUDA toolkit (nvcc): set CUDA_HOME"
for tool in cmake python3 cc timeout; do
  command -v $tool >/dev/null || fatal "$tool not found"
done
gen=()
if ! command -v make >/dev/null; then
  command -v ninja >/dev/null || fatal "neither make nor ninja found"
  gen=(-G Ninja)
fi
[ -d "$deps/debs" ] && [ -f "$deps/starpu/lib/libstarpu-1.3.so.9" ] ||
  fatal "$deps lacks debs/ or starpu/: run scripts/fetch-gpu-deps on a CPU machine first"
note "host: $(uname -n), $(nproc) cores, glibc $(ldd --version | head -1 | awk '{print $NF}')"
grep -h '^# glibc' "$deps/MANIFEST" 2>/dev/null || true
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader || true
else
  note "nvidia-smi not found (the driver's tools); going on"
fi
note "CUDA: $("$cuda/bin/nvcc" --version | tail -2 | head -1)  ($cuda)"
note "cmake: $(cmake --version | head -1); cc: $(cc --version | head -1)"
cudalib=""
for d in "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib"; do
  [ -d "$d" ] && cudalib=${cudalib:+$cudalib:}$d
done
# NCCL where the build finds it (next to the toolkit, NCCL_HOME, the system's libnccl-dev),
# else the nvidia-nccl wheel of the machine's Python (PyTorch's), which ships libnccl.so.2
# and nccl.h but no libnccl.so: named to CMake whole.
nccl_opt=()
ncclpy=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
ncclso=$(ls "$cuda"/lib*/libnccl.so* "$cuda"/targets/*/lib/libnccl.so* \
           ${NCCL_HOME:+"$NCCL_HOME"/lib*/libnccl.so*} /usr/lib/x86_64-linux-gnu/libnccl.so 2>/dev/null |
         head -1 || true)
if [ -n "$ncclso" ]; then
  note "NCCL: $ncclso"
  nccl_opt=(-DSTARPIPE_NCCL=ON)
elif [ -n "$ncclpy" ] && [ -f "$ncclpy/include/nccl.h" ] && [ -f "$ncclpy/lib/libnccl.so.2" ]; then
  note "NCCL: the Python wheel's, $ncclpy"
  nccl_opt=(-DSTARPIPE_NCCL=ON -DNCCL_INCLUDE_DIR="$ncclpy/include"
            -DNCCL_LIBRARY="$ncclpy/lib/libnccl.so.2")
  cudalib=${cudalib:+$cudalib:}$ncclpy/lib
else
  note "NOTICE: no NCCL (toolkit, NCCL_HOME, libnccl-dev or the nvidia-nccl wheel): building with -DSTARPIPE_NCCL=OFF"
  nccl_opt=(-DSTARPIPE_NCCL=OFF)
fi
record PASS "environment" ""

# ---------------------------------------------------------------- 1. packages
# .debs -> $R with dpkg-deb, or Python when dpkg is missing; pkg-config files point into
# $R; OpenMPI and PMIx are told where they now live (OPAL_PREFIX, PMIX_*DIR).
# Common libraries (libudev, libnuma, libgfortran, ...) are used only where the system
# lacks them, so the system's own copies keep serving everything else.
unpack() {
  set -euo pipefail
  rm -rf "$R" && mkdir -p "$R/main" "$R/common" "$R/fallback"
  local common=" libudev1 libuuid1 libnuma1 libatomic1 libquadmath0 libgfortran5 zlib1g " f p dest
  for f in "$deps"/debs/*.deb; do
    p=$(basename "$f"); p=${p%%_*}
    dest=$R/main
    [[ $common == *" $p "* ]] && dest=$R/common
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$dest"
    else
      python3 - "$dest" "$f" <<'EOF'
import io, sys, tarfile
dest, deb = sys.argv[1], sys.argv[2]
with open(deb, 'rb') as fh:
    assert fh.read(8) == b'!<arch>\n', deb + ': not a .deb'
    while True:
        head = fh.read(60)
        if len(head) < 60:
            break
        name, size = head[:16].decode().strip().rstrip('/'), int(head[48:58])
        data = fh.read(size)
        fh.read(size % 2)
        if name.startswith('data.tar'):
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                if hasattr(tarfile, 'fully_trusted_filter'):
                    t.extractall(dest, filter='fully_trusted')
                else:
                    t.extractall(dest)
EOF
    fi
  done
  local have
  have=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true) | awk '{print $1}')
  for f in "$R"/common/usr/lib/x86_64-linux-gnu/*.so.* "$R"/common/lib/x86_64-linux-gnu/*.so.*; do
    [ -e "$f" ] || continue
    p=$(basename "$f")
    [[ $p =~ \.so\.[0-9]+$ ]] || continue
    if grep -qxF "$p" <<<"$have"; then echo "system has $p"; else
      ln -sf "$f" "$R/fallback/$p"; echo "fallback $p"; fi
  done
  # a -dev package's lib*.so linking outside the tree (zlib1g-dev's libz.so -> /lib/...,
  # which another system may not have): link against the copy in common/
  for f in "$R"/main/usr/lib/x86_64-linux-gnu/lib*.so; do
    p=$(readlink "$f" || true)
    [[ $p == /* && $p != "$R"/* ]] || continue
    p=${p##*/}
    for d in "$R"/common/usr/lib/x86_64-linux-gnu "$R"/common/lib/x86_64-linux-gnu; do
      if [ -e "$d/$p" ]; then ln -sf "$d/$p" "$f"; echo "relinked $(basename "$f") -> $d/$p"; break; fi
    done
  done
  local u=$R/main/usr
  for t in mpicc mpicxx mpirun mpiexec; do ln -sf "$t.openmpi" "$u/bin/$t"; done
  find "$R/main" -name '*.pc' -print0 | xargs -0 sed -i -E \
    -e "s#^prefix=/usr\$#prefix=$u#" -e "s#(^|[=[:space:]]|-I|-L)/usr/#\\1$u/#g"
  echo "unpacked $(ls "$deps"/debs/*.deb | wc -l) packages into $R"
}
export -f unpack
export R deps
lib=$R/main/usr/lib/x86_64-linux-gnu
export PATH=$R/main/usr/bin:$cuda/bin:$PATH
export LD_LIBRARY_PATH=$deps/starpu/lib:$lib:$lib/openblas-pthread:$lib/pmix2/lib:$R/fallback:$cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$R/main/usr/share/pkgconfig
unset PKG_CONFIG_PATH
export OPAL_PREFIX=$R/main/usr OPAL_SYSCONFDIR=$R/main/etc/openmpi
# PMIx (Debian's prefix /usr/lib/x86_64-linux-gnu/pmix2) needs each folder named
export PMIX_PREFIX=$lib/pmix2 PMIX_LIBDIR=$lib/pmix2/lib PMIX_PKGLIBDIR=$lib/pmix2/lib/pmix \
       PMIX_DATADIR=$lib/pmix2/share PMIX_PKGDATADIR=$lib/pmix2/share/pmix
# one host: launch locally (no ssh), shared memory between ranks, no UCX/OFI probing.
# Open MPI 4 calls its shared-memory BTL vader and picks single copy with
# btl_vader_single_copy_mechanism; 5 renamed it sm (vader an alias, to be dropped) and
# moved single copy to the smsc framework (excluding its components: two copies). The
# version: the openmpi-bin .deb that phase 1 unpacks (after this block), else the
# ompi_info on PATH (mpirun --version says the same), else 4.
ompi_major=$({ ls "$deps"/debs 2>/dev/null | sed -n 's/^openmpi-bin_\([0-9][0-9]*\)\..*/Open MPI v\1./p'
               ompi_info --version 2>/dev/null | head -1
             } | sed -n 's/^Open MPI v\([0-9][0-9]*\)\..*/\1/p' | head -1 || true)
if [ "${ompi_major:-4}" -ge 5 ]; then
  export OMPI_MCA_btl=self,sm OMPI_MCA_smsc=^cma,knem,xpmem
else
  export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
fi
export OMPI_MCA_plm=isolated OMPI_MCA_pml=ob1 OMPI_MCA_rmaps_base_oversubscribe=1 \
       OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export STARPU_HOME=$B/starpu-home   # StarPU's bus calibration, done once
mkdir -p "$STARPU_HOME"

stamp=$(cd "$deps/debs" && ls -l ./*.deb | md5sum | cut -c1-16)
if [ -f "$R/.stamp" ] && [ "$(cat "$R/.stamp")" = "$stamp" ]; then
  banner "1. packages: reused $R"; record PASS "1. packages" "reused"
else
  run_phase "1. packages: unpack $(ls "$deps"/debs/*.deb | wc -l) .debs" 90 unpack bash -c unpack
  if ((prc == 0)); then echo "$stamp" >"$R/.stamp"; record PASS "1. packages" "${ptime}s"
  else record FAIL "1. packages" "rc $prc"; fi
fi
if ((nfail == 0)); then
  missing=$(for f in "$R"/main/usr/bin/orterun "$lib"/libmpi.so.40 "$lib"/libhwloc.so.15 \
              "$lib"/openblas-pthread/libopenblas.so.0 "$deps"/starpu/lib/libstarpu*.so.*; do
              ldd "$f" | grep "not found" | sed "s#^#$(basename "$f"): #"; done | sort -u || true)
  if [ -n "$missing" ]; then note "FAIL: libraries not found:"; note "$missing"
    record FAIL "1. packages" "missing libraries (see log)"; fi
  ompi_info --version 2>&1 | head -1 || true
fi

# ---------------------------------------------------------------- 2. configure and build
if ((nfail == 0)); then
  run_phase "2. configure (STARPIPE_CUDA=ON, StarPU $deps/starpu)" 120 configure \
    cmake -S "$root" -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DSTARPIPE_STARPU_PREFIX="$deps/starpu" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
      -DCMAKE_CUDA_ARCHITECTURES="${CHECK_CUDA_ARCH:-90}" -DPKG_CONFIG_EXECUTABLE="$R/main/usr/bin/pkgconf" \
      -DMPI_C_COMPILER="$R/main/usr/bin/mpicc" -DMPIEXEC_EXECUTABLE="$R/main/usr/bin/mpiexec" "${nccl_opt[@]}"
  if ((prc == 0)); then record PASS "2. configure" "${ptime}s"; else record FAIL "2. configure" "rc $prc"; fi
fi
if ((nfail == 0)); then
  run_phase "2. build" 240 build cmake --build "$B" -j "$(nproc)"
  if ((prc == 0)); then record PASS "2. build" "${ptime}s"; else record FAIL "2. build" "rc $prc"; fi
fi
built=0
if ((nfail == 0)); then
  built=1
  ldd "$B/apps/starpipe-gpt" | grep -E "libstarpu|libcudart|libcublas|libnccl|libmpi.so"
  ldd "$B/apps/starpipe-gpt" | grep -q "libstarpu-1.3.so.9 => $deps/starpu/lib/" ||
    record FAIL "2. build" "starpipe-gpt does not load the CUDA StarPU"
fi

# ---------------------------------------------------------------- 3. (a) CUDA kernels
# kernel_phase TEST TITLE LIMIT_S LOGNAME: build-gpu/tests/TEST, which must pass here (77, no
# device, is a failure on a GPU machine)
kernel_phase() {
  local bin=$B/tests/$1 name="3. (a) $2"
  if [ ! -x "$bin" ]; then
    banner "$name"
    note "NOTICE: no tests/$1 target in this tree (built with STARPIPE_CUDA): it did not run"
    record NOTICE "$name" "test binary missing"
    return 0
  fi
  run_phase "$name ($(basename "$1"))" "$3" "$4" "$bin"
  case $prc in
    0) record PASS "$name" "${ptime}s" ;;
    77) if [ "$nogpu" = 1 ]; then record SKIP "$name" "no GPU (CHECK_NO_GPU=1)"
        else record FAIL "$name" "skipped: the test saw no CUDA device"; fi ;;
    *) record FAIL "$name" "rc $prc" ;;
  esac
}
if ((built)); then
  # every entry of the CUDA table against the CPU table (tests/backend); then what the
  # table does not reach, the sgemm and attention rates and their bits run to run
  kernel_phase backend/test_backend_ops "CUDA table vs CPU table" 90 ops
  kernel_phase gpu/test_cuda_kernels "CUDA kernels: rates" 150 kernels
  r=$(sed -n 's/^sum of squares of \(.*\)$/\1/p' "$logdir/kernels.log" 2>/dev/null | head -1)
  [ -n "$r" ] && record PASS "3. (a) grad sum of squares" "$r (floor 1 TB/s)"
  # attention at T 2048, heads of 128 (its floors are the test's), and its blocks per SM
  for p in fp32 bf16; do
    r=$(sed -n "s/^attention B=1 T=2048 C=4096 NH=32 G=0 $p: \(.*\); bits.*/\1/p" \
      "$logdir/kernels.log" 2>/dev/null | head -1)
    [ -n "$r" ] && record PASS "3. (a) attention $p T=2048 hs=128" "$r"
  done
  r=$(sed -n 's/^occupancy flash_\(.*\): \([0-9]*\) blocks per SM.*/\1 \2/p' \
    "$logdir/kernels.log" 2>/dev/null | paste -sd, -)
  [ -n "$r" ] && record PASS "3. (a) attention blocks per SM" "$r"
fi

# ---------------------------------------------------------------- 4. (b) GPT --check
gpt=$B/apps/starpipe-gpt
# the apps read the GPL text every Debian machine ships; elsewhere: the tree's own text
data=()
if [ ! -r /usr/share/common-licenses/GPL-3 ]; then
  find "$root" -path "$root/build*" -prune -o \( -name '*.md' -o -name '*.c' \) -type f -print0 |
    sort -z | xargs -0 cat >"$B/corpus.txt"
  data=(--data "$B/corpus.txt")
  note "no /usr/share/common-licenses/GPL-3: the GPT runs read $B/corpus.txt ($(wc -c <"$B/corpus.txt") bytes)"
fi
on_gpu() {
  [ "$nogpu" = 1 ] || grep -Eq "starpipe-(gpt|llama): .*CUDA" "$logdir/$1.log" ||
    { note "FAIL: the run did not say it ran on CUDA"; return 1; }
}
if ((built)); then
  run_phase "4. (b) starpipe-gpt --check, 1 actor" 120 gpt-1 \
    env STARPU_NCUDA=$ncuda "$gpt" "${data[@]}" --steps 3 --check
  if ((prc == 0)) && on_gpu gpt-1; then record PASS "4. (b) GPT --check 1 actor" "${ptime}s"
  else record FAIL "4. (b) GPT --check 1 actor" "rc $prc"; fi
  run_phase "4. (b) starpipe-gpt --check, 2 ranks sharing the GPU (MPI)" 150 gpt-2 \
    mpirun -np 2 -x STARPU_NCUDA=$ncuda "$gpt" "${data[@]}" --actors 2 --steps 3 --check \
      --eval-every 2
  if ((prc == 0)) && on_gpu gpt-2; then record PASS "4. (b) GPT --check 2 ranks" "${ptime}s"
  else record FAIL "4. (b) GPT --check 2 ranks" "rc $prc"; fi
  # bf16: cublasGemmEx against the CPU's bf16 reference (within 2e-2), and with NCCL carrying
  # every boundary tensor from a stream of its own (a trace of the last step shows compute
  # continuing while a receive is posted: $OUT/gpt-bf16-trace.json)
  run_phase "4. (b) starpipe-gpt --precision bf16 --check" 120 gpt-bf16 \
    env STARPU_NCUDA=$ncuda STARPIPE_TRACE="${OUT:-$B}/gpt-bf16-trace.json" "$gpt" "${data[@]}" \
      --steps 3 --precision bf16 --check
  if ((prc == 0)) && on_gpu gpt-bf16; then record PASS "4. (b) GPT bf16 --check" "${ptime}s"
  else record FAIL "4. (b) GPT bf16 --check" "rc $prc"; fi
  # the Llama: rotary embeddings, SwiGLU and grouped-query attention (4 heads, 2 KV heads)
  run_phase "4. (b) starpipe-llama --kv-heads 2 --check, 2 ranks sharing the GPU" 120 llama \
    mpirun -np 2 -x STARPU_NCUDA=$ncuda "$B/apps/starpipe-llama" "${data[@]}" --kv-heads 2 \
      --actors 2 --steps 3 --check
  if ((prc == 0)) && on_gpu llama; then record PASS "4. (b) Llama --check 2 ranks" "${ptime}s"
  else record FAIL "4. (b) Llama --check 2 ranks" "rc $prc"; fi
fi

# ---------------------------------------------------------------- 4b. compute-sanitizer
# What the emulation hides: out-of-bounds and misaligned accesses, shared-memory races
# between warps, barriers not reached by every thread, reads of uninitialised device
# memory. The kernel tests at a small size under each tool, 45 s each at most.
san=$(command -v compute-sanitizer || ls "$cuda"/bin/compute-sanitizer "$cuda"/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)
if ((built)) && [ "$nogpu" != 1 ]; then
  if [ -z "$san" ]; then
    record NOTICE "4b. compute-sanitizer" "not found next to the toolkit"
  else
    for tool in memcheck racecheck synccheck initcheck; do
      run_phase "4b. compute-sanitizer --tool $tool, test_cuda_kernels --rate-size 256" 45 "san-$tool" \
        "$san" --tool "$tool" --error-exitcode 99 --print-limit 20 "$B/tests/gpu/test_cuda_kernels" --rate-size 256
      case $prc in
        0) record PASS "4b. sanitizer $tool" "${ptime}s" ;;
        124|137) record NOTICE "4b. sanitizer $tool" "not done in 45 s" ;;
        *) record FAIL "4b. sanitizer $tool" "rc $prc: $(grep -m1 -E '^========= (Invalid|Error|Race|Barrier|Uninit)' "$logdir/san-$tool.log" || true)" ;;
      esac
    done
  fi
fi

# ---------------------------------------------------------------- 5. (c) performance
if ((built)); then
  # shellcheck disable=SC2086
  run_phase "5. (c) step time and TFLOP/s: starpipe-gpt $perf_args" 150 perf \
    env STARPU_NCUDA=$ncuda STARPIPE_TRACE="$logdir/perf-trace.json" "$gpt" "${data[@]}" $perf_args
  if ((prc == 0)); then
    record PASS "5. (c) GPT steps" "$(grep -E '^done:' "$logdir/perf.log" | head -1)"
    # FLOPs of a stage task from the model shape (matmuls and attention; a 1-actor run
    # is one stage holding every layer), time from the trace of the last step.
    python3 - "$logdir/perf-trace.json" "$perf_args" <<'EOF' || record NOTICE "5. (c) TFLOP/s" "trace not readable"
import json, sys
args = sys.argv[2].split()
get = lambda k, d: int(args[args.index(k) + 1]) if k in args else d
L, C, T, Bt = get('--layers', 4), get('--channels', 64), get('--context', 64), get('--batch', 4)
V = 256
fwd = L * (24 * Bt * T * C * C + 4 * Bt * T * T * C) + 2 * Bt * T * C * V
ev = json.load(open(sys.argv[1]))
ev = ev['traceEvents'] if isinstance(ev, dict) else ev
tasks = [e for e in ev if e.get('ph') == 'X' and e.get('cat') in ('F', 'B', 'W', 'BW')]
# backward = 2x forward: B (input gradients) and W (weight gradients) 1x each
for cat, mult in (('F', 1), ('B', 1), ('W', 1), ('BW', 2)):
    ts = [e for e in tasks if e['cat'] == cat]
    if not ts:
        continue
    best = min(e['dur'] for e in ts) * 1e-6
    flops = mult * fwd
    print(f"{cat} task of the stage: {flops / 1e9:.1f} GFLOP (estimate), fastest "
          f"{best * 1e3:.2f} ms -> {flops / best / 1e12:.2f} TFLOP/s")
EOF
  else
    record FAIL "5. (c) GPT steps" "rc $prc"
  fi
  if [ -x "$B/bench/bench_gpu_stage" ]; then
    run_phase "5. (c) bench_gpu_stage" 90 bench "$B/bench/bench_gpu_stage"
    if ((prc == 0)); then record PASS "5. (c) bench_gpu_stage" "${ptime}s"
      # the gradient norm's sum of squares: its share of a microbatch's F + BW (issue 42)
      ssq=$(sed -n 's/^grad sumsq: //p' "$logdir/bench.log" | head -1)
      [ -n "$ssq" ] && record PASS "5. (c) grad sumsq, GPT-2 small" "${ssq%%;*}; ${ssq#*; }"
    elif ((prc == 77)) && [ "$nogpu" = 1 ]; then record SKIP "5. (c) bench_gpu_stage" "no GPU (CHECK_NO_GPU=1)"
    else record FAIL "5. (c) bench_gpu_stage" "rc $prc"; fi
    # Issue 11's goal: the largest stage task (BW) of a GPT block at 4096 channels, context
    # 2048 (32 heads of 128: the tensor-core attention's head size), >= 50% of the
    # achievable bf16 rate (H200: about 790 TFLOP/s; 989 is the dense peak on paper).
    # bf16 runs the matmuls on cublasGemmEx
    # and attention on the mma.sync kernels. args: layers channels heads context batch.
    # shellcheck disable=SC2086
    run_phase "5. (c) bench_gpu_stage, GPT block C=4096 T=2048" 120 bench-4096 \
      "$B/bench/bench_gpu_stage" ${CHECK_STAGE_ARGS:-1 4096 32 2048 1}
    if ((prc == 0)); then
      bw=$(awk -F'|' '$2 ~ /BW/ { gsub(/ /, "", $9); print $9 }' "$logdir/bench-4096.log")
      pct=$(awk -v t="${bw:-0}" 'BEGIN { printf "%.0f", 100 * t / 790 }')
      record PASS "5. (c) block C=4096 T=2048 BW bf16" "${bw:-?} TFLOP/s, ${pct}% of 790 (goal 50%)"
    elif ((prc == 77)) && [ "$nogpu" = 1 ]; then
      record SKIP "5. (c) bench_gpu_stage C=4096" "no GPU (CHECK_NO_GPU=1)"
    else
      record FAIL "5. (c) bench_gpu_stage C=4096" "rc $prc"
    fi
  else
    note "NOTICE: no bench/bench_gpu_stage yet (the largest stage task's F and BW timed on the"
    note "        GPU, with exact FLOP counts): the TFLOP/s above are estimates from the trace"
    record NOTICE "5. (c) bench_gpu_stage" "binary missing; TFLOP/s estimated"
  fi
  grep -hiE "tflop" "$logdir/kernels.log" 2>/dev/null | sed 's/^/sgemm: /' || true
fi

# ---------------------------------------------------------------- 6. (d) memory, prefetch, NCCL
# peak_rss CMD...: runs CMD; prints the largest resident set (VmHWM: pinned pages count)
# that each starpipe-gpt process reached, polled every 0.2 s
peak_rss() {
  "$@" &
  local pid=$! p v rc exe
  exe=$(readlink -f "$gpt")
  declare -A hwm=()
  while kill -0 "$pid" 2>/dev/null; do
    for p in $(pgrep -f "$gpt" || true); do
      [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$exe" ] || continue # not mpirun, not bash
      v=$(awk '/^VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || true)
      [ -n "$v" ] && ((v > ${hwm[$p]:-0})) && hwm[$p]=$v
    done
    sleep 0.2
  done
  wait "$pid" && rc=0 || rc=$?
  for p in "${!hwm[@]}"; do echo "host memory: process $p peaked at $((hwm[$p] / 1024)) MiB resident"; done
  return "$rc"
}
export -f peak_rss
export gpt
if ((built)); then
  # Buffers live in device memory only (runtime/buffers.c): each rank's host memory stays
  # near its inputs and code, far below its slabs (STARPIPE_VERBOSE prints them: the
  # trainer's own count of host bytes next to the device's). Two ranks share the GPU, so
  # the boundary tensors go through the host (StarPU's copies) and the policy's prefetch
  # has copies to overlap: the same run with STARPU_PREFETCH=0, alternated, twice each.
  # shellcheck disable=SC2086
  run_phase "6. (d) host memory per rank (2 ranks on the GPU, $perf_args)" 120 mem \
    bash -c 'peak_rss "$@"' _ mpirun -np 2 -x STARPU_NCUDA=$ncuda -x STARPIPE_VERBOSE=1 "$gpt" \
      "${data[@]}" $perf_args --actors 2
  if ((prc == 0)); then
    record PASS "6. (d) host memory per rank" "$(grep -h '^host memory' "$logdir/mem.log" | sed 's/.*peaked at //' | paste -sd/) peak RSS"
  else record FAIL "6. (d) host memory per rank" "rc $prc"; fi
  pf=()
  for k in 1 2; do
    for v in 0 1; do
      # shellcheck disable=SC2086
      run_phase "6. (d) prefetch STARPU_PREFETCH=$v (run $k)" 90 "prefetch-$v-$k" \
        mpirun -np 2 -x STARPU_NCUDA=$ncuda -x STARPU_PREFETCH=$v "$gpt" "${data[@]}" $perf_args --actors 2
      ((prc == 0)) || { record FAIL "6. (d) prefetch runs" "rc $prc (STARPU_PREFETCH=$v)"; break 2; }
      pf+=("$v=$(sed -n 's/^done:.*(\([0-9.]*\) ms per step).*/\1/p' "$logdir/prefetch-$v-$k.log")")
    done
  done
  ((${#pf[@]} == 4)) && record PASS "6. (d) prefetch off/on ms per step" "${pf[*]}"
  # mpirun binds each of 2 ranks to one core by default: the CPU worker and the CUDA
  # worker's polling driver thread then share it. The same run unbound, for comparison.
  # shellcheck disable=SC2086
  run_phase "6. (d) 2 ranks sharing the GPU, mpirun --bind-to none" 90 unbound \
    mpirun -np 2 --bind-to none -x STARPU_NCUDA=$ncuda "$gpt" "${data[@]}" $perf_args --actors 2
  if ((prc == 0)); then
    record PASS "6. (d) --bind-to none ms per step" "$(sed -n 's/^done:.*(\([0-9.]*\) ms per step).*/\1/p' "$logdir/unbound.log") (bound: ${pf[*]})"
  else record FAIL "6. (d) --bind-to none" "rc $prc"; fi
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if ((${ngpu:-0} >= 2)); then
    run_phase "6. (d) 2 ranks, a GPU each, NCCL carrying every boundary tensor" 120 nccl-2 \
      mpirun -np 2 -x STARPU_NCUDA=$ncuda -x STARPIPE_NCCL_THRESHOLD=1 "$gpt" "${data[@]}" \
        --actors 2 --steps 3 --check
    if ((prc == 0)) && on_gpu nccl-2 && grep -q "NCCL carries" "$logdir/nccl-2.log"; then
      record PASS "6. (d) 2-GPU NCCL --check" "${ptime}s"
    else record FAIL "6. (d) 2-GPU NCCL --check" "rc $prc (or NCCL did not carry the tensors)"; fi
    # tensor parallelism: one actor of 2 ranks, a GPU each, the group's NCCL on the task's stream
    run_phase "6. (d) --tensor 2 on 2 GPUs, --check" 120 tensor-2 \
      mpirun -np 2 -x STARPU_NCUDA=$ncuda "$gpt" "${data[@]}" --tensor 2 --steps 3 --check
    if ((prc == 0)) && on_gpu tensor-2; then record PASS "6. (d) --tensor 2 --check" "${ptime}s"
    else record FAIL "6. (d) --tensor 2 --check" "rc $prc"; fi
    # bf16 with NCCL carrying every boundary tensor between two GPUs
    run_phase "6. (d) bf16 on 2 GPUs, NCCL carrying every boundary tensor, --check" 120 nccl-bf16 \
      mpirun -np 2 -x STARPU_NCUDA=$ncuda -x STARPIPE_NCCL_THRESHOLD=1 "$gpt" "${data[@]}" \
        --actors 2 --steps 3 --precision bf16 --check
    if ((prc == 0)) && on_gpu nccl-bf16 && grep -q "NCCL carries" "$logdir/nccl-bf16.log"; then
      record PASS "6. (d) 2-GPU NCCL bf16 --check" "${ptime}s"
    else record FAIL "6. (d) 2-GPU NCCL bf16 --check" "rc $prc"; fi
  else
    record SKIP "6. (d) 2-GPU NCCL --check" "${ngpu:-0} GPU(s) on this machine"
  fi
  if ((${ngpu:-0} >= 4)); then
    # two communicators at once (comm/nccl_chain.h): the tensor groups' exchanges and the
    # pipeline's groups, every boundary tensor on NCCL, then the default threshold
    for th in 1 65536; do
      run_phase "6. (d) --tensor 2 --actors 2 on 4 GPUs, STARPIPE_NCCL_THRESHOLD=$th, --check" 150 \
        "tensor-actors-$th" mpirun -np 4 -x STARPU_NCUDA=$ncuda -x STARPIPE_NCCL_THRESHOLD=$th \
          "$gpt" "${data[@]}" --tensor 2 --actors 2 --steps 3 --check
      if ((prc == 0)) && on_gpu "tensor-actors-$th"; then
        record PASS "6. (d) T=2 x 2 actors, threshold $th" "${ptime}s"
      else record FAIL "6. (d) T=2 x 2 actors, threshold $th" "rc $prc"; fi
    done
  else
    record SKIP "6. (d) --tensor 2 --actors 2" "${ngpu:-0} GPU(s) on this machine (needs 4)"
  fi
fi

# ---------------------------------------------------------------- 7. step 1 under lazy loading
# CUDA 13 loads a module at its first launch, which can synchronise the context while
# step 1's communication waits for peers (issue 42 item 2). Step 1 of the schedules with
# the most interleaving, 2 ranks, explicitly LAZY, each under a timeout.
if ((built)); then
  for sch in 1f1b zb-h1 interleaved-1f1b dualpipe-v; do
    run_phase "7. CUDA_MODULE_LOADING=LAZY, step 1 of $sch, 2 ranks" 40 "lazy-$sch" \
      mpirun -np 2 -x STARPU_NCUDA=$ncuda -x CUDA_MODULE_LOADING=LAZY "$gpt" "${data[@]}" \
        --actors 2 --schedule "$sch" --steps 1
    if ((prc == 0)); then record PASS "7. LAZY step 1 $sch" "${ptime}s"
    else record FAIL "7. LAZY step 1 $sch" "rc $prc"; fi
  done
fi

# ---------------------------------------------------------------- 8. module loading's cost
# starpipe loads CUDA modules eagerly (codelets/cuda/device.c) unless the user chose: what
# that costs at start-up and in device memory, against LAZY, one run each.
if ((built)); then
  for ml in EAGER LAZY; do
    run_phase "8. CUDA_MODULE_LOADING=$ml: start-up and device memory" 60 "load-$ml" \
      env STARPU_NCUDA=$ncuda STARPIPE_VERBOSE=1 CUDA_MODULE_LOADING=$ml "$gpt" "${data[@]}" --steps 1
    if ((prc == 0)); then
      record PASS "8. $ml: run, device bytes after step 1" "${ptime}s, $(sed -n 's/.*: \([0-9]*\) bytes in use on device.*/\1/p' "$logdir/load-$ml.log" | head -1)"
    else record FAIL "8. $ml" "rc $prc"; fi
  done
fi
# CHECK_EXTRA: a command of the caller's, run last in this environment (mpirun, the relocated
# libraries; $gpt, $ncuda and $perf_args exported)
if ((built)) && [ -n "${CHECK_EXTRA:-}" ]; then
  export gpt ncuda perf_args
  run_phase "extra: $CHECK_EXTRA" 120 extra bash -c "$CHECK_EXTRA"
  record NOTICE "extra" "rc $prc (see extra.log)"
fi

# ---------------------------------------------------------------- summary
banner "summary ($((SECONDS))s of ${budget}s; log $log)"
printf '%s\n' "${results[@]}"
grep -hE "^step [0-9]+ " "$logdir/perf.log" 2>/dev/null | tail -3 || true
if ((nfail)); then note "GPU CHECK FAILED ($nfail)"; exit 1; fi
note "GPU CHECK PASSED"
