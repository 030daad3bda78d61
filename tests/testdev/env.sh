# Sourced by the test device's tests (tests/testdev/README.md): the environment under which
# StarPU gives the CPU workers of a second NUMA node their own memory node, and
# STARPIPE_DEVICE=testdev makes them each rank's device. Two PUs, one per NUMA node
# (hwloc's synthetic topology, bound as this machine's PUs 0 and 1), and two CPU workers
# per rank, one on each: the rank's host worker and its device worker. The bus model of
# that topology goes under a host name of its own, so that it never replaces this
# machine's (StarPU would recalibrate, and say so, on the next ordinary run).
export STARPIPE_DEVICE=testdev
export STARPU_USE_NUMA=1
export HWLOC_SYNTHETIC="pack:2 [numa] core:1 pu:1"
export HWLOC_THISSYSTEM=1
export STARPU_NCPU=2
export STARPU_WORKERS_CPUID="0 1"
export STARPU_HOSTNAME=starpipe-testdev
# The rank's two workers take both PUs: StarPU-MPI's thread goes unbound, as it would on
# a rank without a core of its own.
export STARPU_MPI_NOBIND=1
