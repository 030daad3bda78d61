#!/usr/bin/env bash
# Negative controls of scripts/check-layers: it must fail, naming the culprit, on
#   1. an upward include (graph/ including the executor's header),
#   2. an upward call (an object of the kernels library calling the executor),
#   3. two files of one library that call each other,
#   4. a STARPIPE_* variable read outside base/env.c,
#   5. a header of the executor's private folder (runtime/exec/) included outside it,
#   6. two objects of one library with one name,
# and pass on the tree as it is (the layers test). Usage: negative.sh SRC BUILD
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check=(python3 "$src/scripts/check-layers")
fail() { echo "layers_negative: $*" >&2; exit 1; }
expect() { # expect NAME PATTERN -- check-layers args...
  local name=$1 pattern=$2 out rc=0
  shift 3
  out=$("${check[@]}" "$@" 2>&1) || rc=$?
  [ "$rc" -ne 0 ] || fail "$name: check-layers passed (exit 0):"$'\n'"$out"
  grep -qE "$pattern" <<<"$out" || fail "$name: the message does not name it:"$'\n'"$out"
  echo "layers_negative: $name refused: $(grep -E "$pattern" <<<"$out" | head -1)"
}

# a copy of the library's sources to spoil
mkdir "$tmp/src"
cp -r "$src"/{base,codelets,graph,sched,comm,runtime,formats,include,apps} "$tmp/src/"
sed -i '1i #include "starpipe/exec.h"' "$tmp/src/graph/graph.c"
expect "upward include" 'graph/graph\.c:1: includes "starpipe/exec\.h": graph \(layer 2\) may not depend on runtime' \
  -- --src "$tmp/src"
cp "$src/graph/graph.c" "$tmp/src/graph/graph.c"
printf 'static const char *peek(void) { return getenv("STARPIPE_VERBOSE"); }\n' >>"$tmp/src/sched/plan.c"
expect "a variable read outside base/env.c" 'sched/plan\.c:[0-9]+: reads a STARPIPE_\* variable' \
  -- --src "$tmp/src"
cp "$src/sched/plan.c" "$tmp/src/sched/plan.c"
sed -i '1i #include "runtime/exec/exec_int.h"' "$tmp/src/runtime/host.c"
expect "a private header" 'runtime/host\.c:1: includes "runtime/exec/exec_int\.h", private to runtime/exec/' \
  -- --src "$tmp/src"
cp "$src/runtime/host.c" "$tmp/src/runtime/host.c"
printf 'static int zap(void *p, size_t n) { return cudaMemset(p, 0, n); }\n' >>"$tmp/src/runtime/exec/buf.c"
expect "a device API in runtime/" 'runtime/exec/buf\.c:[0-9]+: names a device API' -- --src "$tmp/src"
cp "$src/runtime/exec/buf.c" "$tmp/src/runtime/exec/buf.c"

# the build's libraries (links), spoiled one at a time: spoil LIB OBJECTS... puts a copy of
# LIB with the objects added in its place, unspoil LIB the link back
mkdir "$tmp/build" "$tmp/orig"
while IFS= read -r a; do
  ln -s "$a" "$tmp/orig/$(basename "$a")"
  ln -s "$a" "$tmp/build/$(basename "$a")"
done < <("${check[@]}" --build "$build" --list)
[ -e "$tmp/build/libstarpipe_kernels.a" ] || fail "no libstarpipe_kernels.a under $build"
"${check[@]}" --src "$src" --build "$tmp/build" >/dev/null || fail "the unspoiled copy fails"
spoil() {
  local lib=$1
  shift
  rm "$tmp/build/$lib"
  cp "$(readlink -f "$tmp/orig/$lib")" "$tmp/build/$lib"
  ar rc "$tmp/build/$lib" "$@"
}
unspoil() { rm "$tmp/build/$1"; ln -s "$(readlink -f "$tmp/orig/$1")" "$tmp/build/$1"; }

cat >"$tmp/upcall.c" <<'C'
int sp_exec_rank(void);
int sp_kernel_upcall(void) { return sp_exec_rank(); } /* a kernel asking the executor */
C
cc -c "$tmp/upcall.c" -o "$tmp/upcall.o"
spoil libstarpipe_kernels.a "$tmp/upcall.o"
expect "upward call" 'starpipe_kernels: upcall\.o calls sp_exec_rank, defined by starpipe_runtime' \
  -- --src "$src" --build "$tmp/build"
unspoil libstarpipe_kernels.a

printf 'int sp_ping_b(void);\nint sp_ping_a(int n) { return n ? sp_ping_b() : 0; }\n' >"$tmp/a.c"
printf 'int sp_ping_a(int n);\nint sp_ping_b(void) { return sp_ping_a(0); }\n' >"$tmp/b.c"
cc -c "$tmp/a.c" -o "$tmp/ping_a.o"
cc -c "$tmp/b.c" -o "$tmp/ping_b.o"
spoil libstarpipe_graph.a "$tmp/ping_a.o" "$tmp/ping_b.o"
expect "files that call each other" 'starpipe_graph: files that call each other: ping_a\.o -> ping_b\.o -> ping_a\.o' \
  -- --src "$src" --build "$tmp/build"
unspoil libstarpipe_graph.a

# ar q appends where ar r would replace the member of the same name
first=$(ar t "$tmp/orig/libstarpipe_graph.a" | head -1)
mkdir "$tmp/dup"
cc -c "$tmp/a.c" -o "$tmp/dup/$first"
rm "$tmp/build/libstarpipe_graph.a"
cp "$(readlink -f "$tmp/orig/libstarpipe_graph.a")" "$tmp/build/libstarpipe_graph.a"
ar q "$tmp/build/libstarpipe_graph.a" "$tmp/dup/$first"
expect "two objects of one name" "starpipe_graph: two objects named ${first//./\\.}" \
  -- --src "$src" --build "$tmp/build"
echo "layers_negative: ok (7 spoiled trees refused)"
