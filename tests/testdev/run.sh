#!/bin/sh
# run.sh SCRIPT [args...]: SCRIPT (a pipeline test of tests/runtime) on the test device.
. "$(dirname "$0")/env.sh"
exec "$@"
